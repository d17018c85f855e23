"""Precomputed region features read from disk: the setting of VSRN and TERN (bottom-up-attention
regions, 36 × 2048 per image, boxes optional), for users who have such features.

Sources (``model.precomputed_path``), every one aligned to the dataset's images before use:

- an ``.npy`` file (N, R, C) in the dataset's image order;
- an ``.npz`` with ``features`` (N, R, C) and ``ids`` (image ids or file names) in any order, and
  optionally ``boxes`` (N, R, 4);
- a folder of per-image files named by image id or file-name stem: ``<id>.npy`` (R, C), or
  ``<id>.npz`` holding ``features`` | ``feat`` | ``x``, optionally ``boxes`` | ``bbox`` and
  ``image_w`` / ``image_h`` (the bottom-up-attention tools' per-image files);
- a folder of per-split arrays ``<split>_ims.npy`` (n, R, C), the SCAN/VSRN "precomp" naming (``dev``
  for val), rows in the order the split's images appear in the Karpathy JSON; optional
  ``<split>_boxes.npy`` (n, R, 4). A row count that differs from the split's image count fails.

Boxes become TERN's five spatial features per region, [x1, y1, x2, y2, area] in [0, 1], appended to
the region's channels (``model.region_boxes``); boxes in pixels need ``image_w`` / ``image_h``.
Every image must have the same number of regions (the common fixed-36 features; adaptive counts
are refused rather than padded).

The aligned array is written once into the feature cache as ``CACHE/features/<key>/features.npy``,
(N, 1, R·C') float16 — the layout of the packaged CNN's grid features, so both region sources
reach the model as the same rows (``tests/test_reasoning.py`` checks it) — keyed by the source's
files (paths, sizes, modification times), the image list and the box setting. It is written
through a temporary name and renamed: whole or absent.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from training.env import default_cache_dir
from training.errors import UserError
from training.features import FeatureStore, load_precomputed
from training.fsio import remove_stale_temps, temp_name, write_json_atomic
from training.progress import progress

log = logging.getLogger(__name__)

FEATURE_KEYS, BOX_KEYS = ("features", "feat", "x"), ("boxes", "bbox")
SPLIT_FILES = {"val": ("val", "dev")}


class RegionFeatureError(UserError, ValueError):
    """Region features that cannot be aligned with the dataset; the message says what to fix."""


def spatial_features(boxes: np.ndarray, width: float | None = None, height: float | None = None) -> np.ndarray:
    """(R, 4) boxes x1, y1, x2, y2 → (R, 5) [x1, y1, x2, y2, area], normalised to [0, 1]."""
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    if width and height:
        b = b / np.array([width, height, width, height], dtype=np.float32)
    elif b.size and b.max() > 1.0 + 1e-3:
        raise RegionFeatureError("boxes look like pixels (values > 1) and the source gives no image_w/image_h: "
                                 "normalise them to [0, 1] or store image_w and image_h with them")
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return np.concatenate([b, area[:, None]], axis=1)


def _with_boxes(feats: np.ndarray, boxes: np.ndarray | None, use: bool, w=None, h=None) -> np.ndarray:
    if boxes is None or not use:
        return feats
    return np.concatenate([feats.astype(np.float32), spatial_features(boxes, w, h)], axis=-1)


def _first(z, keys: tuple[str, ...]):
    return next((z[k] for k in keys if k in z), None)


def _image_files(folder: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix in (".npy", ".npz") and p.is_file()}


def _read_one(path: Path, use_boxes: bool) -> np.ndarray:
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    with np.load(path, allow_pickle=False) as z:
        feats = _first(z, FEATURE_KEYS)
        if feats is None:
            raise RegionFeatureError(f"{path}: an .npz needs one of the arrays {', '.join(FEATURE_KEYS)}")
        w, h = (float(z["image_w"]), float(z["image_h"])) if "image_w" in z and "image_h" in z else (None, None)
        return _with_boxes(feats, _first(z, BOX_KEYS), use_boxes, w, h)


class _Source:
    """One region source: its files (for the cache key) and a reader of image i's (R, C') array."""

    def __init__(self, path: Path, ids: Sequence[int], filenames: Sequence[str], splits: Sequence[str], boxes: bool):
        self.path, self.boxes, self.n = path, boxes, len(ids)
        if path.is_dir():
            per_split = {s: self._split_file(s) for s in dict.fromkeys(splits)}
            if all(f is not None for f in per_split.values()):
                self._init_splits(per_split, splits)
            else:
                self._init_images(ids, filenames)
        elif path.suffix == ".npz":
            self._init_npz(ids, filenames)
        elif path.suffix == ".npy":
            arr = np.load(path, mmap_mode="r")
            if arr.ndim != 3 or arr.shape[0] != self.n:
                raise RegionFeatureError(f"{path}: expected (N, R, C) region features for the dataset's {self.n} "
                                         f"images in its order, got shape {arr.shape} (an .npz with ids, or one "
                                         "file per image, can be in any order)")
            self.files, self.read = [path], lambda i: arr[i]
        else:
            raise RegionFeatureError(f"precomputed region features not found or not .npy/.npz/a folder: {path}")

    def _split_file(self, split: str) -> Path | None:
        for name in SPLIT_FILES.get(split, (split,)):
            if (self.path / f"{name}_ims.npy").is_file():
                return self.path / f"{name}_ims.npy"
        return None

    def _init_splits(self, per_split: dict[str, Path], splits: Sequence[str]) -> None:
        arrays, boxes, row, self.files = {}, {}, [], []
        counts = {s: 0 for s in per_split}
        for s in splits:  # the row of each image inside its split's array, in dataset order
            row.append(counts[s])
            counts[s] += 1
        for s, f in per_split.items():
            arrays[s] = np.load(f, mmap_mode="r")
            if arrays[s].ndim != 3 or arrays[s].shape[0] != counts[s]:
                raise RegionFeatureError(f"{f}: expected ({counts[s]}, R, C) for the {counts[s]} {s} images, got "
                                         f"{arrays[s].shape}; rows must follow the JSON's order of that split's images")
            bf = f.with_name(f.name.replace("_ims.npy", "_boxes.npy"))
            boxes[s] = np.load(bf, mmap_mode="r") if self.boxes and bf.is_file() else None
            self.files += [f] + ([bf] if boxes[s] is not None else [])
        self.read = lambda i: _with_boxes(arrays[splits[i]][row[i]],
                                          None if boxes[splits[i]] is None else boxes[splits[i]][row[i]], self.boxes)

    def _init_images(self, ids: Sequence[int], filenames: Sequence[str]) -> None:
        files = _image_files(self.path)
        chosen = [files.get(str(i)) or files.get(Path(fn).stem) for i, fn in zip(ids, filenames)]
        missing = [fn for fn, f in zip(filenames, chosen) if f is None]
        if missing:
            raise RegionFeatureError(f"{self.path}: no region features for {len(missing)} of {self.n} images (first: "
                                     f"{missing[0]}); per-image files are named <image id> or <file-name stem> "
                                     ".npy/.npz, per-split arrays <split>_ims.npy")
        self.files = chosen
        self.read = lambda i: _read_one(chosen[i], self.boxes)

    def _init_npz(self, ids: Sequence[int], filenames: Sequence[str]) -> None:
        z = np.load(self.path, allow_pickle=False)
        if "features" not in z or "ids" not in z:
            raise RegionFeatureError(f"{self.path}: an .npz needs arrays 'features' (N, R, C) and 'ids'")
        feats, keys_arr = z["features"], z["ids"]
        by_name = keys_arr.dtype.kind in "US"
        lookup = {(str(k) if by_name else int(k)): j for j, k in enumerate(keys_arr)}
        keys = list(filenames) if by_name else list(ids)
        missing = [k for k in keys if k not in lookup]
        if missing:
            raise RegionFeatureError(f"{self.path}: no features for {len(missing)} images (first: {missing[0]})")
        rows = [lookup[k] for k in keys]
        boxes = z["boxes"] if self.boxes and "boxes" in z else None
        self.files = [self.path]
        self.read = lambda i: _with_boxes(feats[rows[i]], None if boxes is None else boxes[rows[i]], self.boxes)

    def key(self, ids: Sequence[int]) -> str:
        h = hashlib.sha256(json.dumps({"source": str(self.path.resolve()), "boxes": self.boxes}).encode())
        for f in self.files:
            st = f.stat()
            h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        return "regions-" + h.hexdigest()[:24]


def load_region_features(path: str | Path, ids: Sequence[int], filenames: Sequence[str], splits: Sequence[str], *,
                         boxes: bool = True, cache_dir: str | Path = "") -> tuple[FeatureStore, int]:
    """The dataset's region features as a FeatureStore of (N, 1, R·C') float16 rows, and C' (channels per
    region, + 5 with boxes). ``ids``, ``filenames``, ``splits``: the dataset's images, in its order."""
    path = Path(os.path.expandvars(os.path.expanduser(str(path))))
    if "$" in str(path):
        raise RegionFeatureError(f"model.precomputed_path={str(path)!r}: environment variable not set "
                                 "(e.g. export LTD_REGION_DIR=/path/to/region/features)")
    if not path.exists():
        raise RegionFeatureError(f"precomputed region features not found: {path}")
    src = _Source(path, ids, filenames, splits, boxes)
    root = default_cache_dir(str(cache_dir)) / "features" / src.key(ids)
    fpath, meta = root / "features.npy", root / "meta.json"
    if not (fpath.is_file() and meta.is_file()):
        _assemble(src, root)
    info = json.loads(meta.read_text())
    feats = np.load(fpath, mmap_mode="r")
    return FeatureStore(features=feats, key=root.name, path=root), int(info["region_dim"])


