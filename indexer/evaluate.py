"""`ltd eval`: metrics of an index directory → report.json + report.md.

Scores are exact (dot products of the stored float32 embeddings), whatever FAISS factory serves the
index; for approximate factories the report adds the index's recall@10 against exact search.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.index import IndexDir, IndexDirError, read_manifest
from indexer.metrics import _report, _summarise, retrieval_query_metrics
from indexer.protocols import DESCRIPTIONS, PROTOCOLS, protocol_metrics
from indexer.relevance import coco_positives, file_relevance, rouge_relevance
from indexer.tune import remeasure
from training.fsio import atomic_path, atomic_write_text, write_json_atomic

log = logging.getLogger(__name__)

PER_QUERY = "per_query"


@dataclass(frozen=True)
class EvalOptions:
    """What :func:`evaluate_index` measures: nDCG@``ndcg_k`` with the graded ``relevance`` (``rougeL``, or a
    relevance file; None: no nDCG); ``cxc`` / ``eccv``: COCO 5k test positives from CxC / ECCV Caption (ECCV:
    its queries only; one of the two at most); ``protocols``: extra protocols of ``indexer/protocols.py``
    (coco1k, eccv, pmrp; pmrp reads ``pm_dir``), reported beside the full split's numbers under their own
    keys; ``per_query``: the per-query arrays are added to the report too."""

    relevance: str | None = "rougeL"
    cxc: bool = False
    ndcg_k: int = 25
    per_query: bool = False
    eccv: bool = False
    protocols: tuple[str, ...] = ()
    pm_dir: str | Path | None = None


def ground_truth(ix: IndexDir) -> tuple[np.ndarray, np.ndarray]:
    """(caption_to_image, caption mask): captions whose image was skipped are left out."""
    if not ix.has_ground_truth:
        raise IndexDirError(f"{ix.path} is a corpus index without ground truth: nothing to evaluate")
    c2i = np.asarray(ix.captions.meta["image"], dtype=np.int64)
    return c2i, c2i >= 0


def similarities(ix: IndexDir) -> np.ndarray:
    return np.asarray(ix.images.vectors) @ np.asarray(ix.captions.vectors).T


def index_recall(ix: IndexDir, k: int = 10, n_queries: int = 1000) -> float:
    """Recall@k of the FAISS caption index against exact search, for image queries."""
    q = np.asarray(ix.images.vectors[:n_queries])
    _, approx = ix.captions.index.search(q, k)
    exact = np.argsort(-(q @ np.asarray(ix.captions.vectors).T), axis=1, kind="stable")[:, :k]
    return float(np.mean([len(set(a) & set(e)) / k for a, e in zip(approx, exact)]))


def retuned_recalls(ix: IndexDir) -> dict:
    """For each side built to a target (``--factory auto``, approximate): the recall the builder
    measured beside the recall re-measured now on corpus queries (``indexer/tune.py``)."""
    out = {}
    for m in ("images", "captions"):
        tuning = ((ix.manifest.get("indexes") or {}).get(m) or {}).get("tuning")
        chosen = (tuning or {}).get("chosen") or {}
        if chosen.get("factory", "Flat") != "Flat":
            mod = getattr(ix, m)
            out[m] = {"target": tuning["target"]["recall"], "built": chosen["recall"],
                      "built_ci95": chosen.get("recall_ci95"), "now": remeasure(mod.index, mod.vectors)}
    return out


def evaluate_index(ix: IndexDir, options: EvalOptions | None = None) -> dict:
    """The report of an index, measured as ``options`` says (:class:`EvalOptions`; None: its defaults). With
    ``per_query``, the per-query arrays are under ``report["per_query"]`` (ranks and nDCG, in query order;
    ``write_report`` moves them to ``per_query.gNNNN.npz``)."""
    t0 = time.time()
    o = options or EvalOptions()
    relevance, cxc, eccv, ndcg_k, protocols = o.relevance, o.cxc, o.eccv, o.ndcg_k, o.protocols
    if cxc and eccv:
        raise IndexDirError("choose one extra ground truth: CxC or ECCV Caption")
    source = "cxc" if cxc else "eccv" if eccv else None
    c2i, mask = ground_truth(ix)
    sims = similarities(ix)[:, mask]
    c2i = c2i[mask]
    rel, rel_name = None, None
    if relevance:
        if relevance.lower() in ("rougel", "rouge-l", "rouge"):
            rel, rel_name = rouge_relevance(ix), "rougeL"
        else:
            rel = file_relevance(relevance, len(ix.captions.ids), len(ix.images.ids))
            rel_name = Path(relevance).stem.split(".")[0]
        rel = rel[mask]
    i2t_extra = t2i_extra = i2t_q = t2i_q = None
    if source:
        i2t_all, t2i_all, i2t_q, t2i_q = coco_positives(ix, source)
        keep = np.flatnonzero(mask)
        remap = -np.ones(len(mask), dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        i2t_extra = [remap[e][remap[e] >= 0] for e in i2t_all]
        t2i_extra = [t2i_all[j] for j in keep]
        t2i_q = None if t2i_q is None else t2i_q[keep]
    i2t, t2i = retrieval_query_metrics(sims, c2i, i2t_positives=i2t_extra, t2i_positives=t2i_extra, relevance=rel,
                                       ndcg_k=ndcg_k)
    if i2t_q is not None:  # ECCV Caption: only the queries it re-annotated
        i2t = {k: v[i2t_q] for k, v in i2t.items()}
        t2i = {k: v[t2i_q] for k, v in t2i.items()}
    name = rel_name or "rougeL"
    m = _report(_summarise("i2t", i2t, ndcg_k, name), _summarise("t2i", t2i, ndcg_k, name), *sims.shape)
    extra, extra_q = _protocols(ix, protocols, o.pm_dir, mask)
    report = {k: (round(float(v), 4) if isinstance(v, (float, np.floating)) else v) for k, v in {**m, **extra}.items()}
    mf = ix.manifest
    report["meta"] = {"index": str(ix.path), "index_generation": ix.generation, "name": ix.name,
                      "model": mf.get("model", {}),
                      "checkpoint": mf.get("checkpoint"), "checkpoint_sha256": mf.get("checkpoint_sha256"),
                      "dataset": mf.get("dataset"), "shortcuts": mf.get("shortcuts", "none"),
                      "factory": mf.get("factory"), "ground_truth": source or "original",
                      "queries": {"i2t": len(i2t["first_rank"]), "t2i": len(t2i["first_rank"])},
                      "relevance": rel_name, "ndcg_k": ndcg_k, "seconds": round(time.time() - t0, 2),
                      "protocol": DESCRIPTIONS["full"] + ("" if source is None else f"; positives: {source}"),
                      "protocols": {p: DESCRIPTIONS[p] for p in protocols}}
    if mf.get("factory", "Flat") != "Flat":
        report["meta"]["index_recall@10"] = round(index_recall(ix), 4)
    if tuning_checks := retuned_recalls(ix):
        report["meta"]["index_tuning"] = tuning_checks
    if o.per_query:  # written by write_report as per_query.gNNNN.npz (the paired bootstrap's input)
        # t2i_image: each caption query's image (its row among the i2t queries), so a bootstrap can
        # resample images together with their captions
        report[PER_QUERY] = {"i2t_first_rank": i2t["first_rank"], "t2i_first_rank": t2i["first_rank"],
                             "t2i_image": np.asarray(c2i, dtype=np.int64),
                             **({"t2i_ndcg": t2i[f"ndcg@{ndcg_k}"], "i2t_ndcg": i2t[f"ndcg@{ndcg_k}"]}
                                if rel is not None else {}), **extra_q}
    return report


def _protocols(ix: IndexDir, protocols: tuple[str, ...], pm_dir, mask: np.ndarray) -> tuple[dict, dict]:
    """The extra protocols' report entries and per-query arrays (on the whole split: every caption must
    have its image, so that the folds and the COCO id joins see the split as it was indexed)."""
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        raise IndexDirError(f"unknown protocol {unknown[0]!r}; one of {', '.join(PROTOCOLS)}")
    if not protocols:
        return {}, {}
    if not mask.all():
        raise IndexDirError(f"{ix.path}: {int((~mask).sum())} captions lost their image when it was skipped; the COCO "
                            "1K / ECCV / PMRP protocols need the whole split")
    c2i = np.asarray(ix.captions.meta["image"], dtype=np.int64)
    return protocol_metrics(ix, similarities(ix), c2i, list(protocols), pm_dir)


def render_markdown(report: dict) -> str:
    meta = report["meta"]
    ds = meta.get("dataset") or {}
    model = meta.get("model") or {}
    loss = model.get("loss") or {}
    lines = [f"# Evaluation: {meta['name']}", "",
             f"- dataset: {ds.get('name')} / {ds.get('split')} ({report['n_images']} images, "
             f"{report['n_captions']} captions); ground truth: {meta['ground_truth']}"
             + (f" ({meta['queries']['i2t']} image and {meta['queries']['t2i']} caption queries)"
                if meta["ground_truth"] == "eccv" else "") + f"; shortcuts: {meta['shortcuts']}",
             f"- model: {model.get('train_name')} (contrastive {loss.get('contrastive')}, mode {loss.get('mode')}"
             + (f", η {loss.get('eta')}" if loss.get("eta") is not None else "")
             + (f", β {loss.get('beta')}" if loss.get("beta") is not None else "") + ")",
             f"- checkpoint: `{meta.get('checkpoint')}` (sha256 {str(meta.get('checkpoint_sha256'))[:12]}…)",
             f"- index: {meta.get('factory')}" + (f" (recall@10 vs exact {meta['index_recall@10']:.3f})"
                                                    if "index_recall@10" in meta else ""),
             *[f"- {m} index built to recall@10 ≥ {t['target']:g}: {t['built']:.4f} at the build, "
               f"{t['now']['recall']:.4f} ({t['now']['recall_ci95'][0]:.4f}–{t['now']['recall_ci95'][1]:.4f}) now"
               for m, t in meta.get("index_tuning", {}).items()], "",
             "| direction | R@1 | R@5 | R@10 | med r | mean r | R-P |" + (" nDCG |" if meta.get("relevance") else ""),
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if meta.get("relevance") else "")]
    for d, label in (("i2t", "image → text"), ("t2i", "text → image")):
        row = (f"| {label} | {report[f'{d}_R@1']:.1f} | {report[f'{d}_R@5']:.1f} | {report[f'{d}_R@10']:.1f} | "
               f"{report[f'{d}_medr']:g} | {report[f'{d}_meanr']:.1f} | {report[f'{d}_R-P']:.1f} |")
        if meta.get("relevance"):
            key = f"{d}_nDCG@{meta['ndcg_k']}_{meta['relevance']}"
            row += f" {report[key]:.4f} |"
        lines.append(row)
    lines += ["", f"**rsum {report['rsum']:.1f}**", "", f"Protocol: {meta.get('protocol', DESCRIPTIONS['full'])}."]
    lines += _protocol_lines(report)
    lines += ["",
              "R@k and R-precision in %, nDCG in [0, 1]" + (f" (nDCG@{meta['ndcg_k']} with {meta['relevance']} "
                                                             "relevance, gain 2^rel − 1)" if meta.get("relevance") else "")
              + ". i2t R@k counts the best-ranked of an image's captions.", ""]
    return "\n".join(lines)


def _protocol_lines(report: dict) -> list[str]:
    """The extra protocols' tables of report.md (each says which protocol its numbers are)."""
    out, protos = [], (report.get("meta") or {}).get("protocols") or {}
    if "coco1k" in protos:
        out += ["", f"**{protos['coco1k']}**", "", "| direction | R@1 | R@5 | R@10 | R-P |", "|---|---:|---:|---:|---:|"]
        out += [f"| {label} | " + " | ".join(f"{report[f'coco1k_{d}_{k}']:.1f}" for k in ("R@1", "R@5", "R@10", "R-P")) + " |"
                for d, label in (("i2t", "image → text"), ("t2i", "text → image"))]
        out += ["", f"COCO 1K rsum {report['coco1k_rsum']:.1f}"]
    if "eccv" in protos:
        q = report["eccv_queries"]
        out += ["", f"**{protos['eccv']}** ({q['i2t']} image, {q['t2i']} caption queries)", "",
                "| direction | mAP@R | R-P | R@1 |", "|---|---:|---:|---:|"]
        out += [f"| {label} | {report[f'eccv_{d}_mAP@R']:.1f} | {report[f'eccv_{d}_R-P']:.1f} | {report[f'eccv_{d}_R@1']:.1f} |"
                for d, label in (("i2t", "image → text"), ("t2i", "text → image"))]
    if "pmrp" in protos:
        out += ["", f"**{protos['pmrp']}**: image → text {report['pmrp_i2t']:.1f}, text → image {report['pmrp_t2i']:.1f}"]
    return out


