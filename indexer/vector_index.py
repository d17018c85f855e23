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


def hnsw_of(index: faiss.Index):
    """The ``HNSW`` graph structure of an HNSW index (also inside an ``IndexIDMap``), else None."""
    idx = faiss.downcast_index(index)
    if isinstance(idx, faiss.IndexIDMap):
        idx = faiss.downcast_index(idx.index)
    return idx.hnsw if isinstance(idx, faiss.IndexHNSW) else None


def _tune(index: faiss.Index, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """Search-time parameters that FAISS leaves at speed-first defaults (nprobe 1, efSearch 16)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(ivf.nlist, nprobe or max(8, ivf.nlist // 16))
    hnsw = hnsw_of(index)
    if hnsw is not None:
        hnsw.efSearch = int(ef_search or 128)


def rerank_exact(cand: np.ndarray, exact: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of each query's top ``k`` among its candidate rows ``cand`` (−1: none), scored
    exactly on ``exact`` (n, d), sorted by score (ties: lower row first). Queries go in chunks whose
    candidate rows are read once each, in ascending order: sequential reads of a memory-mapped file."""
    cand = np.sort(cand, axis=1)
    scores = np.full((len(q), k), -np.inf, np.float32)
    ids = np.full((len(q), k), -1, np.int64)
    step = max(1, (1 << 22) // max(1, cand.shape[1] * q.shape[1]))  # ~16 MB of gathered rows per chunk
    for a in range(0, len(q), step):
        c = cand[a:a + step]
        valid = c >= 0
        rows = np.unique(c[valid])
        if not len(rows):
            continue
        sub = np.asarray(exact[rows], dtype=np.float32)
        pos = np.searchsorted(rows, np.where(valid, c, rows[0]))
        s = np.matmul(sub[pos], q[a:a + step, :, None])[..., 0]
        s[~valid] = -np.inf
        top = np.argsort(-s, axis=1, kind="stable")[:, :k]
        ts, ti = np.take_along_axis(s, top, 1), np.take_along_axis(c, top, 1)
        ti[~np.isfinite(ts)] = -1
        scores[a:a + step, : top.shape[1]], ids[a:a + step, : top.shape[1]] = ts, ti
    return scores, ids


class VectorIndex:
    """A FAISS inner-product index built from a factory string (``Flat``, ``HNSW32``, ``IVF256,PQ32``…).

    Searches run on a GPU copy when the installed FAISS has GPUs. FAISS releases the GIL during
    search, so concurrent server threads search in parallel."""

    def __init__(self, index: faiss.Index, factory: str, *, rerank: int = 0, exact: np.ndarray | None = None):
        self.index, self.factory = index, factory
        self.rerank, self.exact = int(rerank), exact  # re-rank k × rerank candidates on ``exact`` (n, d)
        self.tuning: dict | None = None  # what indexer/tune.py measured, when it chose this index
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
              nprobe: int | None = None, rerank: int = 0, ef_search: int | None = None) -> VectorIndex:
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
        _tune(index, nprobe, ef_search)
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

    @property
    def ef_search(self) -> int | None:
        hnsw = hnsw_of(self.index)
        return int(hnsw.efSearch) if hnsw is not None else None

    def describe(self) -> dict:
        """What the manifest records to reopen this index with the same search parameters."""
        out = {"factory": self.factory, "nprobe": self.nprobe, "rerank": self.rerank}
        if self.ef_search is not None:
            out["efSearch"] = self.ef_search
        if self.tuning is not None:
            out["tuning"] = self.tuning
        return out

    def copy(self) -> VectorIndex:
        vi = VectorIndex(faiss.clone_index(self.index), self.factory, rerank=self.rerank, exact=self.exact)
        vi.tuning = self.tuning
        return vi

    def add(self, vectors: np.ndarray) -> None:
        with self._lock:
            x = np.ascontiguousarray(vectors, dtype=np.float32)
            if isinstance(faiss.downcast_index(self.index), faiss.IndexIDMap):  # ids are row numbers: continue them
                self.index.add_with_ids(x, np.arange(self.ntotal, self.ntotal + len(x), dtype=np.int64))
            else:
                self.index.add(x)
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
        return rerank_exact(cand, self.exact, q, k)

    def save(self, path: Path) -> None:
        with atomic_path(path) as tmp:
            faiss.write_index(self.index, str(tmp))

    @classmethod
    def load(cls, path: Path, spec: dict, *, exact: np.ndarray | None = None, mmap: bool = False) -> VectorIndex:
        """Read an index with the search parameters ``spec`` records (what :meth:`describe` wrote to the
        manifest: ``factory``, default Flat; ``nprobe``, ``rerank``, ``efSearch``, ``tuning``, each optional);
        ``exact`` re-ranks its candidates. ``mmap`` maps an IVF index's inverted lists from the file instead
        of reading them into memory (FAISS ``IO_FLAG_MMAP``: the lists stay in the page cache, shared and
        evictable)."""
        factory, rerank = spec.get("factory") or "Flat", int(spec.get("rerank") or 0)
        nprobe, ef_search, tuning = spec.get("nprobe"), spec.get("efSearch"), spec.get("tuning")
        try:
            flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap and "IVF" in factory else 0
            index = faiss.read_index(str(path), flags)
            _tune(index, nprobe, ef_search)
            vi = cls(index, factory, rerank=rerank, exact=exact)
            vi.tuning = tuning
            return vi
        except RuntimeError as e:
            raise IndexDirError(f"{path} is not a readable FAISS index: {str(e).splitlines()[-1][:200]}") from None