def _assemble(src: _Source, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(root)
    first = np.asarray(src.read(0))
    if first.ndim != 2:
        raise RegionFeatureError(f"{src.path}: expected (R, C) regions per image, got {first.shape} for the first")
    shape = first.shape
    tmp = temp_name(root / "features.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(src.n, 1, shape[0] * shape[1]))
    try:
        bar = progress(src.n, desc=f"region features ({src.path.name})", unit="img")
        for i in range(src.n):
            a = np.asarray(src.read(i))
            if a.shape != shape:
                raise RegionFeatureError(f"{src.path}: image {i} has regions {a.shape}, the first has {shape}; every "
                                         "image needs the same number of regions (fixed-count features)")
            out[i, 0] = a.reshape(-1)
            bar.update(1)
        bar.close()
        out.flush()
        del out
        os.replace(tmp, root / "features.npy")
    finally:
        if tmp.exists():
            tmp.unlink()
    write_json_atomic(root / "meta.json", {"source": str(src.path), "n_images": src.n, "regions": shape[0],
                                           "region_dim": shape[1], "boxes": src.boxes})
    log.info("region features: %d images × %d regions × %d → %s", src.n, shape[0], shape[1], root)


def read_precomputed(m, ds, *, cache_dir: str = "") -> tuple[FeatureStore, int]:
    """``model.backbone=precomputed`` features of the dataset ``ds`` for the model config ``m``: region
    rows for the region encoders (and the channels per region), else ``load_precomputed``'s (N, V, D)
    features (and 0)."""
    ids, names = [im.id for im in ds.images], [im.filename for im in ds.images]
    if m.image_encoder == "head":
        return load_precomputed(m.precomputed_path, ids, names), 0
    return load_region_features(m.precomputed_path, ids, names, [im.split for im in ds.images],
                                boxes=m.region_boxes, cache_dir=cache_dir)
