"""`ltd items`: the living index's items from the command line, the twins of the write routes.

    ltd items add --index DIR --images-dir PHOTOS [--metadata '{"album": "trip"}']   # a folder, recursively
    ltd items add --index DIR --csv photos.csv [--columns image=path,caption=text]    # a table (captions, metadata)
    ltd items rm  --index DIR ID [ID ...]
    ltd items set --index DIR ID --metadata '{"tags": ["beach"]}' [--replace] [--caption TEXT ...]
    ltd items ls  --index DIR [--filter '{"field": "folder", "eq": "2024"}'] [--after ID] [--limit N]

Each command opens the index's item store (creating it on the first write), writes in one durable
transaction and exits; a server serving the same index picks the change up within a second
(search/registry.py). Images are embedded with the checkpoint that built the index (checked by
sha256), in this process; corrupt files are skipped and listed.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from indexer.corpus import image_files
from training.errors import UserFileNotFound, UserValueError

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("items", parents=[common], help="add, remove, edit and list the items of a living index")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser("add", parents=[common], help="add images from a folder or a CSV/parquet table")
    add.add_argument("--images-dir", help="a folder of images (searched recursively)")
    add.add_argument("--csv", help="a CSV/TSV/parquet table: image path, captions, metadata columns")
    add.add_argument("--columns", default="", help="--csv: which column is what (e.g. image=path,caption=text)")
    add.add_argument("--metadata", default="{}", help="JSON object given to every image added")
    add.add_argument("--no-progress", action="store_true")
    rm = verbs.add_parser("rm", parents=[common], help="remove items by id")
    rm.add_argument("ids", nargs="+", type=int)
    st = verbs.add_parser("set", parents=[common], help="change an item's metadata and/or captions")
    st.add_argument("id", type=int)
    st.add_argument("--metadata", help="JSON object merged into the item's (a null value drops a field)")
    st.add_argument("--replace", action="store_true", help="replace the metadata instead of merging")
    st.add_argument("--caption", action="append", help="the item's captions (repeatable; replaces them)")
    ls = verbs.add_parser("ls", parents=[common], help="list items as JSON lines")
    ls.add_argument("--filter", help="a filter (JSON; docs/guides/living-index.md)")
    ls.add_argument("--after", type=int, default=None, help="list items with ids after this one")
    ls.add_argument("--limit", type=int, default=100)
    for v in (add, rm, st, ls):
        v.add_argument("--index", required=True, help="the index directory")
        v.add_argument("--checkpoint", help="the checkpoint that built the index, if it moved")
    p.set_defaults(func=cmd_items)


def _json(text: str | None, what: str) -> object:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise UserValueError(f"{what} must be JSON, e.g. '{{\"field\": \"split\", \"eq\": \"test\"}}'") from None


def _open(args: argparse.Namespace, *, write: bool):
    """(IndexDir, ItemStore or None, LoadedModel or None) of ``--index``."""
    from indexer.build import load_model
    from indexer.index import IndexDirError, load_index_dir, read_manifest, resolve_checkpoint
    from indexer.items import ItemStore
    from training.fsio import sha256_file

    path = Path(args.index)
    if not (path / "manifest.json").is_file():
        raise UserFileNotFound(f"--index {path}: not an index directory (no manifest.json)")
    ix = load_index_dir(path, verify="counts")
    store = ItemStore.open(ix, create=write)
    lm = None
    if write and args.verb in ("add", "set"):
        ckpt = resolve_checkpoint(path, read_manifest(path), args.checkpoint)
        if sha256_file(ckpt) != ix.manifest.get("checkpoint_sha256"):
            raise IndexDirError(f"{ckpt} is not the checkpoint that built {path}")
        lm = load_model(ckpt)
    return ix, store, lm


def cmd_items(args: argparse.Namespace) -> int:
    from indexer.ingest import prepare
    from search.writes import check_captions, check_metadata

    write = args.verb in ("add", "rm", "set")
    ix, store, lm = _open(args, write=write)
    if args.verb == "add":
        common = check_metadata(_json(args.metadata, "--metadata"))
        inputs, root = _inputs(args, common)
        rows, failed = prepare(lm.model, store, inputs, root=root, workers=None)
        seq, ids = store.add(rows)
        new = sum(added for _, added in ids)
        print(f"added {new} item(s), {len(ids) - new} already there, {len(failed)} skipped (write {seq})")
        for k, why in sorted(failed.items()):
            print(f"skipped {inputs[k].path}: {why}", file=sys.stderr)
    elif args.verb == "rm":
        seq, found = store.remove(args.ids)
        missing = sorted(set(args.ids) - set(found))
        print(f"removed {len(found)} item(s) (write {seq})" + (f"; not there: {missing}" if missing else ""))
        if missing and not found:
            return 2
    elif args.verb == "set":
        md = check_metadata(_json(args.metadata, "--metadata")) if args.metadata is not None else None
        if md is not None and not args.replace:
            current = store.metadata([args.id]).get(args.id, {})
            md = {k: v for k, v in {**current, **md}.items() if v is not None}
        caps = None
        if args.caption is not None:
            from indexer.embed import embed_captions

            texts = check_captions(args.caption)
            vecs = embed_captions(lm.model, texts)
            caps = [(t, t, vecs[j]) for j, t in enumerate(texts)]
        try:
            seq = store.edit(args.id, md, caps)
        except KeyError:
            raise UserValueError(f"item {args.id} is not in {args.index}") from None
        print(f"item {args.id} changed (write {seq})")
    else:
        _list(ix, store, args)
    store.close() if store is not None else None
    return 0


def _inputs(args: argparse.Namespace, common: dict):
    from indexer.ingest import ItemInput

    if bool(args.images_dir) == bool(args.csv):
        raise UserValueError("give --images-dir or --csv")
    if args.images_dir:
        root = Path(args.images_dir).resolve()
        if not root.is_dir():
            raise UserFileNotFound(f"--images-dir {root}: no such folder")
        return [ItemInput(path=p, metadata=dict(common)) for p in image_files(root)], root
    from training.data.formats import read_dataset

    ds = read_dataset(args.csv, columns=args.columns) if args.columns else read_dataset(args.csv)
    texts = {c.index: c.raw for c in ds.captions}
    meta = ds.image_meta or [{}] * len(ds.images)
    return [ItemInput(path=im.path, captions=[texts[c] for c in im.caption_indices],
                      metadata={**common, **(meta[im.index] or {}), **({"split": im.split} if im.split else {})})
            for im in ds.images], ds.root


def _list(ix, store, args: argparse.Namespace) -> None:
    from search.filters import parse_filter
    from search.live import LiveIndex

    live = LiveIndex(ix, store)
    snap = live.current
    ids = snap.index.images.meta["ids"]
    mask = ~snap.index.images.index.dead
    flt = _json(args.filter, "--filter")
    if flt is not None:
        mask &= parse_filter(flt).mask(snap.table)[: len(mask)]
    rows = sorted((int(ids[r]), r) for r in mask.nonzero()[0] if args.after is None or ids[r] > args.after)
    texts = snap.index.captions.meta["texts"]
    for image_id, row in rows[: args.limit]:
        print(json.dumps({"id": image_id, "filename": snap.index.images.meta["filenames"][row],
                          "metadata": live.metadata(row), "captions": [texts[c] for c in live.caption_rows(row)]}))
