"""Paired bootstrap over the test set: how much of a difference between two models is the test set.

Two models evaluated on the same split give per-query results (``per_query.npz`` of ``ltd eval``):
for every image query the rank of its best-ranked caption, for every caption query the rank of its
image, its nDCG and its image. rsum is a sum of per-direction means,

    rsum = mean_images(100·Σ_k [rank ≤ k]) + mean_captions(100·Σ_k [rank ≤ k]),  k ∈ {1, 5, 10},

so the difference of two models is a difference of per-query means, and a bootstrap resamples the
test set, keeps each query's pair of results together (paired) and reads the 95 % interval of Δ rsum
and Δ t2i nDCG off the percentiles of the resampled differences.

**What is resampled** (``by``): the test set is a sample of *images*, each with its five captions, and
a caption's result depends on its image (an image the model cannot place fails all its captions and
its own image query). ``by="images"`` (the default) draws images with replacement and takes, for each
drawn image, its image query and all its caption queries — both directions from the same resample, a
cluster bootstrap. ``by="queries"`` draws image queries and caption queries independently, as if the
5,000 captions were 5,000 independent draws; with correlated captions it is too narrow (kept to
re-read older results and to show the difference; ``tests/test_bootstrap.py`` builds such a case).

With several seeds per model (rows of the arrays, seed-matched), each query's difference is first
averaged over the seeds, so the interval is for the seed-mean difference that the tables report. It
measures test-set sampling only; training noise is what the seed-level t-interval
(``app/experiment_stats.py``) measures. A claim needs both.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

RECALL_KS = (1, 5, 10)
CHUNK_ELEMENTS = 4_000_000  # indices per resample chunk (32 MB of int64)
RESAMPLING = ("images", "queries")


def recall_points(first_rank: np.ndarray, ks: tuple[int, ...] = RECALL_KS) -> np.ndarray:
    """Per query, its contribution to one direction's part of rsum: 100·Σ_k [rank ≤ k]."""
    r = np.asarray(first_rank, dtype=np.float64)
    return 100.0 * sum((r <= k).astype(np.float64) for k in ks)


def _per_query_delta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"paired results need the same shape (seeds, queries), got {a.shape} and {b.shape}")
    return (b - a).mean(axis=0)