def write_report(ix: IndexDir, report: dict) -> tuple[Path, Path]:
    per_query = report.pop(PER_QUERY, None)
    if per_query is not None:  # before report.json, which marks the evaluation as done
        with atomic_path(per_query_path(ix)) as tmp, open(tmp, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in per_query.items()})
    jp = write_json_atomic(ix.path / "report.json", report, indent=2)
    mp = atomic_write_text(ix.path / "report.md", render_markdown(report))
    return jp, mp


def per_query_path(ix: IndexDir) -> Path:
    return ix.derived_path(PER_QUERY, "npz")


def load_per_query(index_dir: str | Path) -> dict[str, np.ndarray] | None:
    """The per-query arrays ``write_report`` saved for the index's current generation, or None (no
    pickles are loaded). A folder without its index (an evaluation's record copied under docs/results/:
    report.json and the per-query file) gives the arrays of the generation its report describes."""
    if (Path(index_dir) / "manifest.json").is_file():
        gen = int(read_manifest(index_dir).get("generation", 0))
    else:
        rep = load_report(index_dir)
        gen = (rep or {}).get("meta", {}).get("index_generation")
        if not isinstance(gen, int):
            return None
    p = Path(index_dir) / f"{PER_QUERY}.g{gen:04d}.npz"
    if not p.is_file():
        return None
    with np.load(p, allow_pickle=False) as z:
        return {k: np.asarray(z[k]) for k in z.files}


def load_report(index_dir: str | Path, generation: int | None = None) -> dict | None:
    """The index's report, or None when there is none or it describes another generation of the index."""
    p = Path(index_dir) / "report.json"
    if not p.is_file():
        return None
    try:
        rep = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if generation is not None and rep.get("meta", {}).get("index_generation") != generation:
        return None
    return rep
