"""Choosing the search index: tuned to a target (``auto``), or by the corpus size alone (``fixed``).

``--factory auto`` (``build_vector_index(vectors, "auto")``, or ``"auto:recall=R,memory=BYTES,ms=T"``
from ``ltd index --recall R --max-memory M --max-query-ms T``): the fastest index that reaches
recall@10 ≥ R (default 0.99) against exact search within the memory and time limits, measured on
held-out queries drawn from the corpus (``indexer/tune.py``).

``--factory fixed``, the rule ``auto`` was before it measured anything:

- up to ``FLAT_MAX`` vectors: ``Flat`` (exact; 200,000 × 1024-d float32 is 0.8 GB and a query
  scans it in tens of milliseconds on 2 cores);
- above: ``IVF{nlist},PQ{m}`` with ``nlist`` ≈ 2·√n (a power of two: a few hundred vectors per
  list), ``m`` = d/8 sub-quantizers of 8 bits (d/8 bytes per vector, 32 B at d = 256), trained on a
  sample of ``max(100k, 64·nlist)`` vectors; searched with ``nprobe`` = nlist/32 lists and the top
  ``k × RERANK`` candidates re-scored on the exact vectors (memory-mapped ``.npy``). The PQ codes
  and lists are what must fit in RAM (≈ (m + 8) bytes per vector: 40 MB per million at d = 256);
  the exact vectors are read from disk only for the candidates.

Its recall target was 0.95; on the 1,000,000 × 256 clustered benchmark of ``bench/ann_index.py``
(BENCHMARKS.md, "A million-vector index") it reached 0.995, on 210,000 (just above ``FLAT_MAX``) 0.976.
``ltd eval`` reports the recall of every approximate index on its own data (``index_recall@10``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from indexer.tune import parse_auto, tune_index
from indexer.vector_index import IndexDirError, VectorIndex

FLAT_MAX = 200_000
RERANK = 10


@dataclass(frozen=True)
class IndexPlan:
    factory: str
    nprobe: int | None = None
    rerank: int = 0
    train_size: int = 100_000


def _pow2(x: float) -> int:
    return 1 << max(0, round(math.log2(max(1.0, x))))


def choose_index(n: int, d: int) -> IndexPlan:
    """The index ``fixed`` builds for ``n`` vectors of dimension ``d`` (module doc)."""
    if n <= FLAT_MAX:
        return IndexPlan("Flat")
    nlist = _pow2(2 * math.sqrt(n))
    m = next(m for m in (d // 8, d // 4, d // 2, d) if m >= 1 and d % m == 0)
    return IndexPlan(f"IVF{nlist},PQ{m}", nprobe=max(8, nlist // 32), rerank=RERANK,
                     train_size=min(n, max(100_000, 64 * nlist)))


def plan_for(factory: str, n: int, d: int) -> IndexPlan:
    """``fixed`` → ``choose_index``; any other factory string is built as given (FAISS defaults tuned by
    ``vector_index._tune``); an empty corpus stays an (empty) exact index."""
    if n == 0:
        return IndexPlan("Flat")
    if factory == "fixed":
        return choose_index(n, d)
    return IndexPlan(factory)


def build_vector_index(vectors: np.ndarray, factory: str = "Flat", *, seed: int = 0) -> VectorIndex:
    """The search index over ``vectors`` that ``factory`` names (module doc)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise IndexDirError(f"expected (n, d) vectors, got shape {vectors.shape}")
    target = parse_auto(factory)
    if target is not None and len(vectors):
        return tune_index(vectors, target, seed=seed)
    plan = plan_for("Flat" if target is not None else factory, len(vectors), vectors.shape[1])
    return VectorIndex.build(vectors, plan.factory, train_size=plan.train_size, seed=seed, nprobe=plan.nprobe,
                             rerank=plan.rerank)
