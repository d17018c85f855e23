"""LOG.md §6c "Independent judges": python aggregate.py [FOLDER] (default: this folder)."""
import json, sys
from pathlib import Path

import numpy as np

R = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent)
judges = ["bl_s0", "ltd_s0", "bl_s1", "ltd_s1", "dual_s0"]
groups = {"independent judges (bl_s1, ltd_s1, dual_s0)": ["bl_s1", "ltd_s1", "dual_s0"]}
rep = {(s, c): json.load(open(f"{R}/{s}_srfl_{c}/report.json")) for s in ("s0", "s1", "s2") for c in ("bl", "ltd")}
for k in ("self_R@1", "self_R@5", "self_R@10"):
    print("##", k)
    print("| judge | SR-FL (bl judge) | SR-FL (LTD judge) | Δ LTD − bl (seed-matched) | seeds ahead |")
    for j in judges:
        a = np.array([rep[(s, "bl")]["judges"][j][k] for s in ("s0", "s1", "s2")])
        b = np.array([rep[(s, "ltd")]["judges"][j][k] for s in ("s0", "s1", "s2")])
        d = b - a
        print(f"| {j} | {a.mean():.2f} ± {a.std(ddof=1):.2f} | {b.mean():.2f} ± {b.std(ddof=1):.2f} | {d.mean():+.2f} ± {d.std(ddof=1):.2f} | {(d>0).sum()}/3 |")
    for g, js in groups.items():
        if js is None: continue
        a = np.array([np.mean([rep[(s, "bl")]["judges"][j][k] for j in js]) for s in ("s0", "s1", "s2")])
        b = np.array([np.mean([rep[(s, "ltd")]["judges"][j][k] for j in js]) for s in ("s0", "s1", "s2")])
        d = b - a
        print(f"| mean of {g} | {a.mean():.2f} ± {a.std(ddof=1):.2f} | {b.mean():.2f} ± {b.std(ddof=1):.2f} | {d.mean():+.2f} ± {d.std(ddof=1):.2f} | {(d>0).sum()}/3 |")
for c in ("bl", "ltd"):
    print(c, "CIDEr-D", [rep[(s, c)]["CIDEr-D"] for s in ("s0", "s1", "s2")], "unique", [rep[(s, c)]["unique_%"] for s in ("s0","s1","s2")])
