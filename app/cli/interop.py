"""`ltd export` and `ltd import`: an index's embeddings and metadata in clip-retrieval's layout, and back."""
from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("export", parents=[common],
                       help="an index's embeddings and metadata in clip-retrieval's layout (img_emb/, text_emb/, "
                            "metadata/ parquet), for autofaiss or clip-back")
    p.add_argument("--index", required=True, help="index directory")
    p.add_argument("--out", required=True, help="folder to write (must not exist)")
    p.add_argument("--side", default="auto", choices=("auto", "pairs", "images", "captions"),
                   help="pairs: one row per (image, caption), as clip-retrieval writes; images / captions: one side "
                        "(auto: pairs when every caption has an image and every image a caption)")
    p.add_argument("--float16", action="store_true", help="float16 embeddings, as clip-retrieval writes (default float32)")
    p.add_argument("--rows-per-part", type=int, default=1_000_000, help="rows per part file (default 1,000,000)")
    p.set_defaults(func=cmd_export)

    q = sub.add_parser("import", parents=[common], help="an index directory from clip-retrieval's layout")
    q.add_argument("--clip-retrieval", required=True, metavar="DIR", help="folder with img_emb/, text_emb/, metadata/")
    q.add_argument("--checkpoint", required=True,
                   help="the model that made the embeddings: a run's checkpoint or a tower folder (needed to answer "
                        "text and image queries)")
    q.add_argument("--out", required=True, help="index directory to write")
    q.add_argument("--images-root", help="folder the metadata's image_path values lie in (served from there only)")
    q.add_argument("--factory", default="Flat", help="FAISS factory string (default Flat)")
    q.add_argument("--overwrite", action="store_true")
    q.set_defaults(func=cmd_import)


def cmd_export(args: argparse.Namespace) -> int:
    from indexer.interop import export_clip_retrieval

    out = export_clip_retrieval(args.index, args.out, side=args.side, float16=args.float16,
                                rows_per_part=args.rows_per_part)
    print(json.dumps({"exported": str(out)}))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from indexer.interop import import_clip_retrieval

    ix = import_clip_retrieval(args.clip_retrieval, args.checkpoint, args.out, images_root=args.images_root,
                               factory=args.factory, overwrite=args.overwrite)
    m = ix.manifest
    print(json.dumps({"index": str(ix.path), "images": m["counts"]["images"], "captions": m["counts"]["captions"],
                      "ground_truth": m["ground_truth"]}))
    return 0
