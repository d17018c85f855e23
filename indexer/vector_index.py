"""FAISS inner-product search indexes built from a factory string (``Flat``, ``HNSW32``, ``IVF256,PQ32`` …).

Approximate indexes can re-rank: the top ``k × rerank`` candidates of the compressed index are
re-scored against the exact float32 vectors (the index directory's ``.npy``, memory-mapped when
served), so PQ codes only need to bring the true neighbours into the candidate list. ``indexer/ann.py``
chooses the factory, ``nprobe`` and ``rerank`` from the corpus size."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import faiss
import numpy as np

from training.errors import UserError
from training.fsio import atomic_path

log = logging.getLogger(__name__)


class IndexDirError(UserError, ValueError):
    """An index (directory) that cannot be used as asked: mismatch, corrupt, torn, wrong arguments."""


def gpu_count() -> int:
    try:
        return int(faiss.get_num_gpus())
    except AttributeError:  # faiss-cpu builds without GPU symbols
        return 0


def _tune(index: faiss.Index, nprobe: int | None = None) -> None:
    """Search-time parameters that FAISS leaves at speed-first defaults (nprobe 1, efSearch 16)."""
    ps = faiss.ParameterSpace()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(ivf.nlist, nprobe or max(8, ivf.nlist // 16))
    try:
        ps.set_index_parameter(index, "efSearch", 128)
    except RuntimeError:
        pass  # not an HNSW index


class VectorIndex:
    """A FAISS inner-product index built from a factory string (``Flat``, ``HNSW32``, ``IVF256,PQ32``…).

    Searches run on a GPU copy when the installed FAISS has GPUs. FAISS releases the GIL during
    search, so concurrent server threads search in parallel."""

    def __init__(self, index: faiss.Index, factory: str, *, rerank: int = 0, exact: np.ndarray | None = None):
        self.index, self.factory = index, factory
        self.rerank, self.exact = int(rerank), exact  # re-rank k × rerank candidates on ``exact`` (n, d)
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
    def build(cls, vectors: np.ndarray, factory: str = "Flat", *, train_size: int = 100_000, seed: int = 0,
              nprobe: int | None = None, rerank: int = 0) -> VectorIndex:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] < 1:
            raise IndexDirError(f"expected (n, d) vectors, got shape {vectors.shape}")
        d = vectors.shape[1]
        try:
            index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise IndexDirError(f"invalid FAISS factory string {factory!r}: {str(e).splitlines()[-1][:200]}") from None
        ivf = faiss.try_extract_index_ivf(index)
        ivf = faiss.downcast_index(ivf) if ivf is not None else None
        if ivf is not None and hasattr(ivf, "do_polysemous_training"):
            ivf.do_polysemous_training = False  # only Hamming-filtered search uses it; its annealing takes minutes
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
        _tune(index, nprobe)
        if len(vectors):
            index.add(vectors)
        return cls(index, factory, rerank=rerank, exact=vectors if rerank else None)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @property
    def nprobe(self) -> int | None:
        ivf = faiss.try_extract_index_ivf(self.index)
        return int(ivf.nprobe) if ivf is not None else None

    def describe(self) -> dict:
        """What the manifest records to reopen this index with the same search parameters."""
        return {"factory": self.factory, "nprobe": self.nprobe, "rerank": self.rerank}

    def copy(self) -> VectorIndex:
        return VectorIndex(faiss.clone_index(self.index), self.factory, rerank=self.rerank, exact=self.exact)

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
        if self.rerank > 1 and self.exact is not None:
            return self._reranked(idx, q, k)
        scores, ids = idx.search(q, k)
        return scores, ids

    def _reranked(self, idx: faiss.Index, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        _, cand = idx.search(q, min(self.ntotal, k * self.rerank))
        scores = np.full((len(q), k), -np.inf, np.float32)
        ids = np.full((len(q), k), -1, np.int64)
        for i, row in enumerate(cand):
            row = row[row >= 0]
            order = np.sort(row)  # ascending offsets: sequential reads from a memory-mapped file
            exact = np.asarray(self.exact[order], dtype=np.float32) @ q[i]
            top = np.argsort(-exact, kind="stable")[:k]
            scores[i, : len(top)], ids[i, : len(top)] = exact[top], order[top]
        return scores, ids

    def save(self, path: Path) -> None:
        with atomic_path(path) as tmp:
            faiss.write_index(self.index, str(tmp))

    @classmethod
    def load(cls, path: Path, factory: str, *, nprobe: int | None = None, rerank: int = 0,
             exact: np.ndarray | None = None, mmap: bool = False) -> VectorIndex:
        """Read an index; ``mmap`` maps an IVF index's inverted lists from the file instead of reading
        them into memory (FAISS ``IO_FLAG_MMAP``: the lists stay in the page cache, shared and evictable)."""
        try:
            flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap and "IVF" in factory else 0
            index = faiss.read_index(str(path), flags)
            _tune(index, nprobe)
            return cls(index, factory, rerank=rerank, exact=exact)
        except RuntimeError as e:
            raise IndexDirError(f"{path} is not a readable FAISS index: {str(e).splitlines()[-1][:200]}") from None
