"""Reference implementations of the retrieval metrics: one query at a time, a stable full argsort,
the definitions written out. Slow on purpose; the tests and bench/eval_speed.py check the vectorised
indexer/metrics.py against them."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from indexer.metrics import RECALL_KS, _check_inputs, _gains


def reference_query_metrics(
    scores: np.ndarray,
    positives: Sequence[np.ndarray],
    *,
    relevance: np.ndarray | None = None,
    ks: Sequence[int] = RECALL_KS,
    p_at: int = 5,
    ndcg_k: int = 25,
    gain: str = "exponential",
) -> dict[str, np.ndarray]:
    """``query_metrics`` as a plain per-query loop over a stable argsort (slow; for checking)."""
    scores = np.asarray(scores)
    n_q, n = scores.shape
    out: dict[str, list[float]] = {"first_rank": [], "rprec": [], f"p@{p_at}": []}
    out.update({f"hit@{k}": [] for k in ks})
    if relevance is not None:
        out[f"ndcg@{ndcg_k}"] = []
    for q in range(n_q):
        order = np.argsort(-scores[q].astype(np.float64), kind="stable")
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(1, n + 1)
        pos = np.unique(np.asarray(positives[q], dtype=np.int64))
        if pos.size:
            first = rank[pos].min()
            out["first_rank"].append(float(first))
            out["rprec"].append(np.count_nonzero(rank[pos] <= pos.size) / pos.size)
            out[f"p@{p_at}"].append(np.count_nonzero(rank[pos] <= p_at) / p_at)
            for k in ks:
                out[f"hit@{k}"].append(float(first <= k))
        else:
            for key in ["first_rank", "rprec", f"p@{p_at}", *(f"hit@{k}" for k in ks)]:
                out[key].append(np.nan)
        if relevance is not None:
            rel = np.asarray(relevance[q], dtype=np.float64)
            disc = 1.0 / np.log2(np.arange(2, min(ndcg_k, n) + 2))
            dcg = np.sum(_gains(rel[order[:ndcg_k]], gain) * disc)
            idcg = np.sum(_gains(np.sort(rel)[::-1][:ndcg_k], gain) * disc)
            out[f"ndcg@{ndcg_k}"].append(dcg / idcg if idcg > 0 else 0.0)
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def reference_retrieval_metrics(
    sims: np.ndarray,
    caption_to_image: np.ndarray,
    *,
    i2t_positives: Sequence[np.ndarray] | None = None,
    t2i_positives: Sequence[np.ndarray] | None = None,
    relevance: np.ndarray | None = None,
    relevance_name: str = "rougeL",
    ndcg_k: int = 25,
    chunk: int | None = None,
) -> dict[str, float]:
    """``retrieval_metrics`` written as the obvious per-query loop (slow; tests and benchmark)."""
    del chunk  # same signature as retrieval_metrics; the loop needs no chunking
    sims = np.asarray(sims)
    c2i = np.asarray(caption_to_image, dtype=np.int64)
    _check_inputs(sims, c2i, relevance)
    n_img, n_cap = sims.shape
    i2t_pos = [np.flatnonzero(c2i == i) for i in range(n_img)]
    if i2t_positives is not None:
        i2t_pos = [np.concatenate([p, np.asarray(e, dtype=np.int64)]) for p, e in zip(i2t_pos, i2t_positives)]
    t2i_pos = [np.array([c2i[j]]) for j in range(n_cap)]
    if t2i_positives is not None:
        t2i_pos = [np.concatenate([p, np.asarray(e, dtype=np.int64)]) for p, e in zip(t2i_pos, t2i_positives)]
    rel = None if relevance is None else np.asarray(relevance)
    i2t = reference_query_metrics(sims, i2t_pos, relevance=None if rel is None else rel.T, ndcg_k=ndcg_k)
    t2i = reference_query_metrics(sims.T, t2i_pos, relevance=rel, ndcg_k=ndcg_k)
    recall: dict[str, float] = {}
    rest: dict[str, float] = {}
    for prefix, m in (("i2t", i2t), ("t2i", t2i)):
        ok = ~np.isnan(m["first_rank"])
        ranks = m["first_rank"][ok]
        for k in RECALL_KS:
            recall[f"{prefix}_R@{k}"] = 100.0 * np.count_nonzero(ranks <= k) / ranks.size
        rest[f"{prefix}_medr"] = float(np.floor(np.median(ranks)))
        rest[f"{prefix}_meanr"] = float(ranks.mean())
        rest[f"{prefix}_R-P"] = 100.0 * float(m["rprec"][ok].mean())
        if rel is not None:
            rest[f"{prefix}_nDCG@{ndcg_k}_{relevance_name}"] = float(m[f"ndcg@{ndcg_k}"].mean())
    report = {**recall, "rsum": float(sum(recall.values())), **rest}
    report["n_images"], report["n_captions"] = n_img, n_cap
    return report
