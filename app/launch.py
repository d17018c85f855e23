"""``ltd train --nproc N``: N data-parallel training processes on this machine, started and watched by
PyTorch's elastic agent — the launcher ``torchrun --standalone`` runs — so one machine and several
(``torchrun --nnodes M …``) take the same code path in the processes (:mod:`training.distributed`).

The agent is the watchdog: when a process dies (killed, out of memory, an exception), it stops the
others within about a second and this launcher exits non-zero; ``--resume`` continues from the last
checkpoint, on any number of processes. A process that hangs instead of dying is caught by the process
group's timeout (``--dist-timeout``): its peers' collectives fail and they exit.
"""
from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("ltd.launch")
DEFAULT_TIMEOUT_S = 1800.0  # = training.distributed.DEFAULT_TIMEOUT_S (not imported: `ltd --help` stays torch-free)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--nproc`` and ``--dist-timeout`` of a training command."""
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel processes on this machine (gloo on the CPU, NCCL with one GPU each on CUDA); "
                        "the batch size stays the global batch. Several machines: torchrun … -m app.cli …")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="data parallel: how long a process waits for a silent peer before it gives up and exits "
                        "(it must cover rank 0's validation; default %(default)s)")


def worker_args(args: argparse.Namespace, command: list[str], out: Path, extra: list[str] = ()) -> list[str]:
    """The arguments each launched process runs: ``command`` with the caller's own (all but ``--nproc``)."""
    argv = [*command, "--out", str(out), "--dist-timeout", str(args.dist_timeout), *extra]
    argv += ["--config", args.config] if args.config else []
    for s in args.set:
        argv += ["--set", s]
    return argv + ["--resume"] * args.resume + ["--no-progress"] * args.no_progress + ["-v"] * getattr(args, "verbose", False)


def data_parallel_command(args: argparse.Namespace, device: str, worker_argv: list[str],
                          body: Callable[[], object]) -> tuple[int, object | None]:
    """A training command under ``--nproc`` / torchrun. ``--nproc N``: start N processes that run
    ``worker_argv`` and return (their exit status, None). Otherwise (alone, or one of a launcher's
    processes): join the group, run ``body()`` and return (0, its result) — the result on rank 0 only,
    the one process that reports (None on the others)."""
    from training import distributed
    from training.errors import UserValueError

    if distributed.launched() and args.nproc > 1:
        raise UserValueError("--nproc starts processes itself: under torchrun, --nproc-per-node sets the count")
    if args.nproc > 1:
        return launch_local(args.nproc, worker_argv, device=device), None
    rank = distributed.init_from_env(device, args.dist_timeout)  # a no-op unless launched
    try:
        result = body()
    finally:
        distributed.shutdown()
    return 0, result if rank.main else None


def check_nproc(nproc: int, device: str) -> None:
    """One process per GPU on CUDA; on the CPU any count (each takes a share of the cores)."""
    import torch

    from training.distributed import backend_for
    from training.errors import Unavailable, UserValueError

    if nproc < 1:
        raise UserValueError(f"--nproc must be >= 1, got {nproc}")
    if backend_for(device) == "nccl" and nproc > torch.cuda.device_count():
        raise Unavailable(f"--nproc {nproc} on CUDA needs {nproc} GPUs (one process per GPU); "
                          f"{torch.cuda.device_count()} visible (--set train.device=cpu trains on the CPU)")


def launch_local(nproc: int, module_args: list[str], *, device: str = "auto") -> int:
    """Run ``python -m app.cli <module_args>`` in ``nproc`` processes under the elastic agent; the exit
    status is 0 when every process succeeded, else the first failed process's (1 for a signal)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    check_nproc(nproc, device)
    threads = os.environ.get("OMP_NUM_THREADS")  # the processes inherit the environment: set it for them only
    if threads is None:  # the agent would set 1; on the CPU the processes share the cores
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)  # no rendezvous banners
    args = parse_args(["--standalone", f"--nproc-per-node={nproc}", "--monitor-interval=0.5",
                       "--module", "app.cli", *module_args])
    log.info("starting %d training processes (OMP_NUM_THREADS=%s each)", nproc, os.environ["OMP_NUM_THREADS"])
    try:
        run(args)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        log.error("a training process failed (exit codes %s): the others were stopped; --resume continues from "
                  "the last checkpoint", codes)
        return next((c for c in codes if c and c > 0), 1)
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return 0
