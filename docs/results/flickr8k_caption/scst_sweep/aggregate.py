"""LOG.md §6c "Making SCST move": val CIDEr-D (greedy, ×100) after each SCST epoch of every sweep
variant, the best epoch, seconds per epoch and the sampled captions' mean CIDEr-D reward over the
first and the last 100 steps.   python aggregate.py runs/cap/scst_sweep > sweep.md"""
import json
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/cap/scst_sweep")
print("| variant | val CIDEr-D by epoch (0 = XE) | best | s / epoch | sample reward first → last 100 steps |")
print("|---|---|---:|---:|---|")
for run in sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file()):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["cider"] for r in rows if r["type"] == "val"]
    secs = [r["seconds"] for r in rows if r["type"] == "epoch"]
    steps = [r for r in rows if r["type"] == "step"]
    first = [r["cider"] for r in steps if r["step"] <= 100]
    last = [r["cider"] for r in steps if r["step"] > steps[-1]["step"] - 100]
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    print(f"| {run.name} | {' / '.join(f'{v:.1f}' for v in val)} | {max(val[1:], default=float('nan')):.1f} | "
          f"{mean(secs):.0f} | {mean(first):.3f} → {mean(last):.3f} |")
