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
from indexer.metrics import MetricsSpec, query_metrics
from search import paging
from search.paging import Page
from search.results import CompareResult, CutoffMetrics, Direction, Hit, QueryInfo, QueryMetrics, SearchResult
from search.sharded import missing_shards


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
    (``ndcg_relevance`` says which). Rows scored −inf are no candidates (removed, or outside a filter):
    they count in no cut-off and carry no relevance."""
    candidate = np.isfinite(scores_all)
    n = int(candidate.sum())
    pos = [np.asarray(gt, dtype=np.int64)]
    if rel_row is None:
        rel, kind = np.zeros(len(scores_all), dtype=np.float32), "binary"
        rel[pos[0]] = 1.0
    else:
        rel, kind = np.where(candidate, rel_row, 0.0).astype(np.float32), "rougeL"
    kk, p5, n25 = min(k, n), min(5, n), min(25, n)

    def run(p_at: int, ndcg_k: int) -> dict:
        return query_metrics(scores_all[None, :], pos, relevance=rel[None, :], spec=MetricsSpec(p_at=p_at, ndcg_k=ndcg_k))

    m = run(kk, kk)
    at_k = QueryMetrics(first_gt_rank=int(m["first_rank"][0]), k=kk, precision_at_k=float(m[f"p@{kk}"][0]),
                        ndcg_at_k=float(m[f"ndcg@{kk}"][0]), ndcg_relevance=kind)
    if (p5, n25) != (kk, kk):
        m = run(p5, n25)
    return at_k, CutoffMetrics(p_at=p5, precision=float(m[f"p@{p5}"][0]), ndcg_at=n25, ndcg=float(m[f"ndcg@{n25}"][0]))


@dataclass(frozen=True)
class RankRequest:
    """One ranking as a search asks for it (search/service.py, search/queries.py): the number of hits
    ``k``, the kind of search (``direction``, which also names the ranking in its cursors), when the
    request began (``t0``, for the reported time), the metadata ``filter`` it is within and the
    ``cursor`` of the page it continues (None: the first page)."""

    k: int
    direction: Direction
    t0: float
    filter: dict | None = None
    cursor: str | None = None


def rank(model: str, side: Modality, query: Query, hit_fields, req: RankRequest, *,
         allowed: np.ndarray | None = None, generation: int = 0) -> SearchResult:
    """Top-``req.k`` rows of ``side`` for ``query``; ``hit_fields(row)`` gives each hit's descriptive
    fields. ``allowed``: a mask over the side's rows (``req.filter``'s), only those are ranked; the page
    continued is ``req.cursor``'s (search/paging.py), and the next page's cursor names this ranking."""
    k, direction, t0 = req.k, req.direction, req.t0
    key = paging.query_key(direction, query.info, req.filter)
    page = paging.decode(req.cursor, key, k)
    depth = (page.offset if page else 0) + k
    ids = side.meta["ids"]
    want = depth + 1  # one more than needed: is there a next page?
    with missing_shards() as missing:  # a sharded index's shards that gave no answer (search/sharded.py)
        got, pairs = _ranked(side, query, k, want, allowed, ids, page)
    row_of = {int(ids[r]): r for _, r in got}
    gt = query.ground_truth
    gt_set = set(gt) if gt is not None else None
    rel = query.relevance
    if rel is not None and len(rel) < len(ids):  # rows added since `ltd eval` cached the relevance: none known
        rel = np.concatenate([rel, np.zeros(len(ids) - len(rel), np.float32)])
    start = page.offset if page else 0
    hits = [Hit(rank=start + n + 1, id=i, score=sc, ground_truth=(row_of[i] in gt_set) if gt_set is not None else None,
                relevance=None if rel is None else float(rel[row_of[i]]), **hit_fields(row_of[i]))
            for n, (sc, i) in enumerate(pairs[:k])]
    cursor = None
    if len(pairs) > k and hits and start + 2 * k <= paging.MAX_DEPTH:
        cursor = paging.encode(paging.Page(start + len(hits), hits[-1].score, hits[-1].id, generation, key))
    metrics = cutoffs = None
    if gt:
        scores_all = side.vectors.scores(query.vector) if hasattr(side.vectors, "scores") else \
            np.asarray(side.vectors) @ query.vector
        dead = getattr(side.index, "dead", None)
        if dead is not None and dead.any():
            scores_all = np.where(dead, -np.inf, scores_all)  # removed items rank nowhere
        inside = gt
        if allowed is not None:  # a filter: the metrics of the ranking shown, among the items it keeps
            keep = np.asarray(allowed, bool)
            scores_all = np.where(keep, scores_all, -np.inf)
            inside = [g for g in gt if keep[g]]
        if inside:  # none when every ground-truth item lies outside the filter
            metrics, cutoffs = gt_metrics(inside, rel, k, scores_all)
    gt_ids = [int(ids[g]) for g in gt] if gt else None
    return SearchResult(model, direction, query.info, hits, gt_ids, metrics, cutoffs,
                        (time.perf_counter() - t0) * 1000, next_cursor=cursor, generation=generation,
                        partial=bool(missing), missing_shards=sorted(missing) or None)


def _ranked(side: Modality, query: Query, k: int, want: int, allowed, ids, page: Page | None) -> tuple[list, list]:
    """(scored rows, (score, id) pairs after ``page``), searched deeper while items added above the cursor
    since push the page's hits down."""
    while True:
        scores, rows = side.index.search(query.vector[None, :], want, allowed)
        got = [(float(sc), int(r)) for sc, r in zip(scores[0], rows[0]) if r >= 0]
        pairs = paging.after([(sc, int(ids[r])) for sc, r in got], page)
        if len(pairs) > k or len(got) < want or want >= paging.MAX_DEPTH + 1:
            return got, pairs
        want = min(2 * want, paging.MAX_DEPTH + 1)  # items added above the cursor since: look deeper


def compare_results(direction: Direction, k: int, results: list[SearchResult]) -> CompareResult:
    """Two models' results for one query as a ``CompareResult``: the ids both ranked in the top k."""
    a, b = ({h.id for h in r.hits} for r in results)
    return CompareResult(direction, k, results, sorted(a & b))
