"""Paired statistics for `ltd experiment`: for every cell against the first one and for the extra pairs
a grid names (``compare``), two intervals that answer different questions.

- **Seeds** (training noise): the seed-matched differences (same seed = same initialisation and data
  order), their mean, and a t-interval over seeds, mean ± t_{n−1}·sd/√n (``scipy.stats.t``); the
  number of seeds ahead. With 3 seeds t is 4.30: a gap of one sd is far from shown.
- **Test set** (which images were sampled): the paired bootstrap of ``indexer.bootstrap`` over test
  images with all their captions (both directions from one resample) of the seed-mean difference.

A difference is **shown** only when both 95 % intervals exclude 0 on the same side; otherwise it is
"not shown", and where the seed interval is the obstacle the table says how many seeds would do at
the observed mean and spread. "Level with" is not a finding: with an interval [a, b] around 0 the
words are "no detectable difference (interval [a, b])". Older runs without per-query image ids keep
their caption-level bootstrap, marked † and not used for the verdict.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
from scipy import stats as sps

from indexer.bootstrap import paired_bootstrap
from indexer.evaluate import load_per_query

log = logging.getLogger("ltd.experiment")

LEVEL = 0.95
MAX_SEEDS_NEEDED = 50  # beyond this "seeds needed" is reported as "> 50"


def comparison_pairs(results: dict) -> list[tuple[str, str]]:
    """(reference, cell): every cell against the first, then the grid's ``compare`` pairs."""
    cells = list(results["summary"])
    pairs = [(cells[0], c) for c in cells[1:]]
    for ref, cell in results.get("compare", []):
        if (ref, cell) not in pairs and ref in cells and cell in cells:
            pairs.append((ref, cell))
    return pairs


def t_interval(values: list[float], level: float = LEVEL) -> dict:
    """Mean, sample sd and the two-sided t-interval of the mean over ``values`` (the seeds), the
    number ahead (> 0), and ``seeds_needed``: the fewest seeds whose interval would exclude 0 if the
    mean and sd stayed as observed (None when the mean is 0; ``MAX_SEEDS_NEEDED + 1`` for more)."""
    arr = np.asarray(values, dtype=float)
    n, mean = len(arr), float(arr.mean())
    sd = float(arr.std(ddof=1)) if n > 1 else 0.0
    half = float(sps.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)) if n > 1 else math.inf
    need = None
    if mean != 0:
        need = next((m for m in range(2, MAX_SEEDS_NEEDED + 1)
                     if sps.t.ppf(0.5 + level / 2, m - 1) * sd / math.sqrt(m) < abs(mean)), MAX_SEEDS_NEEDED + 1)
    return {"mean": mean, "std": sd, "n": n, "lo": mean - half, "hi": mean + half, "level": level,
            "ahead": int((arr > 0).sum()), "seeds_needed": need, "values": [round(float(v), 4) for v in arr]}


def verdict(seed: dict | None, boot: dict | None) -> str:
    """"ahead" / "behind" when the seed interval and the image bootstrap (if there is one) both exclude
    0 on that side; else "not shown", with what stands in the way."""
    if seed is None:
        return "–"
    usable = boot if boot and boot.get("resampling") == "images" else None
    for word, side in (("ahead", 1), ("behind", -1)):
        if side * seed["lo"] > 0 and side * seed["hi"] > 0:
            if usable is None or (side * usable["lo"] > 0 and side * usable["hi"] > 0):
                return word
            return "not shown (test set)"
    need = seed.get("seeds_needed")
    return "not shown" + (f" (~{need} seeds)" if need and need <= MAX_SEEDS_NEEDED and need > seed["n"]
                          else " (> 50 seeds)" if need else "")


def seed_matched(results: dict, tag: str, ref: str, cell: str, key: str = "rsum") -> dict | None:
    """``key`` of ``cell`` minus ``ref`` on the seeds both have: :func:`t_interval` plus the seeds."""
    def by_seed(c: str) -> dict[int, float]:
        return {r["seed"]: r["reports"][tag][key] for r in results["runs"]
                if r["cell"] == c and key in r["reports"].get(tag, {})}
    a, b = by_seed(ref), by_seed(cell)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    return {**t_interval([b[s] - a[s] for s in seeds]), "seeds": seeds}


def _per_query_stack(results: dict, cell: str, tag: str, seeds: list[int]) -> dict[str, np.ndarray] | None:
    rows = []
    for s in seeds:
        run = next((r for r in results["runs"] if r["cell"] == cell and r["seed"] == s), None)
        ix = Path(run["index_root"]) / tag if run and run.get("index_root") else None
        pq = load_per_query(ix) if ix and ix.is_dir() else None  # a run's index, or its record under docs/results
        if pq is None:
            return None
        rows.append(pq)
    keys = set.intersection(*(set(r) for r in rows))
    return {k: np.stack([r[k] for r in rows]) for k in keys}


