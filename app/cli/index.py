"""`ltd index`, `ltd eval`, `ltd probe` (`ltd compare` is app/cli/compare.py)."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from indexer.corpus import check_corpus_inputs
from training.errors import UserFileNotFound, UserValueError

log = logging.getLogger("ltd.index")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("index", parents=[common], help="embed a dataset split or a corpus into FAISS indexes")
    p.add_argument("--checkpoint", required=True,
                   help="best.pt / checkpoint.pt of a run, or a CLIP folder in the Hugging Face layout: its zero-shot "
                        "checkpoint is written into --out as zero_shot.pt (README, 'Fine-tuning CLIP')")
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--dataset", help="Karpathy JSON (or its folder) — with --split, indexes a split with ground truth")
    p.add_argument("--split", default="test", help="train | val | test (default test)")
    p.add_argument("--images-root", help="folder the dataset's image paths are relative to")
    p.add_argument("--images-dir", help="corpus: a folder of images (no ground truth)")
    p.add_argument("--captions-file", help="corpus: a text file, one caption per line (no ground truth)")
    p.add_argument("--factory", default="Flat",
                   help="FAISS factory string: Flat (exact, default), HNSW32, IVF1024,PQ32 …, or auto: exact up to "
                        "200,000 vectors, IVF-PQ re-ranked on the exact vectors above (indexer/ann.py)")
    p.add_argument("--runtime", default=None, choices=("auto", "torch", "compile", "onnxruntime", "openvino"),
                   help="image encoder runtime (default LTD_IMAGE_RUNTIME or auto: OpenVINO, then ONNX Runtime when "
                        "installed, extra [fast]; else torch)")
    p.add_argument("--shortcuts", default="none", help="evaluate with SVL shortcuts: none | unique | bits:N …")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: embed in this process; ray: an actor pool on a Ray cluster (extra [ray]); a killed "
                        "Ray run resumes from its finished shards")
    p.add_argument("--address", help="--engine ray: an existing cluster (HOST:PORT or 'auto'); default: start a local one")
    p.add_argument("--workers", type=int, default=1, help="--engine ray: actors, one model each (default 1)")
    p.add_argument("--shard-size", type=int, default=1024,
                   help="--engine ray: images per shard (default 1024; caption shards hold 16× as many)")
    p.add_argument("--shards", help="--engine ray: folder for the embedding shards (default OUT.shards)")
    p.add_argument("--append", action="store_true", help="corpus: add the items to an existing index directory")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index directory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_index)

    q = sub.add_parser("eval", parents=[common], help="R@k, R-precision and nDCG of an index → report.json + report.md")
    q.add_argument("--index", required=True, help="index directory")
    q.add_argument("--relevance", default="rougeL",
                   help="nDCG relevance: rougeL (computed and cached), a TERN-format float32 file, or none")
    q.add_argument("--cxc", action="store_true", help="extra positives from CxC (COCO 5k test)")
    q.add_argument("--eccv", action="store_true",
                   help="positives from ECCV Caption (COCO 5k test; its 1,261 image and 1,332 caption queries only)")
    q.add_argument("--ndcg-k", type=int, default=25)
    q.add_argument("--no-progress", action="store_true")
    q.set_defaults(func=cmd_eval)

    r = sub.add_parser("probe", parents=[common],
                       help="how much of each caption's sentence embedding a model's caption and image embeddings hold "
                            "(linear probes: fitted on one split's index, scored on another's)")
    r.add_argument("--fit", help="index directory of the split the probes are fitted on (e.g. val)")
    r.add_argument("--eval", help="index directory of the split they are scored on (e.g. test)")
    r.add_argument("--grid", help="instead: an `ltd experiment` output folder; probes every run (fitted on its val "
                                  "index, scored on its test index) and prints mean ± std per cell")
    r.add_argument("--target-model", default="", help="sentence encoder of the targets (default all-MiniLM-L6-v2)")
    r.set_defaults(func=cmd_probe)


def check_index_args(args: argparse.Namespace) -> str:
    """Every input of `ltd index`, checked before anything heavy is imported or loaded; the mode:
    ``append``, ``corpus`` or ``dataset``."""
    from indexer.index import check_target, read_manifest

    corpus = args.images_dir or args.captions_file
    if args.dataset and corpus:
        raise UserValueError("give either --dataset (a split with ground truth) or --images-dir/--captions-file (a corpus)")
    if not args.dataset and not corpus:
        raise UserValueError("nothing to index: give --dataset (and --split) or --images-dir/--captions-file")
    from training.models.clip_files import is_clip_folder

    if not Path(args.checkpoint).exists():
        raise UserFileNotFound(f"--checkpoint: file not found: {args.checkpoint}")
    if not (Path(args.checkpoint).is_file() or is_clip_folder(args.checkpoint)):
        raise UserFileNotFound(f"--checkpoint: not a checkpoint file nor a CLIP folder (config.json with model_type "
                               f"'clip'): {args.checkpoint}")
    if args.append:
        if not corpus:
            raise UserValueError("--append adds a corpus (--images-dir/--captions-file) to an existing index")
        read_manifest(args.out)  # must already be an index
    else:
        check_target(Path(args.out), args.overwrite)
    if corpus:
        check_corpus_inputs(args.images_dir, args.captions_file)
        return "append" if args.append else "corpus"
    if not Path(args.dataset).exists():
        raise UserFileNotFound(f"--dataset: not found: {args.dataset}")
    return "dataset"


def cmd_index(args: argparse.Namespace) -> int:
    mode = check_index_args(args)
    log.info("loading the model from %s …", args.checkpoint)
    from indexer.build import append_corpus, build_corpus_index, build_dataset_index, ensure_zero_shot

    if Path(args.checkpoint).is_dir():  # a CLIP folder: zero-shot, no `ltd train`
        args.checkpoint = str(ensure_zero_shot(args.checkpoint, args.out))

    progress = not args.no_progress
    ray = None
    if args.engine == "ray":
        if mode == "append":
            raise UserValueError("--append runs on the local engine only (drop --engine ray)")
        from indexer.ray_engine import RayOptions

        out = Path(args.out)
        ray = RayOptions(address=args.address, workers=args.workers, shard_size=args.shard_size,
                         shard_dir=Path(args.shards) if args.shards else out.with_name(out.name + ".shards"))
    if mode == "append":
        ix = append_corpus(args.out, args.checkpoint, images_dir=args.images_dir, captions_file=args.captions_file,
                           show_progress=progress, device=args.device, runtime=args.runtime)
    elif mode == "corpus":
        ix = build_corpus_index(args.checkpoint, args.out, images_dir=args.images_dir, captions_file=args.captions_file,
                                factory=args.factory, overwrite=args.overwrite, show_progress=progress, device=args.device,
                                runtime=args.runtime, ray=ray)
    else:
        ix = build_dataset_index(args.checkpoint, args.dataset, args.split, args.out, factory=args.factory,
                                 images_root=args.images_root, shortcuts=args.shortcuts, overwrite=args.overwrite,
                                 show_progress=progress, device=args.device, runtime=args.runtime, ray=ray)
    m = ix.manifest
    print(json.dumps({"index": str(ix.path), "images": m["counts"]["images"], "captions": m["counts"]["captions"],
                      "skipped": len(m.get("skipped", [])), "factory": m["factory"]}))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from indexer.evaluate import evaluate_index, render_markdown, write_report
    from indexer.index import load_index_dir

    ix = load_index_dir(args.index)
    rel = None if args.relevance.lower() == "none" else args.relevance
    report = evaluate_index(ix, relevance=rel, cxc=args.cxc, eccv=args.eccv, ndcg_k=args.ndcg_k, show_progress=not args.no_progress)
    jp, mp = write_report(ix, report)
    print(render_markdown(report))
    print(f"wrote {jp} and {mp}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from indexer.probe import grid_markdown, probe_grid, probe_indexes

    if args.grid:
        if args.fit or args.eval:
            raise UserValueError("give either --grid or --fit and --eval")
        print(grid_markdown(probe_grid(args.grid, target_model=args.target_model)))
        return 0
    if not (args.fit and args.eval):
        raise UserValueError("--fit and --eval are both needed (or --grid)")
    print(json.dumps(probe_indexes(args.fit, args.eval, target_model=args.target_model), indent=1))
    return 0
