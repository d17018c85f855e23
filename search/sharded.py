"""A sharded index served as one: fan a query out to the shards, merge their top k, flag what is missing.

``load_sharded(path, engine=…)`` reads a sharded index directory (indexer/shards_index.py) as an
``IndexDir`` whose sides look like any other to the code that ranks (search/ranking.py, the living
index's views in search/live_views.py): ``ShardedIndex`` is the search index (``ntotal``, ``dim``,
``search(queries, k)``), ``ShardVectors`` the exact vectors (each shard's ``.npy``, memory-mapped), the
metadata lists the parent's rows rebuilt from the shards'. Rows are the unsharded index's rows.

Where the shards' searchers run is the *engine*'s business: ``LocalShards`` holds them in this process
(a thread per shard); indexer/shards_ray.py holds each in Ray Serve replicas. An engine's ``submit(shard,
side, queries, k)`` returns something with ``result(timeout)`` giving (scores, parent rows), or raising
``ShardDown``. A shard that is down is left out of the answer and recorded in the request's
``missing_shards()`` collector (ranking marks the result ``partial``): a fault is an answer, not an error.

Each shard answers its exact (Flat: the memory-mapped vectors scanned; re-ranked indexes: its candidates
re-scored on them) top k; merged by score (ties: lower row first), the top k of the union is the
unsharded index's. By list, a query goes only to the shards owning the inverted lists it probes (the
shared coarse quantizer routes it); by id, to every shard.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.index import MODALITIES, IndexDir, Modality
from indexer.shards_index import ShardedDir, load_shard, open_sharded, read_shard_data
from indexer.shards_merge import parent_side
from indexer.shards_search import ShardDown, ShardSearcher
from search.live_views import top_rows, top_rows_batch

log = logging.getLogger(__name__)

__all__ = ["LocalShards", "ShardDown", "ShardSearcher", "ShardVectors", "ShardedIndex", "load_sharded", "missing_shards"]

_missing: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar("ltd_missing_shards", default=None)


@contextlib.contextmanager
def missing_shards() -> Iterator[set[int]]:
    """Collect the shards that gave no answer to the searches made inside the block (in this thread)."""
    found: set[int] = set()
    token = _missing.set(found)
    try:
        yield found
    finally:
        _missing.reset(token)


class _Done:
    def __init__(self, fn, *args):
        self._fn, self._args = fn, args

    def result(self, timeout: float | None = None):
        return self._fn(*self._args)


class LocalShards:
    """The shards' searchers in this process; a shard's searches run on its own thread (FAISS and numpy
    release the GIL). Nothing here fails over: a shard that cannot load fails the whole load."""

    def __init__(self, sd: ShardedDir, verify: str = "hash"):
        self.n = len(sd.shard_paths)
        self.searchers = [ShardSearcher(load_shard(sd, s, verify=verify, mmap=True)) for s in range(self.n)]
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.n), thread_name_prefix="ltd-shard")

    def submit(self, shard: int, side: str, queries: np.ndarray, k: int):
        """Start shard ``shard``'s search; ``result()`` of the return value gives (scores, parent rows)."""
        if self.n == 1:
            return _Done(self.searchers[0].search, side, queries, k)
        return self._pool.submit(self.searchers[shard].search, side, queries, k)

    def down(self) -> list[int]:
        """The shards with no live searcher (none, in one process)."""
        return []

    def close(self) -> None:
        """Stop the shard threads (searches in flight finish)."""
        self._pool.shutdown(wait=False)


class ShardVectors:
    """The exact vectors of a sharded side by parent row, (n, d) float32, indexable like an array."""

    def __init__(self, parts: list[np.ndarray], rows: list[np.ndarray], dim: int):
        self.parts = parts
        n = sum(len(r) for r in rows)
        self.shard_of = np.zeros(n, np.int32)
        self.local_of = np.zeros(n, np.int64)
        for s, r in enumerate(rows):
            self.shard_of[r], self.local_of[r] = s, np.arange(len(r))
        self.shape, self.ndim, self.dtype = (n, dim), 2, np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx):
        if isinstance(idx, (int, np.integer)):
            i = int(idx) + (self.shape[0] if idx < 0 else 0)
            return np.asarray(self.parts[self.shard_of[i]][self.local_of[i]], np.float32)
        rows = np.arange(self.shape[0])[idx]
        out = np.empty((len(rows), self.shape[1]), np.float32)
        shard = self.shard_of[rows]
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self.parts[s][self.local_of[rows[sel]]]
        return out

    def __array__(self, dtype=None, copy=None):
        out = self[np.arange(self.shape[0])]
        return out.astype(dtype) if dtype is not None else out

    def scores(self, q: np.ndarray) -> np.ndarray:
        """Inner products of every row with ``q``."""
        out = np.empty(self.shape[0], np.float32)
        for s, part in enumerate(self.parts):
            out[self.shard_of == s] = np.asarray(part, np.float32) @ q
        return out


@dataclass(frozen=True)
class ListRouting:
    """How a side sharded by inverted list routes a query: the shared coarse ``quantizer`` finds the lists
    it probes, ``owners`` (the shard of each list) the shards that hold them. A side sharded by id has
    none: every query visits every shard."""

    quantizer: Any
    owners: np.ndarray

    @classmethod
    def of(cls, sd: ShardedDir, side: str) -> ListRouting | None:
        """``side``'s routing as the sharded directory records it (None: sharded by id)."""
        quantizer, owners = sd.quantizer(side), sd.owners(side)
        return None if quantizer is None or owners is None else cls(quantizer, owners)


