"""Shared by the §6c aggregate scripts: mean ± std over seeds of captioners' test reports
({kind}_s{seed}/report.json) and seed-matched differences between pairs of captioners."""
import json
from pathlib import Path

import numpy as np

SEEDS = ("s0", "s1", "s2")


def value(rep, key, judge):
    return rep[key] if judge is None else rep["judges"][judge][key]


def t_interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Seed-level interval of a mean difference: mean ± t(n − 1) · std / √n."""
    from scipy import stats

    half = stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return float(d.mean() - half), float(d.mean() + half)


def bound(x: float) -> str:
    """An interval end, with a second decimal where one would print ±0.0 (its side of 0 decides a verdict)."""
    return f"{x:+.2f}" if abs(x) < 0.05 else f"{x:+.1f}"


def table(root: Path, kinds, cols, pairs, seeds=SEEDS, interval: bool = False) -> str:
    """kinds: [(folder prefix, label)]; cols: [(report key, judge name or None)]; pairs: [(a, b)] for Δ a − b
    (with ``interval``: and its 95 % t-interval over seeds)."""
    reps = {k: {s: json.load(open(root / f"{k}_{s}" / "report.json")) for s in seeds
                if (root / f"{k}_{s}" / "report.json").is_file()} for k, _ in kinds}
    head = [k if j is None else f"{k} ({j} judge)" for k, j in cols]
    out = ["| captioner | seeds | " + " | ".join(head) + " |", "|---|---:|" + "---:|" * len(cols)]
    for k, name in kinds:
        if not reps[k]:
            continue
        cells = []
        for key, j in cols:
            v = np.array([value(r, key, j) for r in reps[k].values()])
            cells.append(f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v[0]:.1f}")
        out.append(f"| {name} | {len(reps[k])} | " + " | ".join(cells) + " |")
    for a, b in pairs:
        both = [s for s in seeds if s in reps[a] and s in reps[b]]  # seed-matched
        n = len(both)
        if n == 0:
            continue
        cells = []
        for key, j in cols:
            d = np.array([value(reps[a][s], key, j) - value(reps[b][s], key, j) for s in both])
            sd = f" ± {d.std(ddof=1):.1f}" if n > 1 else ""
            ci = " [{}, {}]".format(*map(bound, t_interval(d))) if interval and n > 1 else ""
            cells.append(f"{d.mean():+.1f}{sd} ({(d > 0).sum()}/{n}){ci}")
        out.append(f"| Δ {a} − {b} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)
