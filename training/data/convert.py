"""Converters from the original COCO / Flickr caption files into the Karpathy split JSON.

For users who have the official files but not Karpathy's JSON. The output carries an
``images_root`` key (relative to the JSON's folder when possible) so the reader finds the images.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections import defaultdict
from pathlib import Path

from training.data.karpathy import SPLIT_ALIASES, DatasetError, tokenize
from training.fsio import write_json_atomic

log = logging.getLogger(__name__)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise DatasetError(f"file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON: {e}") from None


def _relative_root(images_root: Path, out: Path) -> str:
    try:
        return os.path.relpath(images_root.resolve(), out.parent.resolve())
    except ValueError:  # different drives
        return str(images_root.resolve())


def _merge(out: Path, new_images: list[dict], dataset: str, images_root: str, append: bool) -> dict:
    if append and out.exists():
        old = _read_json(out)
        if old.get("images_root") not in (None, images_root):
            raise DatasetError(
                f"{out} uses images_root {old.get('images_root')!r}; cannot append images under {images_root!r}"
            )
        images = old["images"]
    else:
        images = []
    known = {(im.get("filepath", ""), im["filename"]) for im in images}
    dup = [im["filename"] for im in new_images if (im.get("filepath", ""), im["filename"]) in known]
    if dup:
        raise DatasetError(f"{len(dup)} images are already in {out} (first: {dup[0]}); nothing written")
    next_img = max((im["imgid"] for im in images), default=-1) + 1
    next_sent = max((s["sentid"] for im in images for s in im["sentences"]), default=-1) + 1
    for im in new_images:
        im["imgid"] = next_img
        im["sentids"] = []
        for s in im["sentences"]:
            s["imgid"], s["sentid"] = next_img, next_sent
            im["sentids"].append(next_sent)
            next_sent += 1
        next_img += 1
    return {"dataset": dataset, "images_root": images_root, "images": images + new_images}


def _check_split(split: str) -> str:
    split = SPLIT_ALIASES.get(split, split)
    if split not in ("train", "val", "test"):
        raise DatasetError(f"split must be one of train, val, test (or restval/dev), got {split!r}")
    return split


def convert_coco(
    captions_files: list[str | Path],
    images_root: str | Path,
    split: str,
    out: str | Path,
    *,
    append: bool = False,
    dataset: str = "coco",
) -> dict:
    """Official COCO caption annotations (``images[].id/file_name``, ``annotations[].image_id/id/caption``)
    → Karpathy JSON. COCO annotation ids are kept as ``annid`` and image ids as ``cocoid`` so CxC
    ground truth can be joined. Returns counts."""
    split, out, images_root = _check_split(split), Path(out), Path(images_root)
    new_images: list[dict] = []
    orphans = 0
    for cf in map(Path, captions_files):
        data = _read_json(cf)
        for key in ("images", "annotations"):
            if not isinstance(data.get(key), list):
                raise DatasetError(f"{cf}: missing {key!r} list (is this a COCO captions_*.json file?)")
        by_image: dict[int, list[dict]] = defaultdict(list)
        ids = set()
        for i, im in enumerate(data["images"]):
            if "id" not in im or "file_name" not in im:
                raise DatasetError(f"{cf}: images[{i}] needs 'id' and 'file_name'")
            ids.add(im["id"])
        for j, a in enumerate(data["annotations"]):
            if "image_id" not in a or "caption" not in a:
                raise DatasetError(f"{cf}: annotations[{j}] needs 'image_id' and 'caption'")
            if a["image_id"] not in ids:
                orphans += 1
                continue
            by_image[a["image_id"]].append(a)
        for im in data["images"]:
            anns = sorted(by_image.get(im["id"], []), key=lambda a: a.get("id", 0))
            if not anns:
                continue
            fp = str(Path(im["file_name"]).parent) if "/" in im["file_name"] else ""
            new_images.append({
                "filepath": "" if fp == "." else fp,
                "filename": Path(im["file_name"]).name,
                "cocoid": int(im["id"]),
                "split": split,
                "sentences": [
                    {"raw": a["caption"].strip(), "tokens": tokenize(a["caption"]),
                     **({"annid": int(a["id"])} if "id" in a else {})}
                    for a in anns
                ],
            })
    if orphans:
        raise DatasetError(
            f"{orphans} captions refer to image ids that are not in the files' 'images' lists "
            "(captions for unknown images); pass the matching captions file for each image set"
        )
    if not new_images:
        raise DatasetError("no captioned images found in the given files")
    merged = _merge(out, new_images, dataset, _relative_root(images_root, out), append)
    write_json_atomic(out, merged)
    return {"images": len(new_images), "captions": sum(len(i["sentences"]) for i in new_images), "out": str(out)}


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
        split, sf = _check_split(split), Path(sf)
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
        default_split = _check_split(default_split)
    images, unassigned = [], 0
    for fname in sorted(caps):
        split = assign.get(fname, default_split)
        if split is None:
            unassigned += 1
            continue
        images.append({"filename": fname, "split": split,
                       "sentences": [{"raw": c, "tokens": tokenize(c)} for c in caps[fname]]})
    if not images:
        raise DatasetError("no images were assigned to a split (give --split-file or --default-split)")
    merged = _merge(out, images, dataset, _relative_root(images_root, out), append=False)
    write_json_atomic(out, merged)
    counts = defaultdict(int)
    for im in images:
        counts[im["split"]] += 1
    return {"images": len(images), "splits": dict(counts), "unassigned": unassigned, "out": str(out)}
