"""FAISS inner-product search indexes built from a factory string (``Flat``, ``HNSW32``, ``IVF256,PQ32`` …)."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import faiss
import numpy as np

from training.fsio import atomic_path

log = logging.getLogger(__name__)


class IndexDirError(ValueError):
    """An index (directory) that cannot be used as asked: mismatch, corrupt, torn, wrong arguments."""


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

    def copy(self) -> VectorIndex:
        return VectorIndex(faiss.clone_index(self.index), self.factory)

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
        with atomic_path(path) as tmp:
            faiss.write_index(self.index, str(tmp))

    @classmethod
    def load(cls, path: Path, factory: str) -> VectorIndex:
        try:
            index = faiss.read_index(str(path))
            _tune(index)
            return cls(index, factory)
        except RuntimeError as e:
            raise IndexDirError(f"{path} is not a readable FAISS index: {str(e).splitlines()[-1][:200]}") from None
