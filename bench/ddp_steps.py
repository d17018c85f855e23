"""Data-parallel training steps: one process against N processes on the same global batch (not a test).

    python bench/ddp_steps.py [--nproc 1,2] [--steps 20] [--json OUT.json] [--write]      # the CPU, gloo
    python bench/ddp_steps.py --device cuda --json OUT.json                                # GPUs, NCCL
    python bench/ddp_steps.py --render OUT.json --write        # any machine: the BENCHMARKS.md section

Each configuration runs in a fresh process (or W of them): the loop's own ``set_up`` and ``train_step``
on the embedded synthetic scenes (``--config``, default ``synthetic_ltd``: cached features, bi-GRU,
InfoNCE + the LTD constraint, global batch 128; ``--set`` overrides), an untimed warm-up, then
``--steps`` timed steps (rank 0's wall clock between two barriers). Rows:

* ``1 process`` — plain, no process group (what most users run);
* ``1 process, DDP`` — a process group of one (gloo / NCCL) with DistributedDataParallel around the
  encoders: the wrapper's own cost;
* ``N processes`` — every ``--nproc`` above 1 (CUDA: default every visible GPU, one each), each taking
  1/N of the global batch and gathering the others' embeddings.

Beside the wall clock, rank 0's CPU time per step (its threads' own work, waiting excluded): on a CPU
shared with other work the wall clock measures the contention as much as the code, while the CPU time
shows how the work splits between the processes.

On the CPU every process gets ``--threads`` torch threads (default 1), so N processes use N cores. The
first step's loss of every row is reported beside the plain one's: the same global batch must give the
same loss. steps/s are comparable only within one run (same machine, same load).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = {"cpu": "## Data-parallel training steps (bench/ddp_steps.py)",
           "cuda": "## Data-parallel training steps on GPUs (bench/ddp_steps.py --device cuda)"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, grouped: bool, port: int, opts: dict, out: str) -> None:
    """One process of a configuration: joins the group as torchrun's processes do, then times steps."""
    if grouped:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    if opts["device"] == "cpu":
        torch.set_num_threads(opts["threads"])
    from training import distributed
    from training.device import set_device

    set_device(opts["device"])  # this process's, as a training run's rank sets it
    distributed.init_from_env(timeout_s=300)
    try:
        res = _time_steps(opts)
    finally:
        distributed.shutdown()
    if rank == 0:
        Path(out).write_text(json.dumps(res))


def _time_steps(opts: dict) -> dict:
    import torch.distributed as dist

    from training import distributed
    from training.config import load_config
    from training.data.global_batches import epoch_batches
    from training.loop import set_up, train_step
    from training.models.dual_encoder import StepEncoders
    from training.prepare import prepare

    rank = distributed.current()
    cfg = load_config(opts["config"], [*opts["set"], f"train.device={opts['device']}"])
    data = prepare(cfg)
    device = torch.device("cuda", torch.cuda.current_device()) if opts["device"] == "cuda" else torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        r = set_up(cfg, data, Path(tmp))
    r.encoders = distributed.data_parallel(StepEncoders(r.model))
    batches = epoch_batches(cfg.train.seed, 0, len(data.train_texts), cfg.train.batch_size, rank.world)
    losses = []

    def steps(first: int, n: int) -> None:
        for s in range(first, first + n):
            out, _ = train_step(r, batches[s % len(batches)], torch.Generator().manual_seed(s), None)
            losses.append(float(out["loss"].detach()))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
        if rank.grouped:
            dist.barrier()

    steps(0, opts["warmup"])
    sync()
    t, cpu = time.perf_counter(), time.process_time()
    steps(opts["warmup"], opts["steps"])
    sync()
    dt, dcpu = (time.perf_counter() - t) / opts["steps"], (time.process_time() - cpu) / opts["steps"]
    return {"ms_per_step": dt * 1000, "steps_per_s": 1 / dt, "cpu_ms_per_step": dcpu * 1000, "first_loss": losses[0],
            "global_batch": cfg.train.batch_size, "steps": opts["steps"]}


