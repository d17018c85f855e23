"""Read-only views that make a living index's snapshot look like a plain index to the code that ranks.

A snapshot's side is the base generation's rows, then the rows added since (row ``n_base + j``), with
removed rows masked out. These views join the two without copying the base: ``ConcatList`` (a
metadata list), ``RowVectors`` (the exact vectors), ``LiveSearch`` (the search index: base FAISS
index or an exact scan of the allowed rows, plus an exact scan of the added rows, merged) and
``Positions`` (id → row, removed ids absent). Added rows live in append-only buffers shared by all
snapshots; each view is bounded by its own row count, so a later write never shows through.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import faiss
import numpy as np

from indexer.vector_index import VectorIndex

# A filtered query is scored exactly over its allowed base rows when there are at most EXACT_CANDIDATES
# of them, or when they are under EXACT_SHARE of the base; otherwise FAISS searches with the mask applied
# to its candidates (widened until k allowed rows are found, then scored exactly). The share: an
# approximate index finds a query's near neighbours, and a filter that keeps a small share of the rows
# leaves few of them, so the allowed top k lie deep in the unfiltered ranking, where the index's recall
# falls. On bench/filtered_search.py's clustered million (BENCHMARKS.md, "Filtered search on a million
# vectors") the widened FAISS path reached recall@10 0.92 at 10 % of the rows, 0.98 at 15 %, 0.99 at 25 %.
EXACT_CANDIDATES = 50_000
EXACT_SHARE = 0.2
# Exact scores of at least IN_PLACE_ROWS rows read them in place (FAISS fvec_inner_products_by_idx: no
# gathered copy; fewer are gathered by numpy, cheaper than entering FAISS's OpenMP region), split across
# FAISS's threads in parts of at least PARALLEL_ROWS rows.
IN_PLACE_ROWS = 2048
PARALLEL_ROWS = 32_768


class ConcatList(Sequence):
    """``base + extra[:n - len(base)]`` without copying either."""

    __slots__ = ("base", "extra", "n")

    def __init__(self, base: Sequence, extra: Sequence, n: int):
        self.base, self.extra, self.n = base, extra, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        i = int(i)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        nb = len(self.base)
        return self.base[i] if i < nb else self.extra[i - nb]

    def __iter__(self) -> Iterator:
        yield from self.base
        yield from self.extra[: self.n - len(self.base)]

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence with the same items in the same order (a list, a tuple, another view)."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable through its buffers, like a list


class RowVectors:
    """The exact vectors of base rows then added rows, (n, d) float32, indexable like an array."""

    def __init__(self, base: np.ndarray, added: np.ndarray):
        self.base, self.added = base, added
        self.shape = (len(base) + len(added), base.shape[1] if base.ndim == 2 else added.shape[1])
        self.ndim, self.dtype = 2, np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx):
        nb = len(self.base)
        if isinstance(idx, (int, np.integer)):
            i = int(idx) + (self.shape[0] if idx < 0 else 0)
            return self.base[i] if i < nb else self.added[i - nb]
        rows = np.arange(self.shape[0])[idx]
        out = np.empty((len(rows), self.shape[1]), np.float32)
        lo = rows < nb
        out[lo] = self.base[rows[lo]]
        out[~lo] = self.added[rows[~lo] - nb]
        return out

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate([np.asarray(self.base, np.float32), self.added]) if len(self.added) else \
            np.asarray(self.base, np.float32)
        return out.astype(dtype) if dtype is not None else out

    def scores(self, q: np.ndarray) -> np.ndarray:
        """Inner products of every row with ``q``."""
        return np.concatenate([np.asarray(self.base, np.float32) @ q, self.added @ q])


def exact_scores(vectors, v: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Inner products of ``v`` with ``vectors[rows]`` (float32, in the order of ``rows``). Many rows of a
    C-contiguous float32 array (a memory-mapped ``.npy`` included) are read in place by FAISS, on its
    threads; fewer rows, or any other array, are gathered by numpy."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if not (len(rows) >= IN_PLACE_ROWS and isinstance(vectors, np.ndarray) and vectors.dtype == np.float32
            and vectors.ndim == 2 and vectors.flags.c_contiguous and 0 <= rows.min() and rows.max() < len(vectors)):
        return np.asarray(vectors[rows], np.float32) @ v if len(rows) else np.zeros(0, np.float32)
    d = vectors.shape[1]
    parts = max(1, min(faiss.omp_get_max_threads(), len(rows) // PARALLEL_ROWS))
    per = -(-len(rows) // parts)
    ids = np.full(parts * per, -1, np.int64)
    ids[: len(rows)] = rows
    x = np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.float32), (parts, d)))
    out = np.empty(parts * per, np.float32)
    faiss.fvec_inner_products_by_idx(faiss.swig_ptr(out), faiss.swig_ptr(x), faiss.swig_ptr(vectors),
                                     faiss.swig_ptr(ids), d, parts, per)
    return out[: len(rows)]


def top_rows(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score descending, row ascending on ties): every merge of scored rows in search/ uses it."""
    if len(scores) > k:  # every row scoring at least the k-th best: ties at the cut are decided by row below
        keep = scores >= np.partition(scores, len(scores) - k)[len(scores) - k]
        scores, rows = scores[keep], rows[keep]
    order = np.lexsort((rows, -scores))[:k]
    return scores[order], rows[order]


