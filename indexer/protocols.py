"""Evaluation protocols beside the full split: COCO 1K (five folds), ECCV Caption mAP@R, PMRP.

- **full split** (every report's top-level keys): every image and caption of the indexed split is a
  query and a candidate; on COCO's 5k test split this is "COCO 5K".
- **COCO 1K** (``coco1k_*``): the split's images in five consecutive folds (index order: on a split
  from ``ltd data convert-coco`` that is the order of eccv-caption's ``coco_test_ids.npy``, the
  VSE++/SCAN folds), each fold's images with their captions evaluated alone; every number is the mean
  over the folds.
- **ECCV Caption** (``eccv_*``): the queries ECCV Caption re-annotated (1,261 images, 1,332 captions),
  their positives exactly ECCV's lists, candidates the whole 5k split: R@1, R-Precision and mAP@R
  (``(1/R) Σ_{r≤R} P@r · rel(r)``, R = the query's positives), as eccv-caption computes them.
- **PMRP** (``pmrp_*``): R-Precision with the Plausible Match positives, which eccv-caption does not
  ship (``--pm DIR`` with its ``pm_image_to_caption.json`` / ``pm_caption_to_image.json``).

ECCV and PMRP join on COCO ids (``cocoids`` / ``annids`` in the index, as convert-coco writes them).
``tests/test_protocols.py`` checks every number against eccv-caption's own functions on one
similarity matrix, and 1K against a plainly written loop.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from indexer.index import IndexDir, IndexDirError
from indexer.metrics import RECALL_KS, retrieval_query_metrics, topk
from training.data.coco import eccv_data_dir
from training.data.karpathy import DatasetError
from training.errors import UserFileNotFound

PROTOCOLS = ("coco1k", "eccv", "pmrp")
DESCRIPTIONS = {
    "full": "full split: every image and caption is a query and a candidate (COCO's 5k test split: COCO 5K)",
    "coco1k": "COCO 1K: mean over 5 folds of consecutive images (index order) with their captions",
    "eccv": "ECCV Caption: its re-annotated queries, positives exactly its lists, candidates the whole split",
    "pmrp": "PMRP: R-Precision with the Plausible Match positives, candidates the whole split"}
FOLDS = 5


def coco1k_folds(n_images: int, caption_to_image: np.ndarray, folds: int = FOLDS) -> list[tuple[np.ndarray, np.ndarray]]:
    """(image positions, caption positions) of each fold: images ``[f·n/5, (f+1)·n/5)`` and their captions."""
    if n_images % folds:
        raise IndexDirError(f"COCO 1K needs a split whose image count divides into {folds} folds (got {n_images})")
    size, c2i = n_images // folds, np.asarray(caption_to_image)
    return [(np.arange(f * size, (f + 1) * size), np.flatnonzero((c2i >= f * size) & (c2i < (f + 1) * size)))
            for f in range(folds)]


def coco1k_query_ranks(sims: np.ndarray, c2i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query, its first rank inside its own fold: (image queries, caption queries), in split order."""
    i2t, t2i = np.full(sims.shape[0], np.nan), np.full(sims.shape[1], np.nan)
    for imgs, caps in coco1k_folds(sims.shape[0], c2i):
        a, b = retrieval_query_metrics(sims[np.ix_(imgs, caps)], c2i[caps] - imgs[0])
        i2t[imgs], t2i[caps] = a["first_rank"], b["first_rank"]
    return i2t, t2i


def coco1k_report(sims: np.ndarray, c2i: np.ndarray) -> dict[str, float]:
    """``coco1k_{i2t,t2i}_R@{1,5,10}``, ``coco1k_rsum`` and ``coco1k_{i2t,t2i}_R-P``: means over the folds."""
    folds = []
    for imgs, caps in coco1k_folds(sims.shape[0], c2i):
        a, b = retrieval_query_metrics(sims[np.ix_(imgs, caps)], c2i[caps] - imgs[0])
        r = {f"{d}_R@{k}": 100 * float(np.nanmean(m[f"hit@{k}"])) for d, m in (("i2t", a), ("t2i", b)) for k in RECALL_KS}
        r["rsum"] = sum(r.values())
        r.update({f"{d}_R-P": 100 * float(np.nanmean(m["rprec"])) for d, m in (("i2t", a), ("t2i", b))})
        folds.append(r)
    return {f"coco1k_{k}": float(np.mean([f[k] for f in folds])) for k in folds[0]}


