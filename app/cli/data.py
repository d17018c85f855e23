"""`ltd data …`: dataset inspection, the synthetic generator and converters."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from training.errors import UserValueError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("data", parents=[common], help="inspect, generate and convert datasets")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    q = dsub.add_parser("info", parents=[common], help="splits, counts, caption lengths and missing files of a dataset")
    q.add_argument("path", help="dataset_*.json (or the folder holding it), a CSV/TSV or parquet table, webdataset shards")
    q.add_argument("--images-root", help="folder the image paths are relative to")
    q.add_argument("--columns", default="", help="CSV/parquet: image=COL,caption=COL,split=COL,metadata=A|B")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.set_defaults(func=cmd_info)

    q = dsub.add_parser("synth", parents=[common], help="generate the embedded synthetic captioned-scenes dataset")
    q.add_argument("--out", required=True, help="output folder (images/ + dataset_synthetic.json)")
    q.add_argument("--images", type=int, default=5000)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--size", type=int, default=224, help="image side in pixels")
    q.add_argument("--workers", type=int, default=None)
    q.set_defaults(func=cmd_synth)

    q = dsub.add_parser("convert-coco", parents=[common],
                        help="official COCO caption files (several folders) → one Karpathy JSON, optionally on the 5k test split")
    q.add_argument("--coco-root", metavar="DIR",
                   help="an unpacked official download: finds annotations/captions_{train,val}YEAR.json, trainYEAR/, "
                        "valYEAR/ (implies --karpathy-test unless --split is given)")
    q.add_argument("--year", choices=("2014", "2017"), help="with --coco-root holding both years: which one")
    q.add_argument("--captions", action="append", default=[], metavar="FILE",
                   help="captions_*.json (repeatable; the i-th goes with the i-th --images-root)")
    q.add_argument("--images-root", action="append", default=[], metavar="DIR",
                   help="the folder holding the images of the matching --captions (one for all, or one per file)")
    q.add_argument("--split", action="append", default=[],
                   help="train | val | test (restval counts as train): one for all files, or one per file")
    q.add_argument("--karpathy-test", nargs="?", const="", default=None, metavar="IDS.npy",
                   help="test = the standard 5k test images (caption ids from eccv-caption's coco_test_ids.npy, or "
                        "this .npy); val = --val-size images drawn from the rest (not Karpathy's val); rest = train")
    q.add_argument("--val-size", type=int, default=5000, help="with --karpathy-test (default 5000)")
    q.add_argument("--val-seed", type=int, default=0, help="with --karpathy-test: the seed of the val draw (default 0)")
    q.add_argument("--name", default="coco", help="dataset name written into the JSON")
    q.add_argument("--out", required=True, help="output JSON")
    q.add_argument("--append", action="store_true", help="add to an existing output JSON (e.g. another split)")
    q.set_defaults(func=cmd_convert_coco)

    q = dsub.add_parser("convert-flickr", parents=[common], help="Flickr8k/30k token files + split lists → Karpathy JSON")
    q.add_argument("--tokens", required=True, help="Flickr8k.token.txt, results_20130124.token or results.csv")
    q.add_argument("--images-root", required=True, help="folder holding the images")
    q.add_argument("--split-file", action="append", default=[], metavar="SPLIT=FILE",
                   help="e.g. train=Flickr_8k.trainImages.txt (repeatable)")
    q.add_argument("--default-split", help="split for images in no list (default: leave them out)")
    q.add_argument("--name", default="flickr", help="dataset name written into the JSON")
    q.add_argument("--out", required=True)
    q.set_defaults(func=cmd_convert_flickr)


def cmd_info(args: argparse.Namespace) -> int:
    from training.data.formats import read_dataset
    from training.data.karpathy import dataset_info

    ds = read_dataset(args.path, images_root=args.images_root, drop_missing=True, columns=args.columns)
    info = dataset_info(ds)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"dataset {info['dataset']}  ({info['json']})\nimages root {info['images_root']}"
          + (f" (folders: {', '.join(Path(f).name for f in info['image_folders'])})" if len(info["image_folders"]) > 1 else ""))
    print(f"{'split':<8}{'images':>9}{'captions':>10}{'caps/img':>10}{'tokens mean':>13}{'median':>8}{'p95':>6}{'max':>6}")
    for name, s in info["splits"].items():
        t = s["caption_tokens"]
        cpi = "{}-{}".format(*s["captions_per_image"]) if s["captions_per_image"][0] != s["captions_per_image"][1] \
            else str(s["captions_per_image"][0])
        print(f"{name:<8}{s['images']:>9,}{s['captions']:>10,}{cpi:>10}{t['mean']:>13}{t['median']:>8g}{t['p95']:>6g}{t['max']:>6}")
    print(f"{'total':<8}{info['images']:>9,}{info['captions']:>10,}")
    if info["missing_files"]:
        print(f"missing files: {info['missing_files']} (left out), e.g. {', '.join(info['missing_examples'][:3])}")
    else:
        print("missing files: 0")
    prov = info["split_provenance"]
    print(f"splits: {prov['method'].replace('_', ' ')}")
    for name in ("test", "val", "train"):
        if isinstance(prov.get(name), str):
            print(f"  {name}: {prov[name]}")
    for f, split in (prov.get("files") or {}).items():
        print(f"  {split}: {f}")
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from training.data.synthetic import generate_synthetic

    path = generate_synthetic(args.out, n_images=args.images, seed=args.seed, image_size=args.size, workers=args.workers)
    print(path)
    return 0


def _per_file(values: list[str], n: int, what: str) -> list[str | None]:
    """One value for every file, or one per file (in the order of --captions)."""
    if not values:
        return [None] * n
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise UserValueError(f"{len(values)} {what} for {n} captions files: give one for all, or one per file")
    return values


def coco_pairs(args: argparse.Namespace) -> list:
    """The (captions file, image folder, split) pairs the command line names."""
    from training.data.coco import CocoPair, discover_coco_root

    if args.coco_root:
        if args.captions or args.images_root:
            raise UserValueError("give either --coco-root or --captions/--images-root pairs, not both")
        found = discover_coco_root(args.coco_root, args.year)
        splits = _per_file(args.split, len(found), "--split values")
        return [CocoPair(p.captions, p.images_root, s) for p, s in zip(found, splits)]
    if not args.captions:
        raise UserValueError("give --coco-root DIR, or --captions FILE --images-root DIR (repeatable)")
    if not args.images_root:
        raise UserValueError("--images-root is required with --captions")
    roots = _per_file(args.images_root, len(args.captions), "--images-root folders")
    splits = _per_file(args.split, len(args.captions), "--split values")
    return [CocoPair(Path(c), Path(r), s) for c, r, s in zip(args.captions, roots, splits)]


def cmd_convert_coco(args: argparse.Namespace) -> int:
    from training.data.coco import KarpathyTest, convert_coco, default_test_ids

    pairs = coco_pairs(args)
    test_ids = args.karpathy_test
    if test_ids is None and args.coco_root and not args.split:
        test_ids = ""
        print("convert-coco: --coco-root without --split: using the standard 5k test split (--karpathy-test)", flush=True)
    if test_ids == "":
        test_ids = default_test_ids()
    split = None if test_ids is None else KarpathyTest(test_ids, val_size=args.val_size, val_seed=args.val_seed)
    res = convert_coco(pairs, args.out, append=args.append, karpathy_test=split, dataset=args.name)
    print(json.dumps(res))
    return 0


def cmd_convert_flickr(args: argparse.Namespace) -> int:
    from training.data.convert import convert_flickr

    splits = {}
    for item in args.split_file:
        if "=" not in item:
            raise UserValueError(f"--split-file expects SPLIT=FILE, got {item!r}")
        k, v = item.split("=", 1)
        splits[k] = Path(v)
    res = convert_flickr(args.tokens, args.images_root, args.out, split_files=splits,
                         default_split=args.default_split, dataset=args.name)
    print(json.dumps(res))
    return 0
