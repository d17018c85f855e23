"""Statistics of the controls grid's finished runs while the grid still runs (issue 39).

    python docs/results/synthetic_small_batch_controls/partial_stats.py [GRID_OUT]

Reads the run folders of ``ltd experiment --config grids/synthetic_small_batch_controls.yaml`` and writes
partial.md next to this file: every finished run's val and test rsum, and the seed-matched comparisons with
the same statistics the grid's own results.md will carry (app/experiment_stats.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from app.experiment_stats import bootstrap_pair, seed_matched, verdict  # noqa: E402

OUT = Path(__file__).with_name("partial.md")
# the tuned baseline: the sweep's setting with the best val rsum on seed 0
CELLS = {"baseline": "baseline", "baseline_tuned": "baseline_tuned@tau=0.05,lr=2.5e-4", "ltd_constraint": "ltd_constraint"}
PAIRS = (("baseline", "baseline_tuned"), ("baseline_tuned", "ltd_constraint"), ("baseline", "ltd_constraint"))


def rsum(run: Path, split: str) -> float | None:
    f = run / split / "report.json"
    if not f.is_file():
        return None
    rep = json.loads(f.read_text())
    return rep.get("metrics", rep)["rsum"]


def main() -> None:
    indexes = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/runs/sci2/synthetic_small_batch_controls") / "indexes"
    runs = [{"cell": c, "seed": s, "index_root": str(indexes / d / f"seed{s}"),
             "reports": {"test": {"rsum": rsum(indexes / d / f"seed{s}", "test")}}}
            for c, d in CELLS.items() for s in (0, 1, 2)]
    results = {"runs": runs}
    lines = ["# synthetic_small_batch_controls: the runs finished so far (the grid still runs)", "",
             "`ltd experiment --config grids/synthetic_small_batch_controls.yaml --jobs 2 --set train.num_threads=1` from a "
             "clone of main at f1c0590, Intel Xeon VM (2 cores, shared). The grid's own results.md comes when it finishes.",
             "", "| run | val rsum | test rsum |", "|---|---:|---:|"]
    for run in sorted(p for p in indexes.glob("*/seed*")):
        val, test = rsum(run, "val"), rsum(run, "test")
        if val is not None and test is not None:
            lines.append(f"| {run.relative_to(indexes)} | {val:.1f} | {test:.1f} |")
    lines += ["", "| test rsum | " + " | ".join(CELLS) + " |", "|---|" + "---:|" * len(CELLS),
              "| mean ± sd (seeds 0–2) | " + " | ".join(
                  f"{np.mean(v):.1f} ± {np.std(v, ddof=1):.1f}"
                  for v in ([r["reports"]["test"]["rsum"] for r in runs if r["cell"] == c] for c in CELLS)) + " |",
              "", "| cell − reference | Δ per seed | mean ± sd | 95 % t (seeds) | 95 % CI (images, paired bootstrap) | verdict |",
              "|---|---|---:|---:|---:|---|"]
    for ref, cell in PAIRS:
        sm, b = seed_matched(results, "test", ref, cell), bootstrap_pair(results, "test", ref, cell)["rsum"]
        lines.append(f"| {cell} − {ref} | {', '.join(f'{v:+.1f}' for v in sm['values'])} | {sm['mean']:+.1f} ± {sm['std']:.1f} "
                     f"| [{sm['lo']:+.1f}, {sm['hi']:+.1f}] | [{b['lo']:+.1f}, {b['hi']:+.1f}] | {verdict(sm, b)} |")
    OUT.write_text("\n".join(lines) + "\n")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
