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

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from training import distributed
from training.errors import Unavailable, UserValueError

log = logging.getLogger("ltd.launch")


def data_parallel_command(args: argparse.Namespace, device: str, worker_argv: list[str],
                          body: Callable[[], object]) -> tuple[int, object | None]:
    """A training command under ``--nproc`` / torchrun. ``--nproc N``: start N processes that run
    ``worker_argv`` and return (their exit status, None). Otherwise (alone, or one of a launcher's
    processes): join the group, run ``body()`` and return (0, its result) — the result on rank 0 only,
    the one process that reports (None on the others)."""
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
    if nproc < 1:
        raise UserValueError(f"--nproc must be >= 1, got {nproc}")
    if distributed.backend_for(device) == "nccl" and nproc > torch.cuda.device_count():
        raise Unavailable(f"--nproc {nproc} on CUDA needs {nproc} GPUs (one process per GPU); "
                          f"{torch.cuda.device_count()} visible (--set train.device=cpu trains on the CPU)")


def launch_local(nproc: int, module_args: list[str], *, device: str = "auto") -> int:
    """Run ``python -m app.cli <module_args>`` in ``nproc`` processes under the elastic agent; the exit
    status is 0 when every process succeeded, else the first failed process's (1 for a signal)."""
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
