"""``ltd train --nproc N``: N data-parallel training processes on this machine, started and watched by
PyTorch's elastic agent — the launcher ``torchrun --standalone`` runs — so one machine and several
(``torchrun --nnodes M …``) take the same code path in the processes (:mod:`training.distributed`).

The agent is the watchdog: when a process dies (killed, out of memory, an exception), it stops the
others within about a second and this launcher exits non-zero; ``--resume`` continues from the last
checkpoint, on any number of processes. A process that hangs instead of dying is caught by the process
group's timeout (``--dist-timeout``): its peers' collectives fail and they exit.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("ltd.launch")


def check_nproc(nproc: int, device: str) -> None:
    """One process per GPU on CUDA; on the CPU any count (each takes a share of the cores)."""
    import torch

    from training.distributed import backend_for
    from training.errors import Unavailable, UserValueError

    if nproc < 1:
        raise UserValueError(f"--nproc must be >= 1, got {nproc}")
    if backend_for(device) == "nccl" and nproc > torch.cuda.device_count():
        raise Unavailable(f"--nproc {nproc} on CUDA needs {nproc} GPUs (one process per GPU); "
                         f"{torch.cuda.device_count()} visible")


def launch_local(nproc: int, module_args: list[str], *, device: str = "auto") -> int:
    """Run ``python -m app.cli <module_args>`` in ``nproc`` processes under the elastic agent; the exit
    status is 0 when every process succeeded, else the first failed process's (1 for a signal)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    check_nproc(nproc, device)
    if "OMP_NUM_THREADS" not in os.environ:  # the agent would set 1; on the CPU the processes share the cores
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)  # no rendezvous banners
    args = parse_args(["--standalone", f"--nproc-per-node={nproc}", "--monitor-interval=0.5",
                       "--module", "app.cli", *module_args])
    log.info("starting %d training processes (OMP_NUM_THREADS=%s each)", nproc, os.environ["OMP_NUM_THREADS"])
    try:
        run(args)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        first = next((c for c in codes if c and c > 0), 1)
        log.error("a training process failed (exit codes %s): the others were stopped; `ltd train --resume` "
                  "continues from the last checkpoint", codes)
        return first
    return 0
