"""RESULTS "The captioning demo": the scene captioners over 3 seeds.
    python aggregate.py CAP_DIR val          every setting on val, and the setting the rule chooses
    python aggregate.py CAP_DIR test SET     the chosen setting on test (CAP_DIR/test/RUN/report.json)
The rule, fixed before the runs: the setting with the largest mean val Δ self-R@10 under the referee
(SR-FL with the baseline judge − CIDEr-only SCST, seed-matched), among settings whose SR-FL mean val
CIDEr-D is within 2.0 of its control's (findability bought by wrecking the captions is not chosen)."""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "flickr8k_caption"))
from caption_table import table  # noqa: E402

CONTROL = {"A": "A", "B": "B", "C": "B", "D": "D"}  # alpha changes SR-FL only: C's control is B's
COLS = [("CIDEr-D", None), ("unique_%", None), ("self_R@1", "referee"), ("self_R@10", "referee"),
        ("self_R@10", "bl"), ("mean_length", None)]


def reports(root: Path, run: str) -> dict:
    return {s: json.load(open(root / f"{run}_{s}" / "report.json")) for s in ("s0", "s1", "s2")
            if (root / f"{run}_{s}" / "report.json").is_file()}


def choose(root: Path) -> str | None:
    best = None
    for x in CONTROL:
        sr, cid = reports(root, f"srbl_{x}"), reports(root, f"scst_{CONTROL[x]}")
        seeds = sorted(set(sr) & set(cid))
        if len(seeds) < 3:
            continue
        d10 = np.mean([sr[s]["judges"]["referee"]["self_R@10"] - cid[s]["judges"]["referee"]["self_R@10"] for s in seeds])
        gap = np.mean([sr[s]["CIDEr-D"] for s in seeds]) - np.mean([cid[s]["CIDEr-D"] for s in seeds])
        print(f"setting {x}: val Δ self-R@10 (referee) {d10:+.2f}, SR-FL − control CIDEr-D {gap:+.2f}")
        if gap >= -2.0 and (best is None or d10 > best[1]):
            best = (x, d10)
    return best and best[0]


def main() -> None:
    cap, split = Path(sys.argv[1]), sys.argv[2]
    root = cap / split
    if split == "val":
        kinds = [("xe", "XE")] + [(f"{k}_{x}", f"{label}, setting {x}") for x in CONTROL
                                  for k, label in (("scst", "CIDEr-only"), ("srbl", "SR-FL bl"), ("srltd", "SR-FL ltd"))]
        kinds = [k for k in kinds if reports(root, k[0])]
        pairs = [(f"srbl_{x}", f"scst_{CONTROL[x]}") for x in CONTROL if reports(root, f"srbl_{x}")]
        print(table(root, kinds, COLS, pairs, interval=True))
        print("chosen:", choose(root))
    else:
        x = sys.argv[3]
        kinds = [("xe", "XE"), (f"scst_{CONTROL[x]}", "SCST, CIDEr-D only"), (f"srbl_{x}", "SR-FL, baseline judge"),
                 (f"srltd_{x}", "SR-FL, LTD judge")]
        pairs = [(f"srbl_{x}", f"scst_{CONTROL[x]}"), (f"srltd_{x}", f"scst_{CONTROL[x]}"), (f"scst_{CONTROL[x]}", "xe")]
        print(table(root, kinds, COLS, pairs, interval=True))


if __name__ == "__main__":
    main()
