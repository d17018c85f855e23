"""FAISS inner-product indexes and the index directory.

An index directory holds, per modality, ``<m>.faiss`` (the search index), ``<m>.npy`` (the exact
float32 embeddings, so evaluation is exact whatever the factory) and ``<m>.json`` (ids, texts, file
names and ground-truth links), plus ``manifest.json``. Everything is written to a temporary folder
and renamed into place, so a crash never leaves half an index; appends replace files one by one
with the manifest last.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from training.data.convert import write_json_atomic

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODALITIES = ("images", "captions")


class IndexDirError(ValueError):
    """An index directory that cannot be used as asked (mismatch, corrupt, wrong arguments)."""


def gpu_count() -> int:
    try:
        return int(faiss.get_num_gpus())
    except AttributeError:  # faiss-cpu builds without GPU symbols
        return 0


def _tune(index: faiss.Index) -> None:
    """Search-time parameters that FAISS leaves at speed-first defaults (nprobe 1, efSearch 16)."""
    ps = faiss.ParameterSpace()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(ivf.nlist, max(8, ivf.nlist // 16))
    try:
        ps.set_index_parameter(index, "efSearch", 128)
    except RuntimeError:
        pass  # not an HNSW index


class VectorIndex:
    """A FAISS inner-product index built from a factory string (``Flat``, ``HNSW32``, ``IVF256,PQ32``…).

    Searches run on a GPU copy when the installed FAISS has GPUs. FAISS releases the GIL during
    search, so concurrent server threads search in parallel."""

    def __init__(self, index: faiss.Index, factory: str):
        self.index, self.factory = index, factory
        self._gpu = None
        self._lock = threading.Lock()  # guards add(); searches on a built index are thread-safe
        if gpu_count() > 0:
            try:
                res = faiss.StandardGpuResources()
                self._gpu = faiss.index_cpu_to_gpu(res, 0, index)
                self._gpu_res = res
            except Exception as e:  # e.g. HNSW has no GPU version: search stays on the CPU
                log.info("index %s stays on the CPU (%s)", factory, e)

    @classmethod
    def build(cls, vectors: np.ndarray, factory: str = "Flat", *, train_size: int = 100_000, seed: int = 0) -> VectorIndex:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] < 1:
            raise IndexDirError(f"expected (n, d) vectors, got shape {vectors.shape}")
        d = vectors.shape[1]
        try:
            index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise IndexDirError(f"invalid FAISS factory string {factory!r}: {str(e).splitlines()[-1][:200]}") from None
        if not index.is_trained:
            if len(vectors) == 0:
                raise IndexDirError(f"factory {factory!r} needs training vectors, but the corpus is empty")
            rng = np.random.default_rng(seed)
            sample = vectors if len(vectors) <= train_size else vectors[rng.choice(len(vectors), train_size, replace=False)]
            try:
                index.train(sample)
            except RuntimeError as e:
                raise IndexDirError(f"cannot train {factory!r} on {len(sample)} vectors (too few for this factory? "
                                  f"use Flat or fewer IVF lists): {str(e).splitlines()[-1][:200]}") from None
        _tune(index)
        if len(vectors):
            index.add(vectors)
        return cls(index, factory)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def add(self, vectors: np.ndarray) -> None:
        with self._lock:
            self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
            if self._gpu is not None:
                self._gpu.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), each (n_queries, min(k, ntotal)); sorted by score descending."""
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        k = max(1, min(int(k), self.ntotal))
        idx = self._gpu if self._gpu is not None else self.index
        scores, ids = idx.search(q, k)
        return scores, ids

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        faiss.write_index(self.index, str(tmp))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, factory: str) -> VectorIndex:
        try:
            index = faiss.read_index(str(path))
            _tune(index)
            return cls(index, factory)
        except RuntimeError as e:
            raise IndexDirError(f"{path} is not a readable FAISS index: {str(e).splitlines()[-1][:200]}") from None


@dataclass
class Modality:
    """One side of an index directory: vectors, search index and item metadata."""

    index: VectorIndex
    vectors: np.ndarray  # (n, d) float32
    meta: dict  # ids, texts / filenames, ground-truth links (lists of equal length)

    @property
    def ids(self) -> list[int]:
        return self.meta["ids"]


@dataclass
class IndexDir:
    path: Path
    manifest: dict
    images: Modality
    captions: Modality

    @property
    def name(self) -> str:
        return self.manifest.get("name", self.path.name)

    @property
    def has_ground_truth(self) -> bool:
        return bool(self.manifest.get("ground_truth"))


