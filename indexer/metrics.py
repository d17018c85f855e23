"""Retrieval metrics (R@k, median/mean rank, R-precision, nDCG) as chunked, vectorised numpy.

Conventions shared by every function here:

- ``sims`` has shape ``(n_images, n_captions)``; higher means more similar.
- Ranks are 1-based. Ties are broken deterministically: among equal scores the item with the
  smaller index ranks first (a stable sort by descending score).
- Queries without any positive get ``nan`` in every positive-based per-query array
  (``first_rank``, ``hit@k``, ``rprec``, ``p@k``); aggregates use ``nanmean``/``nanmedian`` and so
  ignore them (as trec_eval skips queries without relevant documents). nDCG needs no positives.
- Recall and R-precision reports are percentages (0-100); nDCG is in [0, 1].

``reference_retrieval_metrics`` is the same report written as the obvious per-query loop over
``np.argsort(kind="stable")``; the tests check the fast path against it and against pytrec_eval.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

# Rows per chunk are chosen so that one (chunk, n_items) int64 temporary is about this size; the
# peak over all temporaries of a chunk stays around 5x this (well under 1 GB).
CHUNK_BYTES = 128 << 20
RECALL_KS = (1, 5, 10)
# The report's headline keys, in the order tables show them (report.json has more: medr, meanr, counts).
RECALL_KEYS = [f"{d}_R@{k}" for d in ("i2t", "t2i") for k in RECALL_KS]
REPORT_KEYS = [*RECALL_KEYS, "rsum", "i2t_R-P", "t2i_R-P"]


@dataclass(frozen=True)
class MetricsSpec:
    """Which per-query metrics :func:`query_metrics` computes, and how: ``hit@k`` for each of ``ks``,
    ``p@{p_at}``, ``ndcg@{ndcg_k}`` with ``gain`` (``"exponential"``, 2^rel - 1 as TERN, or ``"linear"``,
    rel as trec_eval), over ``chunk`` query rows at a time (None: sized so temporaries stay ~128 MB each)."""

    ks: Sequence[int] = RECALL_KS
    p_at: int = 5
    ndcg_k: int = 25
    gain: str = "exponential"
    chunk: int | None = None


@dataclass(frozen=True)
class ExtraPositives:
    """Positives beyond each caption's own image, for :func:`retrieval_metrics` (e.g. CxC's): ``i2t`` per
    image (caption indices), ``t2i`` per caption (image indices); None: none on that side."""

    i2t: Sequence[np.ndarray] | None = None
    t2i: Sequence[np.ndarray] | None = None


def ndcg_key(direction: str, k: int = 25, relevance: str = "rougeL") -> str:
    """The report key of nDCG@k with a graded relevance, e.g. ``t2i_nDCG@25_rougeL``."""
    return f"{direction}_nDCG@{k}_{relevance}"


def _auto_chunk(n_items: int, chunk: int | None) -> int:
    if chunk is not None:
        return max(1, int(chunk))
    return max(1, CHUNK_BYTES // (8 * max(n_items, 1)))


def _gains(rel: np.ndarray, gain: str) -> np.ndarray:
    if gain == "exponential":
        return np.exp2(rel) - 1.0
    if gain == "linear":
        return rel
    raise ValueError(f"gain must be 'exponential' or 'linear', got {gain!r}")


def _discounts(k: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))


def _topk_exact_fallback(block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by argpartition, repairing rows whose k-th value is tied beyond the cut."""
    n = block.shape[1]
    part = np.argpartition(block, n - k, axis=1)[:, n - k :]
    vals = np.take_along_axis(block, part, axis=1)
    # The partition holds every item above the k-th value tau plus *some* items equal to tau;
    # where it left one out it may have kept larger indices than the tie rule allows.
    tau = vals.min(axis=1, keepdims=True)
    bad = np.flatnonzero(np.count_nonzero(block == tau, axis=1) > np.count_nonzero(vals == tau, axis=1))
    if bad.size:
        sub, t = block[bad], tau[bad]
        eq = sub == t
        need = k - np.count_nonzero(sub > t, axis=1)
        keep = (sub > t) | (eq & (np.cumsum(eq, axis=1) <= need[:, None]))
        part[bad] = np.nonzero(keep)[1].reshape(bad.size, k)
    part.sort(axis=1)
    vals = np.take_along_axis(block, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


def _topk_block(block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of each row of a C-contiguous float block, sorted by (score desc, index asc)."""
    c, n = block.shape
    if k >= n or n < 8 * k:
        idx = np.argsort(-block, axis=1, kind="stable")[:, :k]
        return idx, np.take_along_axis(block, idx, axis=1)
    # Lower bound on each row's k-th largest value: the smallest of the maxima of k disjoint
    # segments (k distinct items are >= it). Only the few items above it are sorted.
    seg = n // k
    lower = np.maximum.reduceat(block, np.arange(k) * seg, axis=1).min(axis=1)
    flat = np.flatnonzero(block >= lower[:, None])
    rows, cols = np.divmod(flat, n)
    counts = np.bincount(rows, minlength=c)
    width = int(counts.max())
    if width > 32 * k:  # heavy ties at the bound: sorting the candidates would not pay
        return _topk_exact_fallback(block, k)
    # Candidates, padded per row (flatnonzero keeps each row's columns ascending, so a stable
    # sort by descending score breaks ties by index; padding sorts last).
    slot = np.arange(flat.size) - (np.cumsum(counts) - counts)[rows]
    pad_vals = np.full((c, width), -np.inf, dtype=block.dtype)
    pad_vals[rows, slot] = block.reshape(-1)[flat]
    pad_cols = np.zeros((c, width), dtype=np.int64)
    pad_cols[rows, slot] = cols
    order = np.argsort(-pad_vals, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(pad_cols, order, axis=1), np.take_along_axis(pad_vals, order, axis=1)


def topk(scores: np.ndarray, k: int, chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k items of every row, best first, ties to the smaller index.

    Returns
    -------
    (indices, scores): int64 and float arrays of shape (n_queries, min(k, n_items)); integer
    scores are compared as float64. NaN scores are not supported.
    """
    scores = np.asarray(scores)
    if not np.issubdtype(scores.dtype, np.floating):
        scores = scores.astype(np.float64)
    n_q, n = scores.shape
    k = min(int(k), n)
    step = _auto_chunk(n, chunk)
    idx = np.empty((n_q, k), dtype=np.int64)
    vals = np.empty((n_q, k), dtype=scores.dtype)
    for a in range(0, n_q, step):
        idx[a : a + step], vals[a : a + step] = _topk_block(
            np.ascontiguousarray(scores[a : a + step]), k
        )
    return idx, vals


def ranks_of(scores_row: np.ndarray, items: np.ndarray) -> np.ndarray:
    """1-based ranks of ``items`` in one score row (ties to the smaller index)."""
    row = np.asarray(scores_row)
    items = np.asarray(items, dtype=np.int64)
    s = row[items][:, None]
    before = np.arange(row.shape[0])[None, :] < items[:, None]
    return 1 + np.count_nonzero((row[None, :] > s) | ((row[None, :] == s) & before), axis=1)


def _flatten_positives(positives: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter((len(p) for p in positives), dtype=np.int64, count=len(positives))
    items = (
        np.concatenate([np.asarray(p, dtype=np.int64).ravel() for p in positives])
        if lens.sum()
        else np.zeros(0, dtype=np.int64)
    )
    return np.repeat(np.arange(len(positives), dtype=np.int64), lens), items


def _positive_keys(rows: np.ndarray, items: np.ndarray, n_items: int) -> np.ndarray:
    """Sorted, de-duplicated ``row * n_items + item`` keys (a CSR of positives, rows in order)."""
    if items.size and (items.min() < 0 or items.max() >= n_items):
        raise ValueError(f"positive item index out of range [0, {n_items})")
    return np.unique(rows * n_items + items)


def _first_ranks(block: np.ndarray, rows: np.ndarray, items: np.ndarray) -> np.ndarray:
    """1-based rank of each row's best-ranked positive (rows without positives: garbage)."""
    c, n = block.shape
    # Best-ranked positive: highest score, smallest index among equal scores.
    pv = block[rows, items]
    best = np.full(c, -np.inf, dtype=block.dtype)
    np.maximum.at(best, rows, pv)
    pstar = np.full(c, n, dtype=np.int64)
    at_best = pv == best[rows]
    np.minimum.at(pstar, rows[at_best], items[at_best])
    gt = np.count_nonzero(block > best[:, None], axis=1)
    ge = np.count_nonzero(block >= best[:, None], axis=1)
    first = 1.0 + gt
    tied = np.flatnonzero(ge - gt > 1)  # other items share the best positive's score
    if tied.size:
        before = np.arange(n)[None, :] < pstar[tied, None]
        first[tied] += np.count_nonzero((block[tied] == best[tied, None]) & before, axis=1)
    return first


def _top_values(block: np.ndarray, k: int) -> np.ndarray:
    """The k largest values of each row, descending, float64 (ties need no index order here)."""
    n = block.shape[1]
    top = block if k >= n else np.partition(block, n - k, axis=1)[:, n - k :]
    return -np.sort(-top.astype(np.float64), axis=1)


def _ndcg(rel: np.ndarray, ranked: np.ndarray, gain: str) -> np.ndarray:
    """nDCG of the ranked item lists (rows of ``ranked``) under graded relevance rows ``rel``."""
    if not np.issubdtype(rel.dtype, np.floating):
        rel = rel.astype(np.float64)
    k = ranked.shape[1]
    disc = _discounts(k)
    # Row-wise sums, not ``@ disc``: BLAS picks kernels by matrix shape, so a matrix-vector product can
    # round a row differently depending on how many rows share the call, i.e. on the chunk size.
    dcg = np.sum(_gains(np.take_along_axis(rel, ranked, axis=1).astype(np.float64), gain) * disc, axis=1)
    idcg = np.sum(_gains(_top_values(rel, k), gain) * disc, axis=1)
    return np.where(idcg > 0, dcg / np.where(idcg > 0, idcg, 1.0), 0.0)


def _metrics_from_keys(scores: np.ndarray, keys: np.ndarray, *, relevance: np.ndarray | None,
                       spec: MetricsSpec) -> dict[str, np.ndarray]:
    ks, p_at, ndcg_k, gain = spec.ks, spec.p_at, spec.ndcg_k, spec.gain
    n_q, n = scores.shape
    n_pos = np.bincount(keys // n, minlength=n_q) if n else np.zeros(n_q, dtype=np.int64)
    k_top = min(n, max(max(ks), p_at, ndcg_k if relevance is not None else 0, int(n_pos.max(initial=0))))
    kd = min(ndcg_k, n)
    out = {"first_rank": np.full(n_q, np.nan), "rprec": np.full(n_q, np.nan)}
    out.update({f"hit@{k}": np.full(n_q, np.nan) for k in ks})
    out[f"p@{p_at}"] = np.full(n_q, np.nan)
    if relevance is not None:
        out[f"ndcg@{ndcg_k}"] = np.zeros(n_q)
    step = _auto_chunk(n, spec.chunk)
    for a in range(0, n_q, step):
        b = min(a + step, n_q)
        block = np.ascontiguousarray(scores[a:b])
        if not np.issubdtype(block.dtype, np.floating):
            block = block.astype(np.float64)
        c = b - a
        lo, hi = np.searchsorted(keys, [a * n, b * n])
        rows, items = np.divmod(keys[lo:hi], n)
        rows -= a
        has = n_pos[a:b] > 0
        first = _first_ranks(block, rows, items)
        first[~has] = np.nan
        out["first_rank"][a:b] = first
        for k in ks:
            out[f"hit@{k}"][a:b] = np.where(has, first <= k, np.nan)

        idx, _ = _topk_block(block, k_top)
        q = (np.arange(a, b, dtype=np.int64)[:, None] * n + idx).ravel()
        pos = np.searchsorted(keys, q)
        if keys.size:
            is_pos = (keys[np.minimum(pos, keys.size - 1)] == q).reshape(c, k_top)
        else:
            is_pos = np.zeros((c, k_top), dtype=bool)
        cum = np.cumsum(is_pos, axis=1)
        r = n_pos[a:b]
        rp = cum[np.arange(c), np.maximum(r, 1) - 1] / np.maximum(r, 1)
        out["rprec"][a:b] = np.where(has, rp, np.nan)
        hits_p = cum[:, min(p_at, k_top) - 1] if k_top else np.zeros(c)
        out[f"p@{p_at}"][a:b] = np.where(has, hits_p / p_at, np.nan)

        if relevance is not None and kd:
            out[f"ndcg@{ndcg_k}"][a:b] = _ndcg(np.ascontiguousarray(relevance[a:b]), idx[:, :kd], gain)
    return out


def query_metrics(
    scores: np.ndarray,
    positives: Sequence[np.ndarray],
    *,
    relevance: np.ndarray | None = None,
    spec: MetricsSpec | None = None,
) -> dict[str, np.ndarray]:
    """Per-query metrics of a (n_queries, n_items) score matrix.

    Parameters
    ----------
    scores: higher is better. positives: per query, the positive item indices (duplicates allowed).
    relevance: optional graded relevance >= 0, same shape as ``scores`` (adds ``ndcg@{ndcg_k}``).
    spec: which metrics, nDCG's gain and the chunk size (:class:`MetricsSpec`; None: its defaults).

    Returns
    -------
    float64 arrays of length n_queries: ``first_rank`` (1-based rank of the best-ranked positive),
    ``hit@{k}`` (0/1), ``rprec`` and ``p@{p_at}`` (fractions) -- all ``nan`` for queries without
    positives -- and ``ndcg@{ndcg_k}`` (0 where the ideal DCG is 0).
    """
    scores = np.asarray(scores)
    if scores.ndim != 2 or len(positives) != scores.shape[0]:
        raise ValueError(f"scores {scores.shape} needs one positive list per row, got {len(positives)}")
    if relevance is not None and np.shape(relevance) != scores.shape:
        raise ValueError(f"relevance shape {np.shape(relevance)} != scores shape {scores.shape}")
    rows, items = _flatten_positives(positives)
    keys = _positive_keys(rows, items, scores.shape[1])
    return _metrics_from_keys(scores, keys, relevance=relevance, spec=spec or MetricsSpec())


def _check_inputs(sims: np.ndarray, caption_to_image: np.ndarray, relevance: np.ndarray | None) -> None:
    if sims.ndim != 2 or caption_to_image.shape != (sims.shape[1],):
        raise ValueError(f"sims {sims.shape} needs caption_to_image of shape ({sims.shape[1]},)")
    if caption_to_image.size and (caption_to_image.min() < 0 or caption_to_image.max() >= sims.shape[0]):
        raise ValueError("caption_to_image has an image index out of range")
    if relevance is not None and np.shape(relevance) != (sims.shape[1], sims.shape[0]):
        raise ValueError(f"relevance must be (n_captions, n_images) = {sims.shape[::-1]}")


def _extra(rows: np.ndarray, items: np.ndarray, extra: Sequence[np.ndarray] | None, n: int):
    if extra is None:
        return rows, items
    if len(extra) != n:
        raise ValueError(f"expected {n} extra positive lists, got {len(extra)}")
    er, ei = _flatten_positives(extra)
    return np.concatenate([rows, er]), np.concatenate([items, ei])


def _summarise(prefix: str, m: dict[str, np.ndarray], ndcg_k: int, name: str) -> dict[str, float]:
    first = m["first_rank"]
    out = {f"{prefix}_R@{k}": 100.0 * float(np.nanmean(m[f"hit@{k}"])) for k in RECALL_KS}
    # VSE++/SCAN report floor(median(0-based rank)) + 1, i.e. floor(median(1-based rank)).
    out[f"{prefix}_medr"] = float(np.floor(np.nanmedian(first)))
    out[f"{prefix}_meanr"] = float(np.nanmean(first))
    out[f"{prefix}_R-P"] = 100.0 * float(np.nanmean(m["rprec"]))
    if f"ndcg@{ndcg_k}" in m:
        out[f"{prefix}_nDCG@{ndcg_k}_{name}"] = float(np.mean(m[f"ndcg@{ndcg_k}"]))
    return out


def _report(i2t: dict[str, float], t2i: dict[str, float], n_img: int, n_cap: int) -> dict[str, float]:
    out = {**{k: v for k, v in i2t.items() if "_R@" in k}, **{k: v for k, v in t2i.items() if "_R@" in k}}
    out["rsum"] = float(sum(out.values()))
    for d in (i2t, t2i):
        out.update({k: v for k, v in d.items() if "_R@" not in k})
    out["n_images"], out["n_captions"] = n_img, n_cap
    return out


def retrieval_metrics(
    sims: np.ndarray,
    caption_to_image: np.ndarray,
    *,
    extra: ExtraPositives | None = None,
    relevance: np.ndarray | None = None,
    relevance_name: str = "rougeL",
    ndcg_k: int = 25,
    chunk: int | None = None,
) -> dict[str, float]:
    """The standard image-caption retrieval report.

    Parameters
    ----------
    sims: (n_images, n_captions) similarities. caption_to_image: (n_captions,) image of each caption.
    extra: optional extra positives per image / per caption (e.g. CxC; :class:`ExtraPositives`).
    relevance: optional (n_captions, n_images) graded relevance (TERN layout); t2i uses its rows,
        i2t its columns (relevance of caption j to image query i is ``relevance[j, i]``).

    Returns
    -------
    ``{i2t,t2i}_R@{1,5,10}`` and ``{i2t,t2i}_R-P`` (%), ``rsum``, ``{i2t,t2i}_{medr,meanr}``,
    ``{i2t,t2i}_nDCG@{ndcg_k}_{relevance_name}`` when relevance is given, ``n_images``, ``n_captions``.
    i2t R@k counts a hit when the best-ranked of the image's positives is within the top k; medr
    is floor(median rank), the VSE++/SCAN convention. chunk: query rows per chunk (default: auto).
    """
    extra = extra or ExtraPositives()
    i2t, t2i = retrieval_query_metrics(sims, caption_to_image, i2t_positives=extra.i2t, t2i_positives=extra.t2i,
                                       relevance=relevance, ndcg_k=ndcg_k, chunk=chunk)
    i2t_report = _summarise("i2t", i2t, ndcg_k, relevance_name)
    return _report(i2t_report, _summarise("t2i", t2i, ndcg_k, relevance_name), *np.shape(sims))


def retrieval_query_metrics(
    sims: np.ndarray,
    caption_to_image: np.ndarray,
    *,
    i2t_positives: Sequence[np.ndarray] | None = None,
    t2i_positives: Sequence[np.ndarray] | None = None,
    relevance: np.ndarray | None = None,
    ndcg_k: int = 25,
    chunk: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The per-query arrays (:func:`query_metrics`' keys) behind :func:`retrieval_metrics`: (i2t, t2i)."""
    sims = np.asarray(sims)
    c2i = np.asarray(caption_to_image, dtype=np.int64)
    relevance = None if relevance is None else np.asarray(relevance)
    _check_inputs(sims, c2i, relevance)
    n_img, n_cap = sims.shape
    log.debug("retrieval_metrics: %d images x %d captions, relevance=%s", n_img, n_cap, relevance is not None)
    caps = np.arange(n_cap, dtype=np.int64)
    kw = dict(spec=MetricsSpec(ks=RECALL_KS, p_at=5, ndcg_k=ndcg_k, gain="exponential", chunk=chunk))
    rows, items = _extra(c2i, caps, i2t_positives, n_img)
    i2t = _metrics_from_keys(
        sims, _positive_keys(rows, items, n_cap), relevance=None if relevance is None else relevance.T, **kw
    )
    rows, items = _extra(caps, c2i, t2i_positives, n_cap)
    t2i = _metrics_from_keys(sims.T, _positive_keys(rows, items, n_img), relevance=relevance, **kw)
    return i2t, t2i
