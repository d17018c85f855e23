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
    p.add_argument("--checkpoint", default=None,
                   help="best.pt / checkpoint.pt of a run, or a pretrained tower folder (Hugging Face CLIP or SigLIP, "
                        "sentence-transformers CLIP, open_clip; or open_clip:MODEL:CHECKPOINT): its zero-shot "
                        "checkpoint is written into --out as zero_shot.pt (docs/guides/models.md); with --append, default: the "
                        "checkpoint that built --out")
    p.add_argument("--text-tower", help="with a tower folder as --checkpoint: a text tower that replaces its own (a "
                                        "multilingual sentence-transformers model trained into the same space)")
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--dataset", help="with --split, indexes a split with ground truth: a Karpathy JSON (or its folder), "
                                     "a CSV/TSV or parquet caption table, or webdataset shards (x.tar, a folder of "
                                     "them, dir/{0000..0099}.tar); docs/guides/datasets.md")
    p.add_argument("--columns", default="",
                   help="CSV/parquet: which column is what, e.g. image=filepath,caption=title,split=fold,metadata=a|b "
                        "(default: found by name; every other column becomes per-image metadata)")
    p.add_argument("--split", default="test", help="train | val | test (default test)")
    p.add_argument("--images-root", help="folder the dataset's image paths are relative to")
    p.add_argument("--images-dir", help="corpus: a folder of images (no ground truth)")
    p.add_argument("--captions-file", help="corpus: a text file, one caption per line (no ground truth)")
    p.add_argument("--factory", default=None,
                   help="FAISS factory string: Flat (exact, default), HNSW32, IVF1024,PQ32 …; auto: the fastest index "
                        "that meets --recall (default 0.99) within --max-memory and --max-query-ms, measured on held-out "
                        "corpus queries (indexer/tune.py); fixed: exact up to 200,000 vectors, IVF-PQ re-ranked above")
    p.add_argument("--recall", type=float, default=None,
                   help="--factory auto's target: recall@10 against exact search (default 0.99); implies --factory auto")
    p.add_argument("--max-memory", default=None,
                   help="--factory auto: resident memory per index side, e.g. 1GB or 512MiB (re-ranking's memory-mapped "
                        "exact vectors are page cache, not counted); implies --factory auto")
    p.add_argument("--max-query-ms", type=float, default=None,
                   help="--factory auto: time per query in a batch of 1,000 held-out queries; implies --factory auto")
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
    p.add_argument("--append", action="store_true", help="corpus: add the items to an existing index directory "
                   "(a living index: through its item store, as `ltd items add` does)")
    p.add_argument("--compact", action="store_true",
                   help="write the living index in --out as its next generation: items removed since are dropped "
                        "for good, items added join the base (no --checkpoint needed)")
    add_shard_args(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing index directory")
    p.add_argument("--device", default="cpu", help="torch device the model embeds on (default: cpu)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_index)

    q = sub.add_parser("eval", parents=[common], help="R@k, R-precision and nDCG of an index → report.json + report.md")
    q.add_argument("--index", required=True, help="index directory")
    q.add_argument("--relevance", default="rougeL",
                   help="nDCG relevance: rougeL (computed and cached), a TERN-format float32 file, or none")
    q.add_argument("--cxc", action="store_true", help="extra positives from CxC (COCO 5k test)")
    q.add_argument("--eccv", action="store_true",
                   help="positives from ECCV Caption (COCO 5k test; its 1,261 image and 1,332 caption queries only)")
    q.add_argument("--protocol", action="append", default=[], choices=("coco1k", "eccv", "pmrp"),
                   help="also report another protocol (repeatable): coco1k (mean over 5 folds of 1,000 images), eccv "
                        "(ECCV Caption mAP@R, R-P, R@1 on its queries), pmrp (Plausible Match R-Precision; needs --pm)")
    q.add_argument("--pm", metavar="DIR", help="--protocol pmrp: folder with pm_image_to_caption.json and "
                                              "pm_caption_to_image.json (eccv-caption's Plausible Match download)")
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


def add_shard_args(p: argparse.ArgumentParser) -> None:
    """`ltd index --index-shards N --shard-by id|list` (indexer/shards_index.py)."""
    p.add_argument("--index-shards", type=int, default=0, metavar="N",
                   help="split the index into N shards, each an index directory of its own under --out, for "
                        "`ltd serve --engine ray` (docs/guides/cluster.md); default: one index")
    p.add_argument("--shard-by", choices=("id", "list"), default="id",
                   help="with --index-shards: id (rows dealt round-robin; a query visits every shard) or list (IVF "
                        "factories: whole inverted lists per shard; a query visits only the shards it probes)")


def index_factory(args: argparse.Namespace) -> str:
    """The factory string ``--factory`` and the tuning targets ask for (``auto:…`` carries the targets)."""
    tuned = any(getattr(args, a, None) is not None for a in ("recall", "max_memory", "max_query_ms"))
    if not tuned:
        return args.factory or "Flat"
    if args.factory not in (None, "auto") and not str(args.factory).startswith("auto:"):
        raise UserValueError(f"--recall/--max-memory/--max-query-ms tune the index (--factory auto); "
                             f"they cannot be combined with --factory {args.factory}")
    from indexer.tune import auto_factory

    return auto_factory(args.recall, args.max_memory, args.max_query_ms)


def check_index_args(args: argparse.Namespace) -> str:
    """Every input of `ltd index`, checked before anything heavy is imported or loaded; the mode:
    ``append``, ``corpus`` or ``dataset``."""
    from indexer.index import check_target, read_manifest

    args.factory = index_factory(args)
    corpus = args.images_dir or args.captions_file
    if args.dataset and corpus:
        raise UserValueError("give either --dataset (a split with ground truth) or --images-dir/--captions-file (a corpus)")
    if not args.dataset and not corpus:
        raise UserValueError("nothing to index: give --dataset (and --split) or --images-dir/--captions-file")
    from training.models.towers import is_tower_folder

    if not Path(args.checkpoint).exists() and not args.checkpoint.startswith("open_clip:"):
        raise UserFileNotFound(f"--checkpoint: file not found: {args.checkpoint}")
    if not (Path(args.checkpoint).is_file() or is_tower_folder(args.checkpoint)):
        raise UserFileNotFound(f"--checkpoint: not a checkpoint file nor a tower folder (CLIP, SigLIP, "
                               f"sentence-transformers CLIP, open_clip; docs/guides/models.md): {args.checkpoint}")
    if args.text_tower and Path(args.checkpoint).is_file():
        raise UserValueError("--text-tower pairs a text tower with a tower folder given as --checkpoint")
    if args.append:
        if not corpus:
            raise UserValueError("--append adds a corpus (--images-dir/--captions-file) to an existing index")
        if "sharding" in read_manifest(args.out):  # must already be an index, not a sharded one
            raise UserValueError(f"{args.out} is sharded: rebuild it with --overwrite --index-shards N to add items")
    else:
        check_target(Path(args.out), args.overwrite)
    if corpus:
        check_corpus_inputs(args.images_dir, args.captions_file)
        return "append" if args.append else "corpus"
    from training.data.formats import dataset_format
    from training.data.shards import shard_files

    if dataset_format(args.dataset) == "shards":
        shard_files(args.dataset)  # every shard must be there
    elif not Path(args.dataset).exists():
        raise UserFileNotFound(f"--dataset: not found: {args.dataset}")
    return "dataset"


def cmd_index(args: argparse.Namespace) -> int:
    if args.compact:
        return _compact(args.out)
    if not args.checkpoint and args.append and (Path(args.out) / "manifest.json").is_file():
        from indexer.index import read_manifest, resolve_checkpoint

        args.checkpoint = str(resolve_checkpoint(args.out, read_manifest(args.out)))  # the one that built it
    if not args.checkpoint:
        raise UserValueError("--checkpoint is required (a checkpoint of `ltd train`, or a tower folder)")
    mode = check_index_args(args)
    if args.index_shards and not 2 <= args.index_shards <= 256:
        raise UserValueError(f"--index-shards must be in 2..256, got {args.index_shards}")
    if args.index_shards and mode == "append":
        raise UserValueError("--index-shards splits a new index; it cannot be combined with --append")
    if args.shard_by == "list" and args.index_shards and (args.factory or "Flat").split(",")[0][:3] not in ("IVF", "fix"):
        raise UserValueError("--shard-by list needs an IVF index: give --factory IVF…,PQ… (or use --shard-by id)")
    log.info("loading the model from %s …", args.checkpoint)
    from indexer.build import (
        EmbedEngine,
        IndexRequest,
        append_corpus,
        build_corpus_index,
        build_dataset_index,
        ensure_zero_shot,
    )

    if not Path(args.checkpoint).is_file():  # a tower folder: zero-shot, no `ltd train`
        args.checkpoint = str(ensure_zero_shot(args.checkpoint, args.out, args.text_tower))

    ray = None
    if args.engine == "ray":
        if mode == "append":
            raise UserValueError("--append runs on the local engine only (drop --engine ray)")
        from indexer.ray_engine import RayOptions

        out = Path(args.out)
        ray = RayOptions(address=args.address, workers=args.workers, shard_size=args.shard_size,
                         shard_dir=Path(args.shards) if args.shards else out.with_name(out.name + ".shards"))
    from indexer.items import has_store

    if mode == "append" and has_store(args.out):  # a living index: through its item store
        from indexer.ingest import append_living

        print(json.dumps(append_living(args.out, args.checkpoint, images_dir=args.images_dir,
                                       captions_file=args.captions_file)))
        return 0
    request = IndexRequest(args.out, overwrite=args.overwrite,
                           engine=EmbedEngine(factory=args.factory, runtime=args.runtime, ray=ray))
    if mode == "append":
        ix = append_corpus(args.out, args.checkpoint, images_dir=args.images_dir, captions_file=args.captions_file,
                           runtime=args.runtime)
    elif mode == "corpus":
        ix = build_corpus_index(args.checkpoint, request, images_dir=args.images_dir, captions_file=args.captions_file)
    else:
        ix = build_dataset_index(args.checkpoint, args.dataset, args.split, request, images_root=args.images_root,
                                 shortcuts=args.shortcuts, columns=args.columns)
    if args.index_shards:  # the new generation, split: the unsharded one is replaced (indexer/shards_index.py)
        from indexer.shards_index import describe, shard_index_dir

        shard_index_dir(ix.path, args.index_shards, args.shard_by)
        print(describe(ix.path))
        return 0
    m = ix.manifest
    print(json.dumps({"index": str(ix.path), "images": m["counts"]["images"], "captions": m["counts"]["captions"],
                      "skipped": len(m.get("skipped", [])), "factory": m["factory"]}))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from indexer.compact import live_view
    from indexer.evaluate import EvalOptions, evaluate_index, render_markdown, write_report
    from indexer.index import load_index_dir, read_manifest

    if "sharding" in read_manifest(args.index):  # a sharded index, searched through its shards in this process
        from search.sharded import load_sharded

        ix = live_view(load_sharded(args.index))
    else:
        ix = live_view(load_index_dir(args.index))  # a living index: its items as served, removed ones gone
    rel = None if args.relevance.lower() == "none" else args.relevance
    report = evaluate_index(ix, EvalOptions(relevance=rel, cxc=args.cxc, eccv=args.eccv, ndcg_k=args.ndcg_k,
                                            protocols=tuple(dict.fromkeys(args.protocol)), pm_dir=args.pm))
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


def _compact(out: str) -> int:
    from indexer.compact import compact

    ix = compact(out)
    if ix is None:
        print(f"{out}: nothing to compact (no item store, or no write since the last generation)")
    else:
        print(f"{out}: generation {ix.generation}: {ix.images.index.ntotal} images, {ix.captions.index.ntotal} captions")
    return 0
