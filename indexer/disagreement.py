"""`ltd compare`: per-query disagreement between two models on the same split.

For every query (captions for t2i, images for i2t) and each model: the rank of the first ground
truth, P@k and nDCG. Rows are sorted by disagreement = |log2(rank_a / rank_b)|, so "found at 1 vs
at 64" outranks "found at 40 vs at 60". This is the data behind the UI's explorer.
"""
from __future__ import annotations

import csv
import io

import numpy as np

from indexer.evaluate import ground_truth, similarities
from indexer.index import IndexDir, IndexDirError
from indexer.metrics import MetricsSpec, query_metrics
from indexer.relevance import rouge_relevance
from training.progress import quiet

FIELDS = ["direction", "query_index", "query_id", "query", "a_rank", "b_rank", "a_p@k", "b_p@k", "a_ndcg", "b_ndcg",
          "rank_log2_ratio", "winner", "disagreement"]


def _fmt3(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def check_comparable(a: IndexDir, b: IndexDir) -> None:
    if not (a.has_ground_truth and b.has_ground_truth):
        raise IndexDirError("compare needs two dataset indexes with ground truth (corpus indexes have none)")
    if a.images.ids != b.images.ids or a.captions.ids != b.captions.ids:
        da, db = a.manifest.get("dataset", {}), b.manifest.get("dataset", {})
        raise IndexDirError(f"{a.name} and {b.name} do not index the same items "
                            f"({da.get('name')}/{da.get('split')} vs {db.get('name')}/{db.get('split')}); "
                            "index the same dataset split with both checkpoints")


def compare_indexes(a: IndexDir, b: IndexDir, *, relevance: bool | np.ndarray = True, p_at: int = 5,
                    ndcg_k: int = 25, directions: tuple[str, ...] = ("t2i", "i2t")) -> list[dict]:
    """Per-query rows (``FIELDS``), most disagreement first. ``relevance``: True computes (and caches)
    ROUGE-L graded relevance for nDCG, False leaves nDCG out, an array (captions × images) is used as is."""
    check_comparable(a, b)
    c2i, mask = ground_truth(a)
    if isinstance(relevance, np.ndarray):
        rel = relevance
    else:
        with quiet():
            rel = rouge_relevance(a) if relevance else None
    cap_rows = np.flatnonzero(mask)
    spec = MetricsSpec(p_at=p_at, ndcg_k=ndcg_k)
    per: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for tag, ix in (("a", a), ("b", b)):
        sims = similarities(ix)
        per[tag] = {}
        if "t2i" in directions:
            per[tag]["t2i"] = query_metrics(sims.T[cap_rows], [np.array([c2i[j]]) for j in cap_rows],
                                            relevance=None if rel is None else rel[cap_rows], spec=spec)
        if "i2t" in directions:
            caps = [np.asarray(c, dtype=np.int64) for c in ix.images.meta["captions"]]
            per[tag]["i2t"] = query_metrics(sims, caps, relevance=None if rel is None else np.ascontiguousarray(rel.T),
                                            spec=spec)
    rows: list[dict] = []
    for d in directions:
        ma, mb = per["a"][d], per["b"][d]
        queries = cap_rows if d == "t2i" else np.arange(len(a.images.ids))
        ra, rb = ma["first_rank"], mb["first_rank"]
        ratio = np.log2(ra) - np.log2(rb)  # > 0: b ranks the ground truth higher
        nd = f"ndcg@{ndcg_k}"
        for k, q in enumerate(queries):
            if np.isnan(ra[k]) or np.isnan(rb[k]):
                continue
            r = float(ratio[k])
            rows.append({
                "direction": d, "query_index": int(q),
                "query_id": int(a.captions.ids[q] if d == "t2i" else a.images.ids[q]),
                "query": a.captions.meta["texts"][q] if d == "t2i" else a.images.meta["filenames"][q],
                "a_rank": int(ra[k]), "b_rank": int(rb[k]),
                "a_p@k": round(float(ma[f"p@{p_at}"][k]), 4), "b_p@k": round(float(mb[f"p@{p_at}"][k]), 4),
                "a_ndcg": round(float(ma[nd][k]), 4) if nd in ma else None,
                "b_ndcg": round(float(mb[nd][k]), 4) if nd in mb else None,
                "rank_log2_ratio": round(r, 4), "winner": "b" if r > 0 else "a" if r < 0 else "tie",
                "disagreement": round(abs(r), 4),
            })
    rows.sort(key=lambda x: (-x["disagreement"], -abs((x["a_ndcg"] or 0) - (x["b_ndcg"] or 0)), x["direction"],
                             x["query_index"]))
    return rows


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def to_markdown(rows: list[dict], a_name: str, b_name: str, top: int = 20, p_at: int = 5) -> str:
    wins = {w: sum(r["winner"] == w for r in rows) for w in ("a", "b", "tie")}
    lines = [f"A = {a_name}, B = {b_name}: B ranks the ground truth higher for {wins['b']} queries, "
             f"A for {wins['a']}, tie {wins['tie']} ({len(rows)} queries).", "",
             f"| dir | query | rank A | rank B | P@{p_at} A | P@{p_at} B | nDCG A | nDCG B | winner |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows[:top]:
        q = str(r["query"]).replace("|", "/")
        q = q if len(q) <= 70 else q[:67] + "..."
        lines.append(f"| {r['direction']} | {q} | {r['a_rank']} | {r['b_rank']} | {r['a_p@k']:.2f} | {r['b_p@k']:.2f} | "
                     f"{_fmt3(r['a_ndcg'])} | {_fmt3(r['b_ndcg'])} | {dict(a='A', b='B', tie='=')[r['winner']]} |")
    return "\n".join(lines)