def paired_deltas(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-query differences b − a (seed-averaged): ``i2t`` and ``t2i`` rsum points, ``ndcg``.

    ``a``/``b`` hold ``i2t_first_rank`` (seeds × images), ``t2i_first_rank`` and ``t2i_ndcg``
    (seeds × captions); a single run may pass 1-D arrays. Queries without a positive (nan rank)
    are not supported: the retrieval splits give every query one.
    """
    out = {"i2t": _per_query_delta(recall_points(a["i2t_first_rank"]), recall_points(b["i2t_first_rank"])),
           "t2i": _per_query_delta(recall_points(a["t2i_first_rank"]), recall_points(b["t2i_first_rank"]))}
    if "t2i_ndcg" in a and "t2i_ndcg" in b:
        out["ndcg"] = _per_query_delta(a["t2i_ndcg"], b["t2i_ndcg"])
    for k in ("i2t_first_rank", "t2i_first_rank"):
        if np.isnan(np.asarray(a[k], dtype=float)).any() or np.isnan(np.asarray(b[k], dtype=float)).any():
            raise ValueError(f"{k} has queries without a positive (nan): not supported")
    return out


def caption_images(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], n_images: int) -> np.ndarray:
    """Each caption query's image (``t2i_image``, the row of its image among the image queries), the
    same in both models and in every seed: the clusters of the image bootstrap."""
    if "t2i_image" not in a or "t2i_image" not in b:
        raise ValueError("by='images' needs t2i_image (each caption query's image) in the per-query results")
    ia, ib = np.atleast_2d(np.asarray(a["t2i_image"])), np.atleast_2d(np.asarray(b["t2i_image"]))
    if not (ia == ia[0]).all() or ia.shape[1:] != ib.shape[1:] or not (ib == ia[0]).all():
        raise ValueError("the two models' caption queries belong to different images: not the same test set")
    img = ia[0].astype(np.int64)
    if len(img) and (img.min() < 0 or img.max() >= n_images):
        raise ValueError(f"t2i_image must index the {n_images} image queries")
    return img


def resample_means(rng: np.random.Generator, d_i2t: np.ndarray, d_t2i: np.ndarray, extra: list[np.ndarray],
                   n_resamples: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Bootstrap replicates, image and caption queries drawn independently (``by="queries"``): Δ rsum
    and the mean of each array in ``extra`` over the same resampled caption queries. Draws, per chunk
    of resamples, the image indices then the caption indices (the reference in the tests draws the
    same)."""
    n_i, n_t = len(d_i2t), len(d_t2i)
    chunk = max(1, CHUNK_ELEMENTS // max(n_i, n_t, 1))
    rsum, ext = np.empty(n_resamples), [np.empty(n_resamples) for _ in extra]
    for a in range(0, n_resamples, chunk):
        c = min(chunk, n_resamples - a)
        ii = rng.integers(0, n_i, size=(c, n_i))
        it = rng.integers(0, n_t, size=(c, n_t))
        rsum[a:a + c] = d_i2t[ii].mean(axis=1) + d_t2i[it].mean(axis=1)
        for out, e in zip(ext, extra):
            out[a:a + c] = e[it].mean(axis=1)
    return rsum, ext


def resample_image_means(rng: np.random.Generator, d_i2t: np.ndarray, d_t2i: np.ndarray, image: np.ndarray,
                         extra: list[np.ndarray], n_resamples: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Bootstrap replicates of the cluster bootstrap (``by="images"``): each replicate draws n images
    with replacement; Δ rsum is the mean of their image queries' Δ plus the mean over *all their
    caption queries* (an image drawn twice counts its captions twice). Per-image sums and counts make a
    replicate one gather: mean_captions = Σ sums[drawn] / Σ counts[drawn]."""
    n_i = len(d_i2t)
    counts = np.bincount(image, minlength=n_i).astype(np.float64)
    sums = [np.bincount(image, weights=x, minlength=n_i) for x in (d_t2i, *extra)]
    chunk = max(1, CHUNK_ELEMENTS // max(n_i, 1))
    rsum, ext = np.empty(n_resamples), [np.empty(n_resamples) for _ in extra]
    for a in range(0, n_resamples, chunk):
        c = min(chunk, n_resamples - a)
        ii = rng.integers(0, n_i, size=(c, n_i))
        n_cap = np.maximum(counts[ii].sum(axis=1), 1.0)  # 0 only if no drawn image has a caption
        rsum[a:a + c] = d_i2t[ii].mean(axis=1) + sums[0][ii].sum(axis=1) / n_cap
        for out, s in zip(ext, sums[1:]):
            out[a:a + c] = s[ii].sum(axis=1) / n_cap
    return rsum, ext


def _interval(observed: float, reps: np.ndarray, level: float) -> dict:
    lo, hi = np.percentile(reps, [50 * (1 - level), 50 * (1 + level)])
    return {"delta": float(observed), "lo": float(lo), "hi": float(hi), "p_le_0": float(np.mean(reps <= 0))}


def paired_bootstrap(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], *, n_resamples: int = 10_000,
                     level: float = 0.95, seed: int = 0, by: str = "images") -> dict:
    """Δ (b − a) and its bootstrap interval for rsum and t2i nDCG over the test set.

    Returns ``{"rsum": {delta, lo, hi, p_le_0}, "t2i_ndcg": {...}, "resampling", "n_resamples",
    "level", "n_seeds", "n_images", "n_captions"}``; ``p_le_0`` is the share of replicates with Δ ≤ 0.
    ``by="images"`` needs ``t2i_image`` in both (``ltd eval`` writes it).
    """
    if not 0 < level < 1 or n_resamples < 1:
        raise ValueError("level must be in (0, 1) and n_resamples >= 1")
    if by not in RESAMPLING:
        raise ValueError(f"by must be one of {RESAMPLING}, got {by!r}")
    d = paired_deltas(a, b)
    extra = [d["ndcg"]] if "ndcg" in d else []
    rng = np.random.default_rng(seed)
    if by == "images":
        image = caption_images(a, b, len(d["i2t"]))
        reps, ext = resample_image_means(rng, d["i2t"], d["t2i"], image, extra, n_resamples)
    else:
        reps, ext = resample_means(rng, d["i2t"], d["t2i"], extra, n_resamples)
    out = {"rsum": _interval(d["i2t"].mean() + d["t2i"].mean(), reps, level), "resampling": by,
           "n_resamples": n_resamples, "level": level, "n_seeds": int(np.atleast_2d(a["i2t_first_rank"]).shape[0]),
           "n_images": len(d["i2t"]), "n_captions": len(d["t2i"])}
    if extra:
        out["t2i_ndcg"] = _interval(d["ndcg"].mean(), ext[0], level)
    if by == "images":
        out.update(protocol_intervals(a, b, image, len(d["i2t"]), n_resamples=n_resamples, level=level, seed=seed))
    return out


# The extra protocols' per-query arrays (indexer/protocols.py) → their report keys: (image-query array,
# caption-query array, scale). ECCV and PMRP arrays are NaN for queries outside the protocol.
PROTOCOL_ARRAYS = {"eccv_i2t_mAP@R": ("eccv_i2t_map", None, 100.0), "eccv_t2i_mAP@R": (None, "eccv_t2i_map", 100.0),
                   "pmrp_i2t": ("pmrp_i2t_rprec", None, 100.0), "pmrp_t2i": (None, "pmrp_t2i_rprec", 100.0)}


def _masked_delta(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    return _per_query_delta(np.nan_to_num(a[key], nan=0.0), np.nan_to_num(b[key], nan=0.0)) * \
        np.where(np.isnan(np.atleast_2d(a[key])[0]), np.nan, 1.0)


def protocol_intervals(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], image: np.ndarray, n_images: int, *,
                       n_resamples: int = 10_000, level: float = 0.95, seed: int = 0) -> dict:
    """Δ (b − a) and image-bootstrap intervals of the extra protocols both results hold: COCO 1K rsum
    (fold-local ranks; folds of equal size make it a mean over queries) and ECCV mAP@R / PMRP (means
    over the protocol's queries: a replicate's mean over the drawn images' queries, or their captions'
    queries). Each replicate draws images with replacement, as ``resample_image_means`` does; ``image``
    is each caption query's image (``t2i_image``)."""
    out, n_i = {}, int(n_images)
    if all(k in a and k in b for k in ("coco1k_i2t_first_rank", "coco1k_t2i_first_rank")):
        d = {"i2t": _per_query_delta(recall_points(a["coco1k_i2t_first_rank"]), recall_points(b["coco1k_i2t_first_rank"])),
             "t2i": _per_query_delta(recall_points(a["coco1k_t2i_first_rank"]), recall_points(b["coco1k_t2i_first_rank"]))}
        reps, _ = resample_image_means(np.random.default_rng([seed, 1]), d["i2t"], d["t2i"], image, [], n_resamples)
        out["coco1k_rsum"] = _interval(d["i2t"].mean() + d["t2i"].mean(), reps, level)
    for name, (ikey, tkey, scale) in PROTOCOL_ARRAYS.items():
        key = ikey or tkey
        if key not in a or key not in b:
            continue
        d = _masked_delta(a, b, key) * scale
        ok = ~np.isnan(d)
        if ikey:  # per image: its own query's Δ (or none)
            sums, counts = np.where(ok, d, 0.0), ok.astype(np.float64)
        else:  # per image: the sum and count of its captions' Δ
            sums = np.bincount(image, weights=np.where(ok, d, 0.0), minlength=n_i)
            counts = np.bincount(image, weights=ok.astype(np.float64), minlength=n_i)
        rng, reps = np.random.default_rng([seed, 2, len(out)]), np.empty(n_resamples)
        chunk = max(1, CHUNK_ELEMENTS // max(n_i, 1))
        for s in range(0, n_resamples, chunk):
            ii = rng.integers(0, n_i, size=(min(chunk, n_resamples - s), n_i))
            reps[s:s + len(ii)] = sums[ii].sum(axis=1) / np.maximum(counts[ii].sum(axis=1), 1.0)
        out[name] = _interval(float(np.nanmean(d)), reps, level)
    return out
