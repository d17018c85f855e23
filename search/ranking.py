"""Ranking: FAISS search over one side of an index, with one result builder for both directions.

A query is an embedding plus, when it is a dataset item, its ground truth (the rows it should
retrieve) and its graded relevance (ROUGE-L, when the index has it cached). ``rank`` returns the
top-k hits with those attached and the query's metrics (rank of the first ground-truth item, P@k,
nDCG@k, and the report's fixed cut-offs P@5 / nDCG@25), computed over the whole corpus.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from indexer.index import Modality
from indexer.metrics import query_metrics
from search.results import CompareResult, CutoffMetrics, Direction, Hit, QueryInfo, QueryMetrics, SearchResult


@dataclass
class Query:
    """What to rank against: the embedding, and for dataset items their ground truth (rows)."""

    vector: np.ndarray
    info: QueryInfo
    ground_truth: list[int] | None = None  # rows of the searched side; None = unknown (free query)
    relevance: np.ndarray | None = None  # graded relevance of every row of the searched side


def gt_metrics(gt: list[int], rel_row: np.ndarray | None, k: int,
               scores_all: np.ndarray) -> tuple[QueryMetrics, CutoffMetrics]:
    """Rank of the first ground-truth item, P@k and nDCG@k at the requested k, and P@5 / nDCG@25 at the
    report's fixed cut-offs. nDCG uses the graded relevance when given, binary ground truth otherwise
    (``ndcg_relevance`` says which)."""
    n = len(scores_all)
    pos = [np.asarray(gt, dtype=np.int64)]
    if rel_row is None:
        rel, kind = np.zeros(n, dtype=np.float32), "binary"
        rel[pos[0]] = 1.0
    else:
        rel, kind = rel_row, "rougeL"
    kk, p5, n25 = min(k, n), min(5, n), min(25, n)

    def run(p_at: int, ndcg_k: int) -> dict:
        return query_metrics(scores_all[None, :], pos, relevance=rel[None, :], p_at=p_at, ndcg_k=ndcg_k)

    m = run(kk, kk)
    at_k = QueryMetrics(first_gt_rank=int(m["first_rank"][0]), k=kk, precision_at_k=float(m[f"p@{kk}"][0]),
                        ndcg_at_k=float(m[f"ndcg@{kk}"][0]), ndcg_relevance=kind)
    if (p5, n25) != (kk, kk):
        m = run(p5, n25)
    return at_k, CutoffMetrics(p_at=p5, precision=float(m[f"p@{p5}"][0]), ndcg_at=n25, ndcg=float(m[f"ndcg@{n25}"][0]))


def rank(model: str, side: Modality, query: Query, k: int, hit_fields, *, direction: Direction,
         t0: float) -> SearchResult:
    """Top-k rows of ``side`` for ``query``; ``hit_fields(row)`` gives each hit's descriptive fields."""
    scores, ids = side.index.search(query.vector[None, :], k)
    gt = query.ground_truth
    gt_set = set(gt) if gt is not None else None
    rel = query.relevance
    hits = [Hit(rank=r + 1, id=int(side.meta["ids"][p]), score=float(scores[0][r]),
                ground_truth=(p in gt_set) if gt_set is not None else None,
                relevance=None if rel is None else float(rel[p]), **hit_fields(p))
            for r, p in enumerate(int(i) for i in ids[0] if i >= 0)]
    metrics = cutoffs = None
    if gt:
        metrics, cutoffs = gt_metrics(gt, rel, k, np.asarray(side.vectors) @ query.vector)
    gt_ids = [int(side.meta["ids"][g]) for g in gt] if gt else None
    return SearchResult(model, direction, query.info, hits, gt_ids, metrics, cutoffs,
                        (time.perf_counter() - t0) * 1000)


def compare_results(direction: Direction, k: int, results: list[SearchResult]) -> CompareResult:
    a, b = ({h.id for h in r.hits} for r in results)
    return CompareResult(direction, k, results, sorted(a & b))
