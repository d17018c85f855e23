"""Paired statistics for `ltd experiment`: seed-matched differences and the paired bootstrap over test
queries, for every cell against the first one and for the extra pairs a grid names (``compare``).

Seed-matched differences (mean ± std over seeds, seeds ahead) say how much of a gap is training
noise; the bootstrap interval (``indexer.bootstrap``) says how much is the choice of test queries.
A comparison people can trust needs both.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from indexer.bootstrap import paired_bootstrap
from indexer.evaluate import load_per_query

log = logging.getLogger("ltd.experiment")


def comparison_pairs(results: dict) -> list[tuple[str, str]]:
    """(reference, cell): every cell against the first, then the grid's ``compare`` pairs."""
    cells = list(results["summary"])
    pairs = [(cells[0], c) for c in cells[1:]]
    for ref, cell in results.get("compare", []):
        if (ref, cell) not in pairs and ref in cells and cell in cells:
            pairs.append((ref, cell))
    return pairs


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, "n": int(len(arr)),
            "values": [round(float(v), 4) for v in arr]}


def seed_matched(results: dict, tag: str, ref: str, cell: str, key: str = "rsum") -> dict | None:
    """``key`` of ``cell`` minus ``ref`` on the seeds both have: mean, sample std, seeds ahead."""
    def by_seed(c: str) -> dict[int, float]:
        return {r["seed"]: r["reports"][tag][key] for r in results["runs"]
                if r["cell"] == c and key in r["reports"].get(tag, {})}
    a, b = by_seed(ref), by_seed(cell)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    d = [b[s] - a[s] for s in seeds]
    return {**_stats(d), "seeds": seeds, "ahead": int(sum(x > 0 for x in d))}


def _per_query_stack(results: dict, cell: str, tag: str, seeds: list[int]) -> dict[str, np.ndarray] | None:
    rows = []
    for s in seeds:
        run = next((r for r in results["runs"] if r["cell"] == cell and r["seed"] == s), None)
        pq = load_per_query(Path(run["index_root"]) / tag) if run and run.get("index_root") else None
        if pq is None:
            return None
        rows.append(pq)
    keys = set.intersection(*(set(r) for r in rows))
    return {k: np.stack([r[k] for r in rows]) for k in keys}


def bootstrap_pair(results: dict, tag: str, ref: str, cell: str, n_resamples: int = 10_000) -> dict | None:
    """Paired bootstrap of the seed-mean Δ (cell − ref) over ``tag``'s queries, or None when a run
    has no per-query results (evaluated before they were written)."""
    seeds = sorted({r["seed"] for r in results["runs"] if r["cell"] == ref}
                   & {r["seed"] for r in results["runs"] if r["cell"] == cell})
    if not seeds:
        return None
    a, b = _per_query_stack(results, ref, tag, seeds), _per_query_stack(results, cell, tag, seeds)
    if a is None or b is None:
        log.warning("no per-query results for %s vs %s on %s: no bootstrap interval", cell, ref, tag)
        return None
    return {**paired_bootstrap(a, b, n_resamples=n_resamples), "seeds": seeds}


def paired_statistics(results: dict, tags: list[str]) -> list[dict]:
    """One row per (tag, reference, cell): seed-matched differences and bootstrap intervals."""
    rows = []
    for tag in tags:
        for ref, cell in comparison_pairs(results):
            rsum = seed_matched(results, tag, ref, cell)
            ndcg = seed_matched(results, tag, ref, cell, "t2i_nDCG@25_rougeL")
            boot = bootstrap_pair(results, tag, ref, cell)
            if rsum is None and boot is None:
                continue
            rows.append({"tag": tag, "ref": ref, "cell": cell, "rsum": rsum, "ndcg": ndcg, "bootstrap": boot})
    return rows


def _ci(b: dict | None, key: str, fmt: str) -> str:
    if not b or key not in b:
        return "–"
    x = b[key]
    return f"[{x['lo']:{fmt}}, {x['hi']:{fmt}}]"


def render_paired(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    out = ["## Paired comparisons", "",
           "Δ = cell − reference. Seed-matched: mean ± std over the seeds both cells have, and on how many "
           "the cell is ahead. 95 % CI: paired bootstrap over the test queries (image and caption queries "
           "resampled independently, 10,000 resamples) of the seed-mean difference.", "",
           "| split | reference | cell | Δ rsum | seeds ahead | 95 % CI (queries) | Δ t2i nDCG | seeds ahead | "
           "95 % CI (queries) |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        d, n, b = r["rsum"], r["ndcg"], r["bootstrap"]
        out.append(f"| {r['tag']} | {r['ref']} | {r['cell']} | "
                   + (f"{d['mean']:+.1f} ± {d['std']:.1f} | {d['ahead']}/{d['n']}" if d else "– | –") + " | "
                   + _ci(b, "rsum", "+.1f") + " | "
                   + (f"{n['mean']:+.4f} ± {n['std']:.4f} | {n['ahead']}/{n['n']}" if n else "– | –") + " | "
                   + _ci(b, "t2i_ndcg", "+.4f") + " |")
    out.append("")
    return out