def _write_modality(folder: Path, name: str, mod: Modality) -> None:
    mod.index.save(folder / f"{name}.faiss")
    tmp = folder / f".{name}.tmp{os.getpid()}.npy"
    np.save(tmp, np.ascontiguousarray(mod.vectors, dtype=np.float32))
    os.replace(tmp, folder / f"{name}.npy")
    write_json_atomic(folder / f"{name}.json", mod.meta)


def save_index_dir(path: str | Path, manifest: dict, images: Modality, captions: Modality, *,
                   overwrite: bool = False) -> IndexDir:
    """Write a new index directory atomically (temp folder, then rename)."""
    path = Path(path)
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"{path} already exists; pass --overwrite to replace it or --append to add to it")
    tmp = path.with_name(f".{path.name}.building{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write_modality(tmp, "images", images)
        _write_modality(tmp, "captions", captions)
        manifest = {**manifest, "format": FORMAT_VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "counts": {"images": images.index.ntotal, "captions": captions.index.ntotal}}
        write_json_atomic(tmp / "manifest.json", manifest, indent=2)
        if path.exists():
            old = path.with_name(f".{path.name}.old{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return IndexDir(path, manifest, images, captions)


def append_to_index_dir(ix: IndexDir, images: tuple[np.ndarray, dict] | None,
                        captions: tuple[np.ndarray, dict] | None, skipped: list[dict] | None = None) -> IndexDir:
    """Add (vectors, metadata lists) to an existing index directory; ids continue, the manifest is
    written last."""
    for name, new in (("images", images), ("captions", captions)):
        if new is None or len(new[0]) == 0:
            continue
        vectors, meta = new
        cur: Modality = getattr(ix, name)
        if vectors.shape[1] != cur.vectors.shape[1]:
            raise IndexDirError(f"cannot append {name}: dimension {vectors.shape[1]} != {cur.vectors.shape[1]}")
        n_old = len(cur.vectors)
        cur.index.add(vectors)
        cur.vectors = np.concatenate([cur.vectors, vectors])
        for k, v in meta.items():
            if isinstance(v, list):
                cur.meta[k] = cur.meta.get(k, [None] * n_old) + v
        _write_modality(ix.path, name, cur)
    ix.manifest["counts"] = {"images": ix.images.index.ntotal, "captions": ix.captions.index.ntotal}
    ix.manifest["skipped"] = ix.manifest.get("skipped", []) + (skipped or [])
    ix.manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(ix.path / "manifest.json", ix.manifest, indent=2)
    return ix


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.is_file():
        raise IndexDirError(f"{path} is not an index directory (no manifest.json); build one with `ltd index`")
    try:
        return json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise IndexDirError(f"{mf} is corrupt: {e}") from None


def load_index_dir(path: str | Path, *, checkpoint_sha256: str | None = None) -> IndexDir:
    """Load an index directory. With ``checkpoint_sha256``, refuse an index built by another checkpoint."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("format") != FORMAT_VERSION:
        raise IndexDirError(f"{path}: index format {manifest.get('format')} is not supported (expected {FORMAT_VERSION})")
    if checkpoint_sha256 is not None and manifest.get("checkpoint_sha256") != checkpoint_sha256:
        raise IndexDirError(
            f"{path} was built with checkpoint sha256 {str(manifest.get('checkpoint_sha256'))[:12]}…, but the "
            f"checkpoint given has {checkpoint_sha256[:12]}…: its embeddings would not match the query encoder. "
            "Rebuild the index with `ltd index` for this checkpoint."
        )
    mods = {}
    for name in MODALITIES:
        try:
            meta = json.loads((path / f"{name}.json").read_text())
            vectors = np.load(path / f"{name}.npy", mmap_mode="r")
        except (OSError, json.JSONDecodeError, ValueError) as e:
            raise IndexDirError(f"{path}: cannot read {name} ({e})") from None
        index = VectorIndex.load(path / f"{name}.faiss", manifest.get("factory", "Flat"))
        if index.ntotal != len(vectors) or len(meta.get("ids", [])) != len(vectors):
            raise IndexDirError(f"{path}: {name} files disagree ({index.ntotal} indexed, {len(vectors)} vectors, "
                              f"{len(meta.get('ids', []))} ids); rebuild the index")
        mods[name] = Modality(index, np.asarray(vectors), meta)
    return IndexDir(path, manifest, mods["images"], mods["captions"])
