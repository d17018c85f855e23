"""Comparisons across the controls grid's cells that its own results.md does not pair (issue 39).

    python docs/results/synthetic_small_batch_controls/cross_pairs.py [GRID_OUT]

Reads GRID_OUT/results.json of ``ltd experiment --config grids/synthetic_small_batch_controls.yaml`` (its
runs' index folders must still be there: the image bootstrap re-reads each run's per-query ranks) and
writes cross_pairs.md next to this file, with the statistics of the grid's own table
(app/experiment_stats.py): seed-matched Δ test rsum with a t-interval over seeds, the paired image
bootstrap, and the verdict rule.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from app.experiment_stats import bootstrap_pair, seed_matched, verdict  # noqa: E402

OUT = Path(__file__).with_name("cross_pairs.md")
# (reference, cell, what it asks)
PAIRS = (
    ("ltd_constraint", "baseline_batch128_steps",
     "the demo's LTD (batch 16) against a batch-128 baseline given the same 7,500 updates"),
    ("baseline_tuned", "baseline_batch128_steps", "the tuned batch-16 baseline against the same"),
    ("ltd_constraint", "ltd_batch128_steps", "LTD at batch 128 for the same updates against LTD at batch 16"),
    ("ltd_batch128", "ltd_batch128_steps", "LTD at batch 128: 80 epochs (scaled lr) against 10"),
)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/runs/sci2/synthetic_small_batch_controls")
    results = json.loads((out / "results.json").read_text())
    lines = ["# synthetic_small_batch_controls: comparisons across cells", "",
             "Written by `cross_pairs.py` from the grid's results.json (test split; Δ = cell − reference, seed-matched; "
             "95 % t-interval over seeds; 95 % paired bootstrap over the test images, each with its captions; "
             "**ahead/behind** only when both exclude 0).", "",
             "| cell − reference | question | Δ rsum per seed | mean ± sd | 95 % t (seeds) | 95 % CI (images) | verdict |",
             "|---|---|---|---:|---:|---:|---|"]
    for ref, cell, what in PAIRS:
        sm = seed_matched(results, "test", ref, cell)
        if sm is None:
            lines.append(f"| {cell} − {ref} | {what} | – | – | – | – | not measured |")
            continue
        b = bootstrap_pair(results, "test", ref, cell)["rsum"]
        lines.append(f"| {cell} − {ref} | {what} | {', '.join(f'{v:+.1f}' for v in sm['values'])} | "
                     f"{sm['mean']:+.1f} ± {sm['std']:.1f} | [{sm['lo']:+.1f}, {sm['hi']:+.1f}] | "
                     f"[{b['lo']:+.1f}, {b['hi']:+.1f}] | {verdict(sm, b)} |")
    OUT.write_text("\n".join(lines) + "\n")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
