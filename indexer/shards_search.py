"""One shard's searcher: what a shard's process (a thread of ``ltd serve``, or a Ray Serve replica) holds.

``ShardSearcher`` loads one shard of a sharded index directory (indexer/shards_index.py), verified, with
its data memory-mapped (the exact ``.npy``; an IVF index's lists), and answers a side's top k as parent
rows. A Flat shard is scanned on its memory-mapped vectors rather than read into FAISS a second time.
Light on purpose (numpy and FAISS, no torch): a replica starts in a second, not in the server's ten.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from indexer.index import MODALITIES, IndexDir, Modality
from indexer.shards_index import load_shard, open_sharded, shard_rows


class ShardDown(RuntimeError):
    """A shard that gave no answer (no live replica, timed out, failed)."""


def exact_top(vectors: np.ndarray, q: np.ndarray, k: int, chunk: int = 262_144) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows), each (n_queries, k'), of the exact top ``k`` over ``vectors`` (memory-mapped: read
    in chunks of rows), k' = min(k, n)."""
    k = min(k, len(vectors))
    best_s = np.zeros((len(q), 0), np.float32)
    best_r = np.zeros((len(q), 0), np.int64)
    for at in range(0, len(vectors), chunk):
        new_s = q @ np.asarray(vectors[at: at + chunk], np.float32).T
        new_r = np.broadcast_to(np.arange(at, at + new_s.shape[1]), new_s.shape)
        s, r = np.concatenate([best_s, new_s], axis=1), np.concatenate([best_r, new_r], axis=1)
        if s.shape[1] > k:
            part = np.argpartition(-s, k - 1, axis=1)[:, :k]
            s, r = np.take_along_axis(s, part, 1), np.take_along_axis(r, part, 1)
        best_s, best_r = s, r
    order = np.lexsort((best_r, -best_s), axis=1)
    return np.take_along_axis(best_s, order, 1), np.take_along_axis(best_r, order, 1)


class ShardSearcher:
    """One shard's search, on both sides: (scores, parent rows) of its top k (−inf / −1 past its rows)."""

    def __init__(self, ix: IndexDir):
        self.ix = ix
        self.rows = {m: shard_rows(ix, m) for m in MODALITIES}

    @classmethod
    def open(cls, path: str | Path, shard: int, verify: str = "hash") -> ShardSearcher:
        """Shard ``shard`` of the sharded index directory ``path``, verified, its data memory-mapped."""
        sd = open_sharded(path, verify=verify)
        return cls(load_shard(sd, shard, verify=verify, mmap=True))

    def search(self, side: str, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """This shard's top ``k`` rows of ``side`` for each query, as parent rows."""
        if side not in MODALITIES:
            raise ValueError(f"unknown side {side!r}")
        q = np.ascontiguousarray(np.atleast_2d(queries), np.float32)
        mod: Modality = getattr(self.ix, side)
        k = max(1, int(k))
        scores = np.full((len(q), k), -np.inf, np.float32)
        rows = np.full((len(q), k), -1, np.int64)
        n = len(mod.vectors)
        if n == 0:
            return scores, rows
        if mod.index.factory == "Flat":
            s, r = exact_top(mod.vectors, q, k)  # the memory-mapped vectors, not a second copy in FAISS
        else:
            s, r = mod.index.search(q, min(k, n))
        ok = r >= 0
        scores[:, : s.shape[1]] = np.where(ok, s, -np.inf)
        rows[:, : r.shape[1]] = np.where(ok, self.rows[side][np.where(ok, r, 0)], -1)
        return scores, rows

    def ping(self) -> int:
        """The shard's generation (a health probe)."""
        return self.ix.generation