def ranked_precision(scores: np.ndarray, positives: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per query (a row of ``scores``): R@1, R-Precision and mAP@R against its positives (unique;
    ties ranked to the smaller index, as every metric here)."""
    pos = [np.unique(np.asarray(p, dtype=np.int64)) for p in positives]
    r = np.array([len(p) for p in pos])
    if (r == 0).any():
        raise ValueError("every query needs at least one positive")
    ranked, _ = topk(scores, int(r.max()))
    out = {"r1": np.zeros(len(pos)), "rprec": np.zeros(len(pos)), "map@r": np.zeros(len(pos))}
    for q, p in enumerate(pos):
        rel = np.isin(ranked[q, : r[q]], p)
        prec = np.cumsum(rel) / np.arange(1, r[q] + 1)
        out["r1"][q], out["rprec"][q], out["map@r"][q] = rel[0], prec[-1], float(np.sum(prec * rel) / r[q])
    return out


def _joined(ix: IndexDir, i2t_map: dict, t2i_map: dict, label: str):
    """(image query positions, their caption positives, caption query positions, their image positives)."""
    cocoids, annids = ix.images.meta.get("cocoids"), ix.captions.meta.get("annids")
    if not cocoids or not annids or None in cocoids or None in annids:
        raise IndexDirError(f"{label} needs COCO image ids and caption annotation ids in the index; build it from a JSON "
                            "made by `ltd data convert-coco --karpathy-test` (which keeps them), on its test split")
    img_pos, cap_pos = {int(c): k for k, c in enumerate(cocoids)}, {int(a): k for k, a in enumerate(annids)}
    iq = [(img_pos[int(c)], [cap_pos[int(a)] for a in v if int(a) in cap_pos]) for c, v in i2t_map.items()
          if int(c) in img_pos]
    tq = [(cap_pos[int(a)], [img_pos[int(c)] for c in v if int(c) in img_pos]) for a, v in t2i_map.items()
          if int(a) in cap_pos]
    iq, tq = [(k, p) for k, p in iq if p], [(k, p) for k, p in tq if p]
    if not iq or not tq:
        raise IndexDirError(f"none of the index's images or captions have {label} annotations (COCO 5k test split)")
    return (np.array([k for k, _ in iq]), [np.array(p) for _, p in iq], np.array([k for k, _ in tq]),
            [np.array(p) for _, p in tq])


def _maps(folder: Path, prefix: str) -> tuple[dict, dict]:
    paths = [folder / f"{prefix}_image_to_caption.json", folder / f"{prefix}_caption_to_image.json"]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise UserFileNotFound(f"{missing[0]} not found")
    return tuple(json.loads(p.read_text()) for p in paths)


def ground_truth_queries(ix: IndexDir, source: str, pm_dir: str | Path | None = None):
    """The queries and positives of ``eccv`` (eccv-caption's files) or ``pmrp`` (``pm_dir``'s files)."""
    if source == "pmrp":
        if not pm_dir:
            raise IndexDirError("PMRP needs the Plausible Match files: --pm DIR (pm_image_to_caption.json and "
                                "pm_caption_to_image.json from naver-ai/eccv-caption's download)")
        return _joined(ix, *_maps(Path(pm_dir), "pm"), "Plausible Match")
    try:
        folder = eccv_data_dir()
    except DatasetError as e:
        raise IndexDirError(str(e)) from None
    return _joined(ix, *_maps(folder, "eccv"), "ECCV Caption")


def protocol_metrics(ix: IndexDir, sims: np.ndarray, c2i: np.ndarray, protocols: list[str],
                     pm_dir: str | Path | None = None) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """(report entries, per-query arrays for the bootstrap) of the requested protocols. Per-query arrays
    are over all image / caption queries, NaN where a query is not one of the protocol's."""
    report, per_query = {}, {}
    if "coco1k" in protocols:
        report.update(coco1k_report(sims, c2i))
        per_query["coco1k_i2t_first_rank"], per_query["coco1k_t2i_first_rank"] = coco1k_query_ranks(sims, c2i)
    for source in (p for p in ("eccv", "pmrp") if p in protocols):
        iq, ipos, tq, tpos = ground_truth_queries(ix, source, pm_dir)
        i2t, t2i = ranked_precision(sims[iq], ipos), ranked_precision(sims.T[tq], tpos)
        if source == "eccv":
            for d, m in (("i2t", i2t), ("t2i", t2i)):
                report.update({f"eccv_{d}_R@1": 100 * m["r1"].mean(), f"eccv_{d}_R-P": 100 * m["rprec"].mean(),
                               f"eccv_{d}_mAP@R": 100 * m["map@r"].mean()})
        else:
            report.update({"pmrp_i2t": 100 * i2t["rprec"].mean(), "pmrp_t2i": 100 * t2i["rprec"].mean()})
        key = "map@r" if source == "eccv" else "rprec"
        for d, q, m, n in (("i2t", iq, i2t, sims.shape[0]), ("t2i", tq, t2i, sims.shape[1])):
            arr = np.full(n, np.nan)
            arr[q] = m[key]
            per_query[f"{source}_{d}_{'map' if source == 'eccv' else 'rprec'}"] = arr
        report[f"{source}_queries"] = {"i2t": len(iq), "t2i": len(tq)}
    return report, per_query
