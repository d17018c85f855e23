"""Every dataset format behind one reader: :func:`read_dataset` returns the Karpathy reader's ``Dataset``.

| path | format | module |
|---|---|---|
| ``dataset_*.json`` or its folder | Karpathy split JSON | :mod:`.karpathy` |
| ``*.csv``, ``*.tsv`` | caption table | :mod:`.tables` |
| ``*.parquet`` or a folder of them | caption table | :mod:`.tables` |
| ``*.tar``, ``{0000..0099}.tar``, a folder of ``*.tar`` | webdataset shards | :mod:`.shards` |
| a folder written by ``datasets``' ``save_to_disk`` (Dataset or DatasetDict) | Arrow caption table | :mod:`.tables` |

Training, ``ltd index``, ``ltd eval`` and ``ltd data info`` all read through here, so a corpus in any
format trains, indexes and evaluates like a Karpathy JSON. Rows of a table or shard are streamed
(:mod:`.tables`, :mod:`.shards`); what is kept is one record per image (its path or byte range, split,
caption indices) and per caption, plus each image's metadata (``Dataset.image_meta``, which an
index stores as ``images`` meta ``metadata``).

Paths are hostile: a table's image path resolves under the table's folder or ``images_root``; an
absolute path must already lie inside that root and a ``..`` part is refused, so a table cannot
have files elsewhere indexed and then served. Images decode later under the pixel budget of
``images.load_image``.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from training.data.karpathy import CaptionRecord, Dataset, DatasetError, ImageRecord, load_karpathy, tokenize
from training.data.members import ImageMember
from training.data.shards import is_shard_spec, read_shards
from training.data.tables import Row, is_saved_dataset, read_csv, read_parquet, read_saved_dataset

log = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".tsv", ".tab")
DEFAULT_SPLIT = "test"  # rows without a split


@dataclass(frozen=True)
class RowSource:
    """Where the rows that :func:`assemble` groups come from, as the ``Dataset`` records it: its ``name``,
    the ``source`` file or folder, the images ``root`` their paths resolve under, the format ``fmt`` and
    the ``columns`` mapping a table was read with."""

    name: str
    source: Path
    root: Path
    fmt: str
    columns: str = ""


def dataset_format(path: str | Path) -> str:
    """``karpathy`` | ``table`` | ``parquet`` | ``shards`` | ``datasets`` for a dataset path."""
    p = Path(path)
    if p.suffix.lower() in TABLE_SUFFIXES:
        return "table"
    if is_saved_dataset(p):
        return "datasets"
    if p.suffix.lower() == ".parquet" or (p.is_dir() and any(p.glob("*.parquet")) and not any(p.glob("dataset_*.json"))):
        return "parquet"
    if is_shard_spec(path):
        return "shards"
    return "karpathy"


def read_dataset(path: str | Path, *, images_root: str | Path | None = None, drop_missing: bool = False,
                 columns: str = "", check_files: bool = True) -> Dataset:
    """Any supported dataset (see the module docstring) as a ``Dataset``; ``columns`` maps a table's
    columns to roles (:func:`.tables.parse_columns`)."""
    kind = dataset_format(path)
    if kind == "karpathy":
        return load_karpathy(path, images_root=images_root, check_files=check_files, drop_missing=drop_missing)
    p = Path(path)
    if kind == "shards":
        src = RowSource(p.stem.split("{")[0].rstrip("-_") or "shards", p, _shard_root(path), "webdataset")
        return assemble(read_shards(path), src, check_files=check_files, drop_missing=drop_missing)
    if not p.exists():
        raise DatasetError(f"dataset file not found: {p}")
    reader = {"table": read_csv, "parquet": read_parquet, "datasets": read_saved_dataset}[kind]
    root = Path(images_root) if images_root else (p if p.is_dir() else p.parent)
    src = RowSource(p.stem, p, root, {"table": "csv"}.get(kind, kind), columns)
    return assemble(reader(p, columns), src, check_files=check_files, drop_missing=drop_missing)


def _shard_root(spec: str | Path) -> Path:
    s = str(spec)
    p = Path(s.split("{")[0]) if "{" in s else Path(s)
    return p if p.is_dir() else p.parent


def confined_path(value: str, root: Path, where: str) -> Path:
    """``value`` (a table's image path) as a path inside ``root``; refuses ``..``, drive letters, and
    absolute paths outside the root."""
    text = value.replace("\\", "/")
    parts = PurePosixPath(text).parts
    if ".." in parts or (len(text) > 1 and text[1] == ":"):
        raise DatasetError(f"{where}: image path {value!r} must stay inside the images root (no '..')")
    if text.startswith("/"):
        root_abs = Path(os.path.abspath(root))
        p = Path(os.path.normpath(text))
        if not p.is_relative_to(root_abs):
            raise DatasetError(f"{where}: image path {value!r} lies outside the images root {root_abs} (give "
                               "--images-root / data.images_root, or write paths relative to it)")
        return p
    if not text.strip("./"):
        raise DatasetError(f"{where}: image path {value!r} is not a file name")
    return root / text


def assemble(rows: Iterable[Row], src: RowSource, *, check_files: bool = True, drop_missing: bool = False) -> Dataset:
    """Group rows by image (in order of first appearance) into a ``Dataset``: an image's captions are
    those of all its rows; its split and metadata are its first row's (another split on a later row
    is an error: the same image in train and test)."""
    by_key: dict[object, int] = {}
    found: list[tuple[object, Path | ImageMember, str, str, list[str], dict]] = []  # key, path, filename, split, caps, meta
    n_rows = 0
    for row in rows:
        n_rows += 1
        if isinstance(row.image, ImageMember):
            key, path, filename = row.image, row.image, row.image.name
        else:
            path = confined_path(str(row.image), src.root, row.where)
            key, filename = os.path.normpath(str(path)), str(row.image)
        split = row.split or DEFAULT_SPLIT
        split = {"restval": "train", "dev": "val", "validation": "val"}.get(split, split)
        k = by_key.get(key)
        if k is None:
            by_key[key] = len(found)
            found.append((key, path, filename, split, list(row.captions), row.metadata))
        else:
            if found[k][3] != split:
                raise DatasetError(f"{row.where}: image {filename!r} is in split {found[k][3]!r} on an earlier row and "
                                   f"{split!r} here (an image belongs to one split)")
            found[k][4].extend(row.captions)
    if not found:
        raise DatasetError(f"{src.source}: no rows")
    return _dataset(found, src, n_rows=n_rows, check_files=check_files, drop_missing=drop_missing)


def _dataset(found: list, src: RowSource, *, n_rows: int, check_files: bool, drop_missing: bool) -> Dataset:
    name, source, root, fmt = src.name, src.source, src.root, src.fmt
    images: list[ImageRecord] = []
    captions: list[CaptionRecord] = []
    metas: list[dict] = []
    missing: list[str] = []
    for _, path, filename, split, caps, meta in found:
        if check_files and not path.is_file():
            missing.append(str(path))
            if drop_missing:
                continue
        index = len(images)
        first = len(captions)
        captions.extend(CaptionRecord(index=first + j, id=first + j, image_index=index, raw=c, tokens=tuple(tokenize(c)))
                        for j, c in enumerate(caps))
        images.append(ImageRecord(index=index, id=index, filename=filename, path=path, split=split,
                                  caption_indices=tuple(range(first, len(captions)))))
        metas.append(meta)
    if missing and not drop_missing:
        raise DatasetError(f"{len(missing)} of {len(found)} images listed in {source} are missing under {root}; first: "
                           f"{', '.join(missing[:3])}. Fix the images root (--images-root, data.images_root) or drop them "
                           "(--set data.drop_missing=true).")
    if missing:
        log.warning("dropped %d images missing on disk (first: %s)", len(missing), missing[:3])
    if not images:
        raise DatasetError(f"{source}: no usable images (all {len(missing)} missing on disk)")
    log.info("%s: %d rows → %d images, %d captions (%s)", source, n_rows, len(images), len(captions), fmt)
    return Dataset(name=name, json_path=source, root=root, images=images, captions=captions, missing=missing,
                   meta={"format": fmt, "columns": src.columns}, image_meta=metas if any(metas) else [])
