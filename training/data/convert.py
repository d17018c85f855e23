"""Converters from the original caption files into the Karpathy split JSON: Flickr8k/30k here, COCO
in ``training/data/coco.py``, both through :func:`merge_images`.

For users who have the official files but not Karpathy's JSON. The output carries an
``images_root`` key (relative to the JSON's folder when possible) so the reader finds the images,
and a per-image ``filepath`` when the images live in several folders under it.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections import defaultdict
from pathlib import Path

from training.data.karpathy import SPLIT_ALIASES, DatasetError, resolve_images_root, tokenize
from training.fsio import write_json_atomic

log = logging.getLogger(__name__)


def read_json(path: Path) -> dict:
    """A JSON file, or a one-line DatasetError naming it (missing, truncated, not UTF-8)."""
    if not path.is_file():
        raise DatasetError(f"file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON (truncated download?): {e}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not UTF-8 text: {e}") from None


def _relative(target: str, base: Path) -> str:
    try:
        return os.path.relpath(target, os.path.abspath(base))
    except ValueError:  # different drives
        return target


def _previous(out: Path, append: bool, provenance: dict | None) -> tuple[list[dict], dict | None]:
    """The images already in ``out`` (with their absolute ``_path``) and the merged provenance."""
    if not (append and out.exists()):
        return [], provenance
    old = read_json(out)
    if not isinstance(old.get("images"), list):
        raise DatasetError(f"{out}: expected a Karpathy JSON with an 'images' list to append to")
    root = os.path.abspath(resolve_images_root(out, old, None))
    for im in old["images"]:
        im["_path"] = os.path.join(root, im.get("filepath") or "", im["filename"])
    before = old.get("split_provenance")
    if before is None or provenance is None:
        return old["images"], before or provenance
    if before.get("method") != "per_file" or provenance.get("method") != "per_file":
        raise DatasetError(f"the splits of {out} were assigned by {before.get('method')}; appending files would "
                           "mix that assignment with others: convert every file in one command instead")
    return old["images"], {"method": "per_file", "files": {**before["files"], **provenance["files"]}}


def merge_images(out: Path, new_images: list[dict], dataset: str, append: bool, *,
                 provenance: dict | None = None, key: str | None = None) -> dict:
    """The dataset JSON for ``new_images`` (each with its absolute ``_path``), after those already in
    ``out`` when appending. ``images_root`` becomes the common parent of every image's folder
    (relative to ``out``'s folder) and each image's ``filepath`` its folder below that root, so images
    from several folders (COCO's train2014/ and val2014/) form one dataset. ``key``: an id that must
    also be unique (``cocoid``). New images continue the ids (imgid, sentid) of those already there."""
    images, provenance = _previous(out, append, provenance)
    known = {im["_path"] for im in images}
    dup = [im["_path"] for im in new_images if im["_path"] in known]
    if dup:
        raise DatasetError(f"{len(dup)} images are already in {out} (first: {dup[0]}); nothing written")
    if key:
        known_keys = {im.get(key) for im in images} - {None}
        clash = [im[key] for im in new_images if im.get(key) in known_keys]
        if clash:
            raise DatasetError(f"{len(clash)} images with a {key} already in {out} (first: {clash[0]}); nothing written")
    next_img = max((im["imgid"] for im in images), default=-1) + 1
    sent = max((s["sentid"] for im in images for s in im["sentences"]), default=-1) + 1
    for k, im in enumerate(new_images, start=next_img):  # ids already given stay as they were
        im["imgid"], im["sentids"] = k, []
        for s in im["sentences"]:
            s["imgid"], s["sentid"] = k, sent
            im["sentids"].append(sent)
            sent += 1
    images = images + new_images
    folders = {os.path.dirname(os.path.abspath(im["_path"])) for im in images}
    try:
        root = os.path.commonpath(sorted(folders))
    except ValueError:
        raise DatasetError(f"the image folders {sorted(folders)[:3]} share no common root (different drives)") from None
    for im in images:
        folder = os.path.relpath(os.path.dirname(os.path.abspath(im.pop("_path"))), root)
        im["filepath"] = "" if folder == "." else folder.replace(os.sep, "/")
    merged = {"dataset": dataset, "images_root": _relative(root, out.parent), "images": images}
    if provenance:
        merged["split_provenance"] = provenance
    return merged


def check_split(split: str) -> str:
    split = SPLIT_ALIASES.get(split, split)
    if split not in ("train", "val", "test"):
        raise DatasetError(f"split must be one of train, val, test (or restval/dev), got {split!r}")
    return split


_TOKEN_LINE = re.compile(r"^(?P<file>[^#\t]+)#(?P<n>\d+)\t(?P<cap>.*)$")


def _read_flickr_tokens(path: Path) -> dict[str, list[str]]:
    """``Flickr8k.token.txt`` / ``results_20130124.token`` (``file.jpg#0<TAB>caption``) or the
    Kaggle ``results.csv`` (``image_name| comment_number| comment``)."""
    if not path.is_file():
        raise DatasetError(f"file not found: {path}")
    caps: dict[str, list[tuple[int, str]]] = defaultdict(list)
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and "|" in lines[0] and "\t" not in lines[0]:
        rows = csv.reader(lines, delimiter="|")
        header = [h.strip() for h in next(rows)]
        if header[:3] != ["image_name", "comment_number", "comment"]:
            raise DatasetError(f"{path}: unknown '|'-separated header {header}")
        for k, row in enumerate(rows, start=2):
            if len(row) < 3:
                raise DatasetError(f"{path}:{k}: expected 3 '|'-separated fields, got {len(row)}")
            caps[row[0].strip()].append((int(row[1].strip() or 0), "|".join(row[2:]).strip()))
    else:
        for k, ln in enumerate(lines, start=1):
            m = _TOKEN_LINE.match(ln)
            if not m:
                raise DatasetError(f"{path}:{k}: expected 'FILE#N<TAB>caption', got {ln[:80]!r}")
            caps[m["file"].strip()].append((int(m["n"]), m["cap"].strip()))
    return {f: [c for _, c in sorted(v)] for f, v in caps.items()}


def convert_flickr(
    tokens_file: str | Path,
    images_root: str | Path,
    out: str | Path,
    *,
    split_files: dict[str, str | Path] | None = None,
    default_split: str | None = None,
    dataset: str = "flickr",
) -> dict:
    """Flickr8k/30k caption files + split lists (one file name per line, e.g.
    ``Flickr_8k.trainImages.txt``) → Karpathy JSON. Images in no split list go to ``default_split``
    or are left out (and counted)."""
    out, images_root = Path(out), Path(images_root)
    caps = _read_flickr_tokens(Path(tokens_file))
    assign: dict[str, str] = {}
    for split, sf in (split_files or {}).items():
        split, sf = check_split(split), Path(sf)
        if not sf.is_file():
            raise DatasetError(f"split list not found: {sf}")
        for name in sf.read_text().split():
            if name in assign and assign[name] != split:
                raise DatasetError(f"{name} is listed in both {assign[name]} and {split}")
            assign[name] = split
    unknown = [n for n in assign if n not in caps]
    if unknown:
        raise DatasetError(f"{len(unknown)} images in the split lists have no captions (first: {unknown[0]})")
    if default_split is not None:
        default_split = check_split(default_split)
    images, unassigned = [], 0
    for fname in sorted(caps):
        split = assign.get(fname, default_split)
        if split is None:
            unassigned += 1
            continue
        images.append({"_path": str(images_root / fname), "filename": Path(fname).name, "split": split,
                       "sentences": [{"raw": c, "tokens": tokenize(c)} for c in caps[fname]]})
    if not images:
        raise DatasetError("no images were assigned to a split (give --split-file or --default-split)")
    merged = merge_images(out, images, dataset, append=False)
    write_json_atomic(out, merged)
    counts = defaultdict(int)
    for im in images:
        counts[im["split"]] += 1
    return {"images": len(images), "splits": dict(counts), "unassigned": unassigned, "out": str(out)}