def top_rows_batch(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``top_rows`` of every query at once: (n, m) scores and rows (−1: no row) → (n, k), in the same
    order (score descending, row ascending on ties), padded with −inf and −1 where fewer than k rows."""
    n, m = scores.shape
    valid = rows >= 0
    big = np.iinfo(np.int64).max
    s = np.where(valid, scores, -np.inf).astype(np.float32)
    r = np.where(valid, rows, big).astype(np.int64)
    order = np.lexsort((r, -s), axis=-1)[:, :k]
    s, r = np.take_along_axis(s, order, 1), np.take_along_axis(r, order, 1)
    r[r == big] = -1
    s[r < 0] = -np.inf
    if s.shape[1] < k:
        s = np.pad(s, ((0, 0), (0, k - s.shape[1])), constant_values=-np.inf)
        r = np.pad(r, ((0, 0), (0, k - r.shape[1])), constant_values=-1)
    return s, r


class LiveSearch:
    """The search index of a snapshot's side (see the module doc); ``search`` as VectorIndex.search, plus
    ``allowed`` (a mask over all rows: only those may be returned). Removed rows never are."""

    def __init__(self, base: VectorIndex, base_vectors: np.ndarray, added: np.ndarray, dead: np.ndarray):
        self.base, self.base_vectors, self.added, self.dead = base, base_vectors, added, dead
        self.n_base = base.ntotal
        self.live = int(len(dead) - dead.sum())
        self._any_dead = self.live < len(dead)  # a snapshot's ``dead`` never changes (copy on write)
        self.factory, self.rerank = base.factory, base.rerank

    @property
    def ntotal(self) -> int:
        """The number of live rows: base and added rows, less the removed ones."""
        return self.live

    @property
    def dim(self) -> int:
        """The vectors' dimension, the base index's."""
        return self.base.dim

    @property
    def nprobe(self) -> int | None:
        """The base index's IVF ``nprobe``; None when it is not an IVF index."""
        return self.base.nprobe

    def describe(self) -> dict:
        """The base index's search parameters (``VectorIndex.describe``), for the manifest."""
        return self.base.describe()

    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (n_queries, k), by score descending (row ascending on ties), -inf and -1 past
        the hits found; an untouched index with no ``allowed`` answers as ``VectorIndex.search`` does."""
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        k = max(1, int(k))
        if allowed is None and not self._any_dead and not len(self.added):
            return self.base.search(q, k)  # an untouched index: FAISS as before
        if allowed is None:
            mask = ~self.dead
        else:
            mask = allowed & ~self.dead if self._any_dead else np.asarray(allowed, bool)
        scores = np.full((len(q), k), -np.inf, np.float32)
        rows = np.full((len(q), k), -1, np.int64)
        base_ok, added_ok = mask[: self.n_base], np.flatnonzero(mask[self.n_base:])
        allowed_rows = _Lazy(lambda: np.flatnonzero(base_ok))  # found once per call, when a query needs them
        for i, v in enumerate(q):
            s, r = self._base(v, k, base_ok, allowed_rows)
            if len(added_ok):
                s = np.concatenate([s, self.added[added_ok] @ v])
                r = np.concatenate([r, added_ok + self.n_base])
            s, r = top_rows(s, r, k)
            scores[i, : len(s)], rows[i, : len(r)] = s, r
        return scores, rows

    def _base(self, v: np.ndarray, k: int, ok: np.ndarray, allowed_rows: _Lazy) -> tuple[np.ndarray, np.ndarray]:
        """The best allowed base rows for one query, exactly scored (``allowed_rows``: ``flatnonzero(ok)``)."""
        n_ok = len(allowed_rows.get()) if allowed_rows.done else int(np.count_nonzero(ok))
        if n_ok == 0:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        if n_ok <= EXACT_CANDIDATES or n_ok < EXACT_SHARE * self.n_base or self.base.factory == "Flat":
            return self._exact(v, allowed_rows.get(), k)
        want = k
        while True:  # FAISS candidates, filtered, widened until k allowed rows (or every row) are in
            want = min(self.n_base, want * 4)
            s, r = self.base.search(v[None, :], want)
            r = r[0][r[0] >= 0]
            r = r[ok[r]]
            if len(r) >= k:
                return self._exact(v, np.sort(r), k)
            if want >= self.n_base:
                # an approximate index visits only the lists it probes: fewer than k allowed rows there does
                # not mean fewer exist, so the answer comes from every allowed row, exactly
                return self._exact(v, allowed_rows.get(), k)

    def _exact(self, v: np.ndarray, rows: np.ndarray, k: int, chunk: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
        """The top ``k`` of ``rows`` (ascending) by exact score, read from the vectors in chunks."""
        best_s, best_r = np.zeros(0, np.float32), np.zeros(0, np.int64)
        for at in range(0, len(rows), chunk):
            part = rows[at: at + chunk]
            s, r = top_rows(np.concatenate([best_s, exact_scores(self.base_vectors, v, part)]),
                        np.concatenate([best_r, part]), k)
            best_s, best_r = s, r
        return best_s, best_r


class _Lazy:
    """A value computed on first use (``get``), then kept; ``done`` says whether it was."""

    __slots__ = ("fn", "value", "done")

    def __init__(self, fn):
        self.fn, self.value, self.done = fn, None, False

    def get(self):
        if not self.done:
            self.value, self.done = self.fn(), True
        return self.value


class Positions:
    """id → row of a snapshot's side; removed ids are absent."""

    __slots__ = ("base", "added", "dead")

    def __init__(self, base: dict[int, int], added: dict[int, int], dead: np.ndarray):
        self.base, self.added, self.dead = base, added, dead

    def get(self, key, default=None):
        """The row of id ``key``, or ``default`` when the id is unknown or removed."""
        row = self.base.get(int(key))
        if row is None:
            row = self.added.get(int(key))
        return default if row is None or self.dead[row] else row

    def __getitem__(self, key) -> int:
        row = self.get(key)
        if row is None:
            raise KeyError(key)
        return row

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return int(len(self.dead) - self.dead.sum())
