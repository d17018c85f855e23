"""A sharded index directory read back as one: each side's rows in parent order and its metadata merged
(``parent_side``; the serving front, search/sharded.py, and compaction, indexer/compact.py, both start
from it), and the whole directory as one in-memory unsharded ``IndexDir`` (``read_sharded_plain``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from indexer.index import MODALITIES, IndexDir, Modality
from indexer.shards_index import ShardedDir, open_sharded, read_shard_data
from indexer.vector_index import IndexDirError


def merged_meta(metas: list[dict], rows: list[np.ndarray], n: int) -> dict:
    """The parent's metadata: each per-row list put back in parent row order, the rest from shard 0."""
    out: dict = {}
    for key, value in metas[0].items():
        if key == "parent_rows":
            continue
        if isinstance(value, list) and all(len(m.get(key) or ()) == len(r) for m, r in zip(metas, rows)):
            merged: list = [None] * n
            for m, r in zip(metas, rows):
                for row, v in zip(r.tolist(), m[key]):
                    merged[row] = v
            out[key] = merged
        else:
            out[key] = value
    return out


def read_sharded_plain(path: str | Path, *, verify: str = "counts") -> IndexDir:
    """A sharded directory read back as one unsharded ``IndexDir`` without search indexes: each side's
    exact vectors in parent row order (in memory) and its metadata merged — what compaction folds the
    item store's writes into before it shards the result again."""
    sd = open_sharded(path, verify=verify)
    data = [read_shard_data(sd, s, verify=verify) for s in range(len(sd.shard_paths))]
    sides = {}
    for m in MODALITIES:
        rows, n, dim, meta = parent_side(sd, data, m)
        vectors = np.zeros((n, dim), np.float32)
        for d, r in zip(data, rows):
            vectors[r] = d[m][0]
        sides[m] = Modality(None, vectors, meta)
    return IndexDir(sd.path, sd.manifest, sides["images"], sides["captions"])


def parent_side(sd: ShardedDir, data: list[dict], m: str) -> tuple[list[np.ndarray], int, int, dict]:
    """(each shard's parent rows, row count, dimension, merged metadata) of side ``m`` from the shards'
    ``read_shard_data``; IndexDirError unless the shards' rows cover the parent's once each."""
    rows = [np.asarray(d[m][1]["parent_rows"], np.int64) for d in data]
    n = int(sd.manifest["counts"][m])
    if sum(len(r) for r in rows) != n or (n and not np.array_equal(np.sort(np.concatenate(rows)), np.arange(n))):
        raise IndexDirError(f"{sd.path}: the shards' rows of {m} do not cover the index once each; rebuild it")
    dim = next((d[m][0].shape[1] for d in data if d[m][0].ndim == 2), 0)
    return rows, n, dim, merged_meta([d[m][1] for d in data], rows, n)
