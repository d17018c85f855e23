"""Training time per epoch of each encoder family on Flickr8k with cached features (issue 21).

    LTD_DATA_DIR=/path/to/flickr8k python bench/reasoning_epochs.py [--epochs 2] [--threads 1] [--write]
        [--config flickr8k_baseline --config flickr8k_vsrn_ltd --config flickr8k_tern_ltd]

Trains each preset for ``--epochs`` epochs into a temporary folder (features, LTD targets and the
grid cache are computed first when missing and are not timed) and reports the seconds of every
epoch as the run logged them (training steps only; validation is timed separately), the steps per
second, and the 1-minute load average before and after each run: other jobs on a shared machine
slow every number here, so the load is part of the result. The first epoch of the TERN presets also
runs the frozen MiniLM layers once per caption (they are remembered for later epochs), so the
second epoch is the steady state. With ``--write`` the table replaces the section
"## Reasoning encoders: training time per epoch" in BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.hf_env import set_hf_environment  # noqa: E402

set_hf_environment()  # before torch and transformers load

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = "## Reasoning encoders: training time per epoch (bench/reasoning_epochs.py)"
DEFAULT = ["flickr8k_baseline", "flickr8k_vsrn_ltd", "flickr8k_tern_ltd"]


def time_preset(config: str, epochs: int) -> dict:
    from app.pipeline import train_run
    from training.config import load_config
    from training.prepare import prepare

    cfg = load_config(config, [f"train.epochs={epochs}"])
    data = prepare(cfg)  # caches (grid features, targets) outside the timing
    del data
    with tempfile.TemporaryDirectory() as tmp:
        before, t = load1(), time.perf_counter()
        train_run(cfg, Path(tmp) / "run")
        wall, after = time.perf_counter() - t, load1()
        rows = [json.loads(ln) for ln in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    ep = [r for r in rows if r["type"] == "epoch"]
    steps = ep[-1]["step"] // len(ep)
    return {"config": config, "epoch_s": [round(r["seconds"], 1) for r in ep], "steps_per_epoch": steps,
            "wall_s": round(wall, 1), "load_before": round(before, 2), "load_after": round(after, 2),
            "batch_size": cfg.train.batch_size, "family": cfg.model.image_encoder}


def render(res: dict) -> str:
    lines = [SECTION, "",
             f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}` "
             f"(torch threads: {res['threads']}; `nice -n 10`: {res['niced']}).", "",
             "One run per preset on Flickr8k train (30,000 captions, batch 128, cached features). Epoch times are "
             "the training steps only (as `metrics.jsonl` logs them); 'wall' adds data loading, the untrained "
             "and per-epoch validations. **The machine is shared**: the 1-minute load average before and after "
             "each run says how many other jobs competed for its 2 cores.", "",
             "| preset | family | epoch times (s) | s per step (last epoch) | wall (s) | load before → after |",
             "|---|---|---|---:|---:|---|"]
    for r in res["runs"]:
        lines.append(f"| `{r['config']}` | {r['family']} | {' / '.join(f'{s:.0f}' for s in r['epoch_s'])} | "
                     f"{r['epoch_s'][-1] / r['steps_per_epoch']:.2f} | {r['wall_s']:.0f} | "
                     f"{r['load_before']:.1f} → {r['load_after']:.1f} |")
    base = next((r for r in res["runs"] if r["family"] == "head"), None)
    if base:
        ratios = ", ".join(f"{r['config']} {r['epoch_s'][-1] / base['epoch_s'][-1]:.1f}×" for r in res["runs"]
                           if r is not base)
        lines += ["", f"Last epoch relative to `{base['config']}` in the same invocation: {ratios}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", action="append", default=[], help=f"preset (repeatable; default {' '.join(DEFAULT)})")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    if not os.environ.get("LTD_DATA_DIR"):
        p.error("set LTD_DATA_DIR to the Flickr8k folder")
    if args.threads:
        torch.set_num_threads(args.threads)
    res = {"machine": machine_line(), "date": today(), "threads": torch.get_num_threads(), "niced": os.nice(0) > 0,
           "command": "python " + " ".join(["bench/reasoning_epochs.py", *(argv if argv is not None else sys.argv[1:])]),
           "runs": []}
    for config in args.config or DEFAULT:
        print(f"{config} …", flush=True)
        res["runs"].append(time_preset(config, args.epochs))
        print(json.dumps(res["runs"][-1]), flush=True)
    text = render(res)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
