"""Training steps under bf16 autocast on the CPU vs fp32 (``train.cpu_amp``), same batches.

    LTD_DATA_DIR=/path/to/flickr8k python bench/cpu_amp_steps.py [--steps 20] [--write]
        [--config flickr8k_tern_ltd --config flickr8k_vsrn_ltd --config flickr8k_baseline]

For each preset: the data and caches are prepared once (not timed), then fp32 and bf16 alternate
(fp32, bf16, fp32, bf16) on the same first ``--steps`` batches of epoch 1 from the same initial
model, after one untimed pass over those batches (kernels, allocator). Each measurement builds a fresh
model, so TERN's steps include its frozen MiniLM layers on the step's captions, as in a first epoch
(later epochs remember them and are faster). Reported: the best ms per step of each, their ratio, and the gap between the two
precisions' mean loss over the timed steps. Where the CPU has no native bf16 (AVX512-BF16 / AMX),
bf16 is emulated and slower: ``train.cpu_amp=auto`` keeps fp32 there. With ``--write`` the table
replaces the section "## CPU training under bf16 autocast" in BENCHMARKS.md.
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

SECTION = "## CPU training under bf16 autocast (bench/cpu_amp_steps.py)"
DEFAULT = ["flickr8k_tern_ltd", "flickr8k_vsrn_ltd", "flickr8k_baseline"]


def time_steps(r, data, batches, n: int) -> tuple[float, float]:
    """(seconds per step, mean loss) over the first ``n`` batches."""
    from training.loop import train_step

    t, losses = time.perf_counter(), []
    for s in range(n):
        out, _ = train_step(r, batches[s], torch.Generator().manual_seed(s), None)
        losses.append(float(out["loss"].detach()))
    return (time.perf_counter() - t) / n, sum(losses) / n


def bench_preset(config: str, n: int, extra: tuple[str, ...] = ()) -> dict:
    from training.config import load_config
    from training.loop import epoch_batches, set_up
    from training.prepare import prepare

    data, res = None, {"config": config, "fp32": [], "bf16": [], "loss": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i, amp in enumerate(["fp32", "bf16", "fp32", "bf16"]):
            cfg = load_config(config, [*extra, f"train.cpu_amp={amp}"])
            data = data or prepare(cfg)
            batches = epoch_batches(cfg.train.seed, 0, len(data.train_texts), cfg.train.batch_size)
            if i == 0:  # untimed pass: warms kernels and the allocator
                time_steps(set_up(cfg, data, Path(tmp)), data, batches, n)
            torch.manual_seed(0)
            dt, loss = time_steps(set_up(cfg, data, Path(tmp)), data, batches, n)
            res[amp].append(dt)
            res["loss"][amp] = loss
            print(f"  {amp}: {dt * 1000:.0f} ms/step, mean loss {loss:.4f}", flush=True)
    res["family"] = cfg.model.image_encoder
    return res


def render(res: dict) -> str:
    lines = [SECTION, "",
             f"Machine: {res['machine']}. Native bf16: {res['native_bf16']}. Date: {res['date']}. Command: "
             f"`{res['command']}` (torch threads: {res['threads']}; load average before: {res['load']:.1f}).", "",
             f"The first {res['steps']} training steps of epoch 1 (batch 128, cached features), fp32 and bf16 autocast "
             "alternating from the same initial model; best of 2 each. Loss gap: mean loss over those steps, "
             "bf16 − fp32. Each measurement builds a fresh model, so TERN's steps include its frozen MiniLM "
             "layers (a first epoch's cost; later epochs remember them).", "",
             "| preset | family | fp32 ms/step | bf16 ms/step | speed-up | loss gap |", "|---|---|---:|---:|---:|---:|"]
    for r in res["runs"]:
        a, b = min(r["fp32"]), min(r["bf16"])
        lines.append(f"| `{r['config']}` | {r['family']} | {a * 1000:.0f} | {b * 1000:.0f} | {a / b:.2f}× | "
                     f"{r['loss']['bf16'] - r['loss']['fp32']:+.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from training.models.backbones import cpu_bf16_fast

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", action="append", default=[], help=f"preset (repeatable; default {' '.join(DEFAULT)})")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    if not os.environ.get("LTD_DATA_DIR"):
        p.error("set LTD_DATA_DIR to the Flickr8k folder")
    res = {"machine": machine_line(), "native_bf16": cpu_bf16_fast(), "date": today(),
           "threads": torch.get_num_threads(), "load": load1(), "steps": args.steps,
           "command": "python " + " ".join(["bench/cpu_amp_steps.py", *(argv if argv is not None else sys.argv[1:])]),
           "runs": []}
    for config in args.config or DEFAULT:
        print(f"{config} …", flush=True)
        res["runs"].append(bench_preset(config, args.steps))
        print(json.dumps(res["runs"][-1]), flush=True)
    text = render(res)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