def run_config(world: int, grouped: bool, opts: dict) -> dict:
    """One row: ``world`` processes (a process group when ``grouped``), started fresh."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/rank0.json"
        torch.multiprocessing.spawn(_worker, args=(world, grouped, _free_port(), opts, out), nprocs=world, join=True)
        res = json.loads(Path(out).read_text())
    label = f"{world} processes" if world > 1 else ("1 process, DDP" if grouped else "1 process")
    print(f"  {label}: {res['ms_per_step']:.1f} ms/step ({res['steps_per_s']:.2f} steps/s), "
          f"first loss {res['first_loss']:.6f}", flush=True)
    return {"label": label, "nproc": world, "ddp": grouped, **res}


def render(res: dict) -> str:
    dev = res["device"]
    L = [SECTION[dev], "", f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}` "
         f"(load average before: {res['load1']:.1f}).", ""]
    per = f"{res['threads']} torch thread(s) per process" if dev == "cpu" else "one GPU per process, NCCL"
    L += [f"`{res['config']}` on the embedded scenes, global batch {res['rows'][0]['global_batch']}, "
          f"{res['rows'][0]['steps']} timed steps after a warm-up, {per}. Every row trains on the same "
          "global batches; its first loss is compared with the plain process's (a check, not a timing).", "",
          "| configuration | ms / step | steps / s | vs 1 process | rank 0 CPU ms / step | first-loss gap |",
          "|---|---:|---:|---:|---:|---:|"]
    base = res["rows"][0]
    for row in res["rows"]:
        L.append(f"| {row['label']} | {row['ms_per_step']:.1f} | {row['steps_per_s']:.2f} | "
                 f"{row['steps_per_s'] / base['steps_per_s']:.2f}× | {row.get('cpu_ms_per_step', float('nan')):.1f} | "
                 f"{row['first_loss'] - base['first_loss']:+.1e} |")
    return "\n".join(L + [""] + res.get("notes", []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--config", default="synthetic_ltd", help="training preset (default synthetic_ltd)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--nproc", help="comma-separated process counts above 1 (default: 2 on the CPU, every GPU)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process on the CPU")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--render", metavar="JSON", help="only render a results file")
    ap.add_argument("--write", action="store_true", help="replace the section in BENCHMARKS.md")
    a = ap.parse_args(argv)
    if a.render:
        res = json.loads(Path(a.render).read_text())
    else:
        res = measure(a)
    from bench._common import publish

    publish(SECTION[res["device"]], render(res), a.write)
    return 0


def measure(a: argparse.Namespace) -> dict:
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    gpus = torch.cuda.device_count() if a.device == "cuda" else 0
    counts = [int(n) for n in a.nproc.split(",")] if a.nproc else ([gpus] if gpus > 1 else [] if gpus else [2])
    opts = {"device": a.device, "config": a.config, "set": a.set, "steps": a.steps, "warmup": a.warmup,
            "threads": a.threads}
    res = {"device": a.device, "machine": machine_line(), "date": today(), "load1": load1(), "config": a.config,
           "threads": a.threads, "command": "python bench/ddp_steps.py " + " ".join(argv_of(a)), "rows": []}
    for world, grouped in [(1, False), (1, True), *((n, True) for n in counts if n > 1)]:
        res["rows"].append(run_config(world, grouped, opts))
    if a.json:
        from training.fsio import write_json_atomic

        write_json_atomic(a.json, res, indent=2)
    return res


def argv_of(a: argparse.Namespace) -> list[str]:
    out = [f"--device {a.device}"] + ([f"--config {a.config}"] if a.config != "synthetic_ltd" else [])
    out += [f"--set {s}" for s in a.set] + ([f"--nproc {a.nproc}"] if a.nproc else [])
    return out + [f"--steps {a.steps}"] + ([f"--threads {a.threads}"] if a.device == "cpu" else [])


if __name__ == "__main__":
    sys.exit(main())
