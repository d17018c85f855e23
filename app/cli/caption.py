"""`ltd caption train|eval|generate`: the captioner guided by self-retrieval (Liu et al., ECCV 2018).

Inputs are checked before any model loads: config keys and files, checkpoint files, the split, the
image folder, the beam width.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from app.cli.launch_args import add_arguments, worker_args
from app.cli.serve import parse_captioners
from app.cli.train import print_presets
from indexer.corpus import check_corpus_inputs, image_files
from training.errors import UserFileNotFound, UserValueError

log = logging.getLogger("ltd.caption")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("caption", parents=[common], help="train, evaluate and run an image captioner with a self-retrieval reward")
    cs = p.add_subparsers(dest="caption_command", required=True, metavar="ACTION")

    t = cs.add_parser("train", parents=[common], help="XE (scheduled sampling) then SCST (CIDEr-D + alpha · retrieval reward)")
    t.add_argument("--config", help="YAML file or caption preset (see --list-presets); default caption_synthetic_xe")
    t.add_argument("--retrieval", help="frozen retrieval checkpoint (the self-retrieval judge)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (repeatable)")
    t.add_argument("--out", help="run folder (default runs/<train.name or config name>)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    t.add_argument("--list-presets", action="store_true", help="print the shipped caption presets and exit")
    t.add_argument("--no-progress", action="store_true")
    add_arguments(t)
    t.set_defaults(func=cmd_caption_train)

    e = cs.add_parser("eval", parents=[common], help="BLEU, METEOR, ROUGE-L, CIDEr-D, self-retrieval R@k, unique/novel shares")
    e.add_argument("--checkpoint", required=True, help="a caption run's best.pt / checkpoint.pt")
    e.add_argument("--dataset", help="Karpathy JSON or its folder (default: the one the captioner was trained on)")
    e.add_argument("--split", default="test")
    e.add_argument("--retrieval", help="retrieval checkpoint for self-retrieval R@k")
    e.add_argument("--judge", action="append", default=[], metavar="NAME=CHECKPOINT",
                   help="score the same captions under a further retrieval checkpoint too (repeatable), e.g. an "
                        "independent judge beside the one the captioner was trained with")
    e.add_argument("--beam", type=int, default=5)
    e.add_argument("--out", help="report folder (default: the checkpoint's folder / eval_<split>)")
    e.add_argument("--max-images", type=int, default=0, help="only the first N images of the split (0 = all)")
    e.add_argument("--no-meteor", action="store_true", help="skip METEOR (it needs Java)")
    e.add_argument("--allow-unk", action="store_true",
                   help="let the decoder emit <unk> (suppressed by default; for analysis of what it would say)")
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=cmd_caption_eval)

    g = cs.add_parser("generate", parents=[common], help="captions as JSON lines for a folder of images or a dataset split")
    g.add_argument("--checkpoint", required=True)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="a folder of images (not recursive)")
    src.add_argument("--dataset", nargs="?", const="",
                     help="Karpathy JSON or its folder, with --split (no value: the dataset the captioner was trained on)")
    g.add_argument("--split", default="test")
    g.add_argument("--beam", type=int, default=5)
    g.add_argument("--max-images", type=int, default=0)
    g.add_argument("--out", help="JSON-lines file (default: stdout)")
    g.add_argument("--allow-unk", action="store_true",
                   help="let the decoder emit <unk> (suppressed by default; for analysis of what it would say)")
    g.add_argument("--no-progress", action="store_true")
    g.set_defaults(func=cmd_caption_generate)


def _require_file(path: str | None, what: str) -> None:
    if path and not Path(path).is_file():
        raise UserFileNotFound(f"{what} not found: {path}")


def _check_beam(beam: int) -> None:
    if not 1 <= beam <= 50:
        raise UserValueError(f"--beam must be between 1 and 50, got {beam}")


def cmd_caption_train(args: argparse.Namespace) -> int:
    from training.captioning.config import load_caption_config
    if args.list_presets:
        print_presets("caption")
        return 0
    _require_file(args.retrieval, "retrieval checkpoint")
    sets = list(args.set) + ([f"train.retrieval={args.retrieval}"] if args.retrieval else [])
    config = args.config or "caption_synthetic_xe"
    cfg = load_caption_config(config, sets)
    name = cfg.train.name or Path(config).stem
    out = Path(args.out) if args.out else Path("runs") / name
    from app.launch import data_parallel_command
    from training.captioning.loop import train_captioner
    from training.device import using_device

    worker = worker_args(args, ["caption", "train"], out, ["--retrieval", args.retrieval] if args.retrieval else [])
    with using_device(cfg.train.device):  # what the launcher checks and the process group's backend
        code, res = data_parallel_command(args, worker, lambda: train_captioner(cfg, out, resume=args.resume))
    if res is not None:
        print(json.dumps({"run_dir": str(res.run_dir), "best_val_cider": round(res.best_cider, 2),
                          "best_epoch": res.best_epoch, "seconds": round(res.seconds, 1),
                          "best_checkpoint": str(res.run_dir / "best.pt")}))
    return code


def cmd_caption_eval(args: argparse.Namespace) -> int:
    _require_file(args.checkpoint, "caption checkpoint")
    _require_file(args.retrieval, "retrieval checkpoint")
    _check_beam(args.beam)
    if args.max_images < 0:
        raise UserValueError("--max-images must be >= 0")
    from indexer.caption_eval import CaptionEvalOptions, evaluate_captioner, write_caption_report

    judges = parse_captioners(args.judge, "--judge")

    options = CaptionEvalOptions(retrieval=args.retrieval, beam=args.beam, meteor=False if args.no_meteor else None,
                                 max_images=args.max_images, judges=judges, allow_unk=args.allow_unk)
    report, captions = evaluate_captioner(args.checkpoint, dataset=args.dataset, split=args.split, options=options)
    out = Path(args.out) if args.out else Path(args.checkpoint).parent / f"eval_{args.split}"
    jp, mp = write_caption_report(out, report, captions)
    print(mp.read_text())
    print(json.dumps({"report": str(jp), "markdown": str(mp)}))
    return 0


def _image_files(folder: str) -> list[Path]:
    """The images of a folder (and its subfolders), as `ltd index --images-dir` takes them."""
    check_corpus_inputs(folder, None, images_flag="--images")
    return image_files(Path(folder))


def _folder_rows(model, vocab, ccfg, files: list[Path], beam: int, allow_unk: bool = False):
    """Captions for image files: grid features through the frozen backbone, no cache (a user's folder)."""
    import torch
    from tqdm.auto import tqdm

    from training.captioning.inference import decode_regions
    from training.data.images import ImageError, load_image
    from training.models.backbones import EfficientNetLite0, grid_regions
    from training.progress import progress_enabled

    backbone = EfficientNetLite0("grid", image_size=ccfg.data.image_size)
    for i in tqdm(range(0, len(files), 16), desc="captions", unit="batch", disable=not progress_enabled()):
        ok, imgs = [], []
        for f in files[i : i + 16]:
            try:
                imgs.append(backbone.preprocess(load_image(f), 1).reshape(3, backbone.preprocess.size, -1))
                ok.append(f)
            except ImageError as e:
                yield {"file": f.name, "error": str(e)}
        if imgs:
            ids = decode_regions(model, grid_regions(backbone.extract(torch.stack(imgs))), vocab, beam=beam,
                                 allow_unk=allow_unk)
            for f, c in zip(ok, vocab.decode_batch(ids)):
                yield {"file": f.name, "caption": c}


def _split_rows(model, vocab, ccfg, ckpt, args):
    import numpy as np

    from indexer.caption_eval import dataset_of
    from training.captioning.data import grid_store, regions
    from training.captioning.inference import CaptionDecoding, caption_rows

    ds = dataset_of(ckpt, args.dataset)
    sp = ds.split(args.split)
    store = grid_store(ds, ccfg.data.image_size, ccfg.data.cache_dir)
    images = [im for im in sp.images if im.index not in store.failed][: args.max_images or None]
    rows = np.array([im.index for im in images], dtype=np.int64)
    decoding = CaptionDecoding(beam=args.beam, allow_unk=args.allow_unk)
    caps = caption_rows(model, vocab, rows, lambda r: regions(store, r), decoding=decoding)
    for im, c in zip(images, caps):
        yield {"image_id": im.id, "filename": im.filename, "caption": c}


def cmd_caption_generate(args: argparse.Namespace) -> int:
    _require_file(args.checkpoint, "caption checkpoint")
    _check_beam(args.beam)
    files = _image_files(args.images)[: args.max_images or None] if args.images else None
    from training.captioning.checkpoint import captioner_from_checkpoint, load_caption_checkpoint

    ckpt = load_caption_checkpoint(args.checkpoint)
    model, vocab, ccfg = captioner_from_checkpoint(ckpt)
    rows = (_folder_rows(model, vocab, ccfg, files, args.beam, args.allow_unk)
 if files is not None
            else _split_rows(model, vocab, ccfg, ckpt, args))
    lines = [json.dumps(r) for r in rows]
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        tmp.write_text("".join(ln + "\n" for ln in lines))
        tmp.replace(out)
        log.info("wrote %d captions to %s", len(lines), out)
    else:
        print("\n".join(lines))
    return 0
