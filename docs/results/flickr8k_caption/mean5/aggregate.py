"""RESULTS §6c "SCST that moves": mean ± std over seeds of every captioner's test report, and the
seed-matched differences SCST − XE and SR-FL − SCST.   python aggregate.py [EVAL_FOLDER]
(EVAL_FOLDER holds {xe,scst,srfl_bl,srfl_ltd}_s{0,1,2}/report.json; default: this folder)."""
import json
import sys
from pathlib import Path

import numpy as np

R = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
SEEDS = ("s0", "s1", "s2")
KINDS = [("xe", "XE"), ("scst", "SCST, CIDEr-D only"), ("srfl_bl", "SR-FL, baseline judge"),
         ("srfl_bl_a4", "SR-FL, baseline judge, α 4"),
         ("srfl_ltd", "SR-FL, LTD judge")]
COLS = [("BLEU-4", None), ("METEOR", None), ("ROUGE-L", None), ("CIDEr-D", None), ("unique_%", None),
        ("novel_%", None), ("mean_length", None), ("self_R@1", "bl"), ("self_R@10", "bl"), ("self_R@1", "ltd"), ("self_R@10", "ltd")]


def value(rep, key, judge):
    return rep[key] if judge is None else rep["judges"][judge][key]


reps = {k: [json.load(open(R / f"{k}_{s}" / "report.json")) for s in SEEDS if (R / f"{k}_{s}" / "report.json").is_file()]
        for k, _ in KINDS}
head = [k if j is None else f"{k} ({j} judge)" for k, j in COLS]
print("| captioner | seeds | " + " | ".join(head) + " |")
print("|---|---:|" + "---:|" * len(COLS))
for k, name in KINDS:
    if not reps[k]:
        continue
    cells = []
    for key, j in COLS:
        v = np.array([value(r, key, j) for r in reps[k]])
        cells.append(f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v[0]:.1f}")
    print(f"| {name} | {len(reps[k])} | " + " | ".join(cells) + " |")
for a, b in (("scst", "xe"), ("srfl_bl", "scst"), ("srfl_bl_a4", "scst"), ("srfl_ltd", "scst"), ("srfl_ltd", "srfl_bl")):
    n = min(len(reps[a]), len(reps[b]))
    if n == 0:
        continue
    cells = []
    for key, j in COLS:
        d = np.array([value(reps[a][i], key, j) - value(reps[b][i], key, j) for i in range(n)])
        sd = f" ± {d.std(ddof=1):.1f}" if n > 1 else ""
        cells.append(f"{d.mean():+.1f}{sd} ({(d > 0).sum()}/{n})")
    print(f"| Δ {a} − {b} | {n} | " + " | ".join(cells) + " |")
