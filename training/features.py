"""Frozen-backbone feature cache: computed once per (backbone, preprocessing, views, image list).

Layout of ``CACHE/features/<key>/``: ``features.npy`` (N, V, D) float16 memmap, ``status.npy``
(N,) int8 (0 todo, 1 done, 2 failed), ``failed.json`` (index → reason), ``meta.json``. Work is
flushed after every batch, so a killed extraction resumes where it stopped. One process at a time
extracts into a folder (an exclusive ``flock`` on ``.lock``, released by the kernel if the holder
dies): the runs of ``ltd experiment --jobs N`` that need the same features wait for the first, then
read its cache, instead of all decoding the same images at once. Views: 1 = centre crop,
2 = centre + mirror, 10 = corners + centre, each mirrored (FNE paper's ten crops).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from training.data.gpu_decode import ExtractionSpec, decode_key, image_batches, uses_gpu
from training.data.members import ImageMember, image_sources
from training.device import default_device, to_device
from training.env import default_cache_dir
from training.errors import Unavailable, UserFileNotFound, UserValueError
from training.fsio import exclusive, write_json_atomic
from training.models.backbones import Backbone
from training.progress import progress

log = logging.getLogger(__name__)

TODO, DONE, FAILED = 0, 1, 2


@dataclass
class FeatureStore:
    features: np.ndarray  # (N, V, D) float16 (memmap for extracted features)
    failed: dict[int, str] = field(default_factory=dict)
    key: str = ""
    path: Path | None = None

    @property
    def n_views(self) -> int:
        return self.features.shape[1]

    @property
    def dim(self) -> int:
        return self.features.shape[2]

    def tensor(self, indices: Sequence[int] | np.ndarray | None = None) -> torch.Tensor:
        """float32 (n, V, D) copy in memory."""
        arr = self.features if indices is None else self.features[np.asarray(indices)]
        return torch.from_numpy(np.asarray(arr, dtype=np.float32))

    def mean_view(self, indices: Sequence[int] | np.ndarray | None = None) -> torch.Tensor:
        """(n, D): the average over views, the features used for evaluation and serving."""
        return self.tensor(indices).mean(1)


def cache_key(backbone_key: dict, paths: Sequence[Path], n_views: int, transform_id: str = "",
              draft: bool = False, gpu: bool = False) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"backbone": backbone_key, "views": n_views, "transform": transform_id, **decode_key(draft, gpu)},
                        sort_keys=True).encode())
    for p in paths:
        if isinstance(p, ImageMember):  # an image inside a shard
            h.update(f"{p.cache_id()}\n".encode())
            continue
        try:
            size = os.path.getsize(p)
        except OSError:
            size = -1
        h.update(f"{os.path.abspath(p)}\0{size}\n".encode())
    return h.hexdigest()[:24]


def extract_features(
    backbone: Backbone,
    paths: Sequence[Path],
    *,
    cache_dir: str | Path = "",
    spec: ExtractionSpec | None = None,
    desc: str = "image features",
) -> FeatureStore:
    """Features for every path (cached), decoded as ``spec`` says (None: the defaults of
    :class:`ExtractionSpec`: one view, batches of 64). Failed images keep zero features and are listed in
    ``failed``. ``spec.draft``: decode large JPEGs at a reduced scale (``decode_pool``; its own cache entry).
    The backbone runs on the process's device (``training.device``)."""
    spec = spec if spec is not None else ExtractionSpec()
    if spec.n_views not in (1, 2, 10):
        raise ValueError(f"n_views must be 1, 2 or 10, got {spec.n_views}")
    paths = image_sources(paths)
    key = cache_key(backbone.cache_key(), paths, spec.n_views, spec.transform_id, spec.draft, uses_gpu(spec.transform))
    root = default_cache_dir(str(cache_dir)) / "features" / key
    root.mkdir(parents=True, exist_ok=True)
    with exclusive(root / ".lock", f"the features in {root}"):
        _extract_into(root, backbone, paths, spec, desc)
    failed_path = root / "failed.json"
    failed = {int(k): v for k, v in json.loads(failed_path.read_text()).items()} if failed_path.exists() else {}
    if failed:
        log.warning("%d of %d images could not be read (see %s)", len(failed), len(paths), failed_path)
    return FeatureStore(features=np.lib.format.open_memmap(root / "features.npy", mode="r"), failed=failed, key=key,
                        path=root)