def bootstrap_pair(results: dict, tag: str, ref: str, cell: str, n_resamples: int = 10_000) -> dict | None:
    """Paired bootstrap of the seed-mean Δ (cell − ref) over ``tag``'s test images (with their captions),
    or None when a run has no per-query results; runs evaluated before per-query image ids were
    written fall back to caption-level resampling (``resampling: queries``, shown with †)."""
    seeds = sorted({r["seed"] for r in results["runs"] if r["cell"] == ref}
                   & {r["seed"] for r in results["runs"] if r["cell"] == cell})
    if not seeds:
        return None
    a, b = _per_query_stack(results, ref, tag, seeds), _per_query_stack(results, cell, tag, seeds)
    if a is None or b is None:
        log.warning("no per-query results for %s vs %s on %s: no bootstrap interval", cell, ref, tag)
        return None
    by = "images" if "t2i_image" in a and "t2i_image" in b else "queries"
    return {**paired_bootstrap(a, b, n_resamples=n_resamples, by=by), "seeds": seeds}


def paired_statistics(results: dict, tags: list[str], stored: list[dict] | None = None) -> list[dict]:
    """One row per (tag, reference, cell): seed-level intervals, the bootstrap and the verdicts.
    ``stored`` (an older results.json's rows) supplies the bootstrap where the runs' per-query files
    are gone (a copy under docs/results/)."""
    old = {(r["tag"], r["ref"], r["cell"]): r.get("bootstrap") for r in stored or []}
    rows = []
    for tag in tags:
        for ref, cell in comparison_pairs(results):
            rsum = seed_matched(results, tag, ref, cell)
            ndcg = seed_matched(results, tag, ref, cell, "t2i_nDCG@25_rougeL")
            boot = bootstrap_pair(results, tag, ref, cell) or old.get((tag, ref, cell))
            if boot is not None and "resampling" not in boot:
                boot = {**boot, "resampling": "queries"}  # written before the image bootstrap existed
            if rsum is None and boot is None:
                continue
            rows.append({"tag": tag, "ref": ref, "cell": cell, "rsum": rsum, "ndcg": ndcg, "bootstrap": boot,
                         "verdict": verdict(rsum, _part(boot, "rsum")),
                         "verdict_ndcg": verdict(ndcg, _part(boot, "t2i_ndcg"))})
    return rows


def _part(boot: dict | None, key: str) -> dict | None:
    """One metric's bootstrap interval, with how it was resampled."""
    return {**boot[key], "resampling": boot["resampling"]} if boot and key in boot else None


def _ci(b: dict | None, key: str, fmt: str) -> str:
    if not b or key not in b:
        return "–"
    x = b[key]
    return f"[{x['lo']:{fmt}}, {x['hi']:{fmt}}]" + ("" if b.get("resampling") == "images" else " †")


def _seed_cells(d: dict | None, fmt: str) -> str:
    if not d:
        return "– | – | –"
    return f"{d['mean']:{fmt}} ± {d['std']:{fmt[1:]}} | {d['ahead']}/{d['n']} | [{d['lo']:{fmt}}, {d['hi']:{fmt}}]"


def render_paired(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    out = ["## Paired comparisons", "",
           "Δ = cell − reference, seed-matched: mean ± sd over the seeds both cells have, how many the cell "
           "is ahead on, and the 95 % t-interval over seeds (training noise). 95 % CI (images): paired "
           "bootstrap of the seed-mean Δ over the test images, each with all its captions (10,000 "
           "resamples; test-set sampling). **ahead/behind** only when both intervals exclude 0; "
           "\"not shown (~N seeds)\": the seeds that would do at the observed mean and sd.", ""]
    if any(r["bootstrap"] and r["bootstrap"].get("resampling") != "images" for r in rows):
        out += ["† older runs without per-query image ids: image and caption queries resampled independently "
                "(too narrow: an image's captions are not independent draws); not used for the verdict.", ""]
    out += ["| split | reference | cell | Δ rsum | seeds ahead | 95 % t (seeds) | 95 % CI (images) | verdict | "
            "Δ t2i nDCG | seeds ahead | 95 % t (seeds) | 95 % CI (images) | verdict |",
            "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        b = r["bootstrap"]
        out.append(f"| {r['tag']} | {r['ref']} | {r['cell']} | {_seed_cells(r['rsum'], '+.1f')} | "
                   f"{_ci(b, 'rsum', '+.1f')} | {r.get('verdict', '–')} | {_seed_cells(r['ndcg'], '+.4f')} | "
                   f"{_ci(b, 't2i_ndcg', '+.4f')} | {r.get('verdict_ndcg', '–')} |")
    out.append("")
    return out
