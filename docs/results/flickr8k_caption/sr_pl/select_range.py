"""LOG.md §6c "Choosing the negatives' rank range on val": the rule of run.sh's `val` stage, applied.
    python select_range.py [VAL_FOLDER]   (default: ranges/val/; holds {kind}_s{seed}/report.json)
Each SR-PL range's captioner on the 1,000 val images (beam 5) under the seed's half judge (the teacher).
Rule, fixed before the runs: the highest mean val self-R@10 under the teacher, among ranges whose mean
val CIDEr-D is within 1.0 of the best range's. Prints the per-seed table and the choice."""
import json
import sys
from pathlib import Path

import numpy as np

RANGES = [("srpl_1to10", "ranks 1–10"), ("srpl", "ranks 10–100"), ("srpl_100to1000", "ranks 100–1000")]
SEEDS = ("s0", "s1", "s2")
CIDER_SLACK = 1.0


def load(root: Path) -> dict:
    out = {}
    for kind, _ in RANGES:
        for s in SEEDS:
            f = root / f"{kind}_{s}" / "report.json"
            if f.is_file():
                r = json.loads(f.read_text())
                out[kind, s] = {"cider": r["CIDEr-D"], "r1": r["judges"]["half"]["self_R@1"],
                                "r10": r["judges"]["half"]["self_R@10"], "unique": r["unique_%"]}
    return out


def choose(rows: dict) -> tuple[str, dict]:
    """{kind: {metric: mean over seeds}} of the ranges with every seed; the rule's choice."""
    means = {k: {m: float(np.mean([rows[k, s][m] for s in SEEDS])) for m in ("cider", "r1", "r10", "unique")}
             for k, _ in RANGES if all((k, s) in rows for s in SEEDS)}
    if not means:
        raise SystemExit("no range has val reports for every seed")
    best_cider = max(m["cider"] for m in means.values())
    eligible = {k: m for k, m in means.items() if m["cider"] >= best_cider - CIDER_SLACK}
    return max(eligible, key=lambda k: eligible[k]["r10"]), means


def main(root: Path) -> str:
    rows = load(root)
    chosen, means = choose(rows)
    names = dict(RANGES)
    lines = ["| negatives | " + " | ".join(f"seed {s[1]}: CIDEr-D / R@1 / R@10" for s in SEEDS)
             + " | mean CIDEr-D | mean self-R@1 | mean self-R@10 | mean unique_% |",
             "|---|" + "---:|" * (len(SEEDS) + 4)]
    for k, m in means.items():
        per = [f"{rows[k, s]['cider']:.1f} / {rows[k, s]['r1']:.1f} / {rows[k, s]['r10']:.1f}" for s in SEEDS]
        mark = " (chosen)" if k == chosen else ""
        lines.append(f"| {names[k]}{mark} | " + " | ".join(per)
                     + f" | {m['cider']:.2f} | {m['r1']:.2f} | {m['r10']:.2f} | {m['unique']:.1f} |")
    return "\n".join(lines) + f"\n\nchosen on val: {names[chosen]} ({chosen})"


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "ranges" / "val"))