def _extract_into(root: Path, backbone: Backbone, paths: list[Path], spec: ExtractionSpec, desc: str) -> None:
    """Fill ``root``'s memmaps for every image still marked TODO (all of them in a new folder)."""
    n_views = spec.n_views
    fpath, spath = root / "features.npy", root / "status.npy"
    n, dim = len(paths), backbone.out_dim
    if fpath.exists() and spath.exists():
        feats = np.lib.format.open_memmap(fpath, mode="r+")
        status = np.lib.format.open_memmap(spath, mode="r+")
        if feats.shape != (n, n_views, dim) or status.shape != (n,):
            raise Unavailable(f"feature cache {root} has an unexpected shape; delete the folder and retry")
    else:
        feats = np.lib.format.open_memmap(fpath.with_suffix(".tmp.npy"), mode="w+", dtype=np.float16,
                                          shape=(n, n_views, dim))
        status = np.lib.format.open_memmap(spath.with_suffix(".tmp.npy"), mode="w+", dtype=np.int8, shape=(n,))
        feats.flush(), status.flush()
        os.replace(fpath.with_suffix(".tmp.npy"), fpath)
        os.replace(spath.with_suffix(".tmp.npy"), spath)
        write_json_atomic(root / "meta.json", {"backbone": backbone.cache_key(), "views": n_views,
                                               **decode_key(spec.draft, uses_gpu(spec.transform)),
                                               "transform": spec.transform_id, "n_images": n, "dim": dim})
    failed_path = root / "failed.json"
    failed = {int(k): v for k, v in json.loads(failed_path.read_text()).items()} if failed_path.exists() else {}
    todo = np.flatnonzero(status == TODO)
    if len(todo):
        if len(todo) < n:
            log.info("resuming feature extraction: %d of %d images left", len(todo), n)
        device = torch.device(default_device())
        backbone.to(device).eval()
        batches = image_batches(paths, todo, backbone.preprocess, spec)
        bar = progress(n, initial=n - len(todo), desc=desc, unit="img")
        for idx, x, bad in batches:
            if x is not None:
                out = backbone.extract(to_device(x, device)).reshape(len(idx), n_views, -1)
                feats[idx] = out.cpu().numpy().astype(np.float16)
                status[idx] = DONE
            for i, err in bad:
                status[i] = FAILED
                failed[int(i)] = err
                log.warning("skipped image: %s", err)
            feats.flush(), status.flush()
            if bad:
                write_json_atomic(failed_path, {str(k): v for k, v in sorted(failed.items())})
            bar.update(len(idx) + len(bad))
        bar.close()


def load_precomputed(path: str | Path, image_ids: Sequence[int], filenames: Sequence[str]) -> FeatureStore:
    """Features from a file: ``.npy`` (N, D) or (N, V, D) aligned with the dataset's image order, or
    ``.npz`` with ``features`` and ``ids`` (image ids or file names) in any order."""
    path = Path(path)
    if not path.is_file():
        raise UserFileNotFound(f"precomputed features not found: {path}")
    if path.suffix == ".npz":
        z = np.load(path, allow_pickle=False)
        if "features" not in z or "ids" not in z:
            raise UserValueError(f"{path}: an .npz needs arrays 'features' and 'ids'")
        feats, ids = z["features"], z["ids"]
        lookup = {(str(k) if ids.dtype.kind in "US" else int(k)): i for i, k in enumerate(ids)}
        keys = list(filenames) if ids.dtype.kind in "US" else list(image_ids)
        missing = [k for k in keys if k not in lookup]
        if missing:
            raise UserValueError(f"{path}: no features for {len(missing)} images (first: {missing[0]})")
        feats = feats[[lookup[k] for k in keys]]
    else:
        feats = np.load(path, mmap_mode="r")
        if feats.shape[0] != len(image_ids):
            raise UserValueError(f"{path}: {feats.shape[0]} rows but the dataset has {len(image_ids)} images "
                             "(an .npy must follow the dataset's image order; use an .npz with ids otherwise)")
    if feats.ndim == 2:
        feats = feats[:, None, :]
    if feats.ndim != 3:
        raise UserValueError(f"{path}: expected (N, D) or (N, V, D) features, got shape {feats.shape}")
    return FeatureStore(features=np.asarray(feats, dtype=np.float16), key=f"precomputed:{path.name}", path=path)


def lookup_features(backbone: Backbone, paths: Sequence[Path], *, cache_dir: str | Path = "", n_views: int = 1,
                    transform_id: str = "", draft: bool = False) -> FeatureStore | None:
    """The cached features for exactly these paths if extraction finished, else None (no work done)."""
    key = cache_key(backbone.cache_key(), image_sources(paths), n_views, transform_id, draft)
    root = default_cache_dir(str(cache_dir)) / "features" / key
    if not (root / "status.npy").is_file():
        return None
    status = np.load(root / "status.npy", mmap_mode="r")
    if (status == TODO).any():
        return None
    failed_path = root / "failed.json"
    failed = {int(k): v for k, v in json.loads(failed_path.read_text()).items()} if failed_path.exists() else {}
    return FeatureStore(features=np.lib.format.open_memmap(root / "features.npy", mode="r"), failed=failed,
                        key=key, path=root)