class ShardedIndex:
    """The search index of a sharded side (see the module doc); ``search`` as ``VectorIndex.search``."""

    def __init__(self, side: str, engine, spec: dict, n: int, dim: int, *, routing: ListRouting | None = None,
                 timeout: float | None = None):
        self.side, self.engine, self.spec, self._n, self._dim = side, engine, dict(spec), int(n), int(dim)
        self.routing, self.timeout = routing, timeout
        self.shards = int(engine.n)
        self.rerank = int(spec.get("rerank") or 0)
        self.factory = f"shards({self.shards}):{spec.get('factory', 'Flat')}"  # not "Flat": never ranked on the loop
        self.visits = [0, 0]  # (shard searches made, queries), for the benchmark's visits per query
        self._lock = threading.Lock()

    @property
    def ntotal(self) -> int:
        """Rows over all shards."""
        return self._n

    @property
    def dim(self) -> int:
        """The dimension of the vectors, every shard's."""
        return self._dim

    @property
    def nprobe(self) -> int | None:
        """The shards' IVF ``nprobe`` (the manifest's), None when not IVF."""
        return self.spec.get("nprobe")

    def describe(self) -> dict:
        """The shards' search parameters, as their manifest records them."""
        return dict(self.spec)

    def route(self, q: np.ndarray) -> list[np.ndarray]:
        """The shards each query visits: by list, the owners of the lists it probes; by id, all."""
        r = self.routing
        if r is None:
            return [np.arange(self.shards)] * len(q)
        _, lists = r.quantizer.search(q, int(min(self.nprobe or 1, len(r.owners))))
        return [np.unique(r.owners[lst[lst >= 0]]) for lst in lists]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, parent rows), each (n_queries, min(k, ntotal)), merged over the shards that answered;
        a shard that did not is added to the request's ``missing_shards()``."""
        q = np.ascontiguousarray(np.atleast_2d(queries), np.float32)
        k = max(1, min(int(k), max(1, self._n)))
        visits = self.route(q)
        asked: dict[int, list[int]] = {}
        for i, shards in enumerate(visits):
            for s in shards:
                asked.setdefault(int(s), []).append(i)
        pending = {s: self.engine.submit(s, self.side, q[qi], k) for s, qi in asked.items()}
        answers: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        down = []
        for s, fut in pending.items():
            try:
                answers[s] = fut.result(self.timeout)
            except ShardDown as e:
                log.warning("shard %d of %s: no answer (%s)", s, self.side, e)
                down.append(s)
        with self._lock:
            self.visits[0] += sum(len(v) for v in asked.values())
            self.visits[1] += len(q)
        found = _missing.get()
        if found is not None:
            found.update(down)
        return _merge(answers, asked, len(q), k)


def _merge(answers: dict[int, tuple[np.ndarray, np.ndarray]], asked: dict[int, list[int]], n: int,
           k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's top ``k`` over the shards' answers (``answers[s]``: shard ``s``'s rows for the queries
    ``asked[s]``, in that order). One array operation when every shard answered every query (by id, and
    by list when the probes span every shard); a loop over the queries otherwise."""
    if answers and all(len(asked[s]) == n for s in answers):
        return top_rows_batch(np.concatenate([answers[s][0] for s in answers], axis=1),
                              np.concatenate([answers[s][1] for s in answers], axis=1), k)
    parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n)]
    for s, (sc, rr) in answers.items():
        for j, i in enumerate(asked[s]):
            parts[i].append((sc[j], rr[j]))
    scores = np.full((n, k), -np.inf, np.float32)
    rows = np.full((n, k), -1, np.int64)
    for i, got in enumerate(parts):
        if not got:
            continue
        s = np.concatenate([g[0] for g in got])
        r = np.concatenate([g[1] for g in got])
        s, r = top_rows(s[r >= 0], r[r >= 0], k)
        scores[i, : len(s)], rows[i, : len(r)] = s, r
    return scores, rows


def load_sharded(path: str | Path, *, engine=LocalShards, checkpoint_sha256: str | None = None,
                 verify: str = "hash", timeout: float | None = None) -> IndexDir:
    """A sharded index directory as one ``IndexDir`` (module doc). ``engine(sharded_dir, verify)`` holds the
    shards' searchers (default: in this process); ``timeout``: seconds a shard may take to answer."""
    sd = open_sharded(path, checkpoint_sha256=checkpoint_sha256, verify=verify)
    data = [read_shard_data(sd, s, verify=verify) for s in range(len(sd.shard_paths))]
    eng = engine(sd, verify)
    sides = {}
    for m in MODALITIES:
        rows, n, dim, meta = parent_side(sd, data, m)  # IndexDirError (a ValueError) when they do not cover it
        spec = (sd.manifest.get("indexes") or {}).get(m) or {"factory": sd.manifest.get("factory", "Flat")}
        index = ShardedIndex(m, eng, spec, n, dim, routing=ListRouting.of(sd, m), timeout=timeout)
        sides[m] = Modality(index, ShardVectors([d[m][0] for d in data], rows, dim), meta)
    return IndexDir(sd.path, sd.manifest, sides["images"], sides["captions"])


def shard_engine_of(ix: IndexDir):
    """The engine serving a sharded ``ix``'s shards, else None."""
    index = getattr(ix.images.index, "base", ix.images.index)  # through a living index's view
    return getattr(index, "engine", None)
