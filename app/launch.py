"""``ltd train --nproc N``: N data-parallel training processes on this machine, started and watched by
PyTorch's elastic agent — the launcher ``torchrun --standalone`` runs — so one machine and several
(``torchrun --nnodes M …``) take the same code path in the processes (:mod:`training.distributed`).

The agent is the watchdog: when a process dies (killed, out of memory, an exception), it stops the
others within about a second and this launcher exits non-zero; ``--resume`` continues from the last
checkpoint, on any number of processes. A process that hangs instead of dying is caught by the process
group's timeout (``--dist-timeout``): its peers' collectives fail and they exit.

Every socket of a local run listens on 127.0.0.1 only. torch's TCPStore servers (the agent's rendezvous
store and the store the processes share) bind every interface whatever host they are given, with no
authentication: ``loopback_stores`` hands each one a socket already bound to the loopback address
(TCPStore's ``master_listen_fd``), the agent advertises 127.0.0.1 (``--local-addr``), and gloo's pairs
use the loopback device. A multi-machine run (``torchrun --nnodes M …``) is the user's choice of
addresses: docs/guides/distributed.md says what to firewall.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend
from torch.distributed.run import parse_args, run

from training import distributed
from training.device import default_device
from training.errors import Unavailable, UserValueError

log = logging.getLogger("ltd.launch")


def data_parallel_command(args: argparse.Namespace, worker_argv: list[str],
                          body: Callable[[], object]) -> tuple[int, object | None]:
    """A training command under ``--nproc`` / torchrun, on the process's device (``training.device``: the
    command sets it from ``train.device``). ``--nproc N``: start N processes that run
    ``worker_argv`` and return (their exit status, None). Otherwise (alone, or one of a launcher's
    processes): join the group, run ``body()`` and return (0, its result) — the result on rank 0 only,
    the one process that reports (None on the others)."""
    if distributed.launched() and args.nproc > 1:
        raise UserValueError("--nproc starts processes itself: under torchrun, --nproc-per-node sets the count")
    if args.nproc > 1:
        return launch_local(args.nproc, worker_argv), None
    rank = distributed.init_from_env(args.dist_timeout)  # a no-op unless launched
    try:
        result = body()
    except BaseException:
        distributed.shutdown()
        raise
    distributed.shutdown(clean=True)
    if rank.grouped and not rank.main:
        leave_quietly()  # rank 0 reports; the others are done
    return 0, result if rank.main else None


def leave_quietly() -> None:
    """Exit 0 now, skipping interpreter teardown: a finished worker rank has written everything (its files
    are committed atomically) and has nothing to report, while the destructors of torch's and gloo's
    background threads can abort a process at exit under load ("terminate called without an active
    exception"), which the agent would count as a failed run."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def check_nproc(nproc: int) -> None:
    """One process per GPU on CUDA (the process's device: ``training.device``); on the CPU any count
    (each takes a share of the cores)."""
    if nproc < 1:
        raise UserValueError(f"--nproc must be >= 1, got {nproc}")
    if distributed.backend_for(default_device()) == "nccl" and nproc > torch.cuda.device_count():
        raise Unavailable(f"--nproc {nproc} on CUDA needs {nproc} GPUs (one process per GPU); "
                          f"{torch.cuda.device_count()} visible (--set train.device=cpu trains on the CPU)")


LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def loopback_stores() -> Iterator[None]:
    """While active, every TCPStore *server* made in this process listens on 127.0.0.1 only: the socket
    is bound here and passed to TCPStore as ``master_listen_fd`` (clients are unchanged)."""
    real = dist.TCPStore

    def store(host_name: str, port: int, *args, is_master: bool = False, **kwargs):
        if is_master and kwargs.get("master_listen_fd") is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOOPBACK, int(port)))
            sock.listen(4096)
            port, kwargs["master_listen_fd"] = sock.getsockname()[1], sock.detach()
        return real(host_name, port, *args, is_master=is_master, **kwargs)

    modules = [dist, c10d_rendezvous_backend]
    saved = [m.TCPStore for m in modules]
    for m in modules:
        m.TCPStore = store
    try:
        yield
    finally:
        for m, old in zip(modules, saved):
            m.TCPStore = old


def launch_local(nproc: int, module_args: list[str]) -> int:
    """Run ``python -m app.cli <module_args>`` in ``nproc`` processes under the elastic agent, for the
    process's device (``training.device``; each process sets its own from the config it is handed); the
    exit status is 0 when every process succeeded, else the first failed process's (1 for a signal)."""
    check_nproc(nproc)
    threads = os.environ.get("OMP_NUM_THREADS")  # the processes inherit the environment: set it for them only
    if threads is None:  # the agent would set 1; on the CPU the processes share the cores
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)  # no rendezvous banners
    args = parse_args(["--standalone", f"--nproc-per-node={nproc}", "--monitor-interval=0.5",
                       f"--local-addr={LOOPBACK}", "--module", "app.cli", *module_args])
    args.rdzv_endpoint = f"{LOOPBACK}:0"  # --standalone's "localhost:0" may resolve to ::1 or another name
    log.info("starting %d training processes (OMP_NUM_THREADS=%s each)", nproc, os.environ["OMP_NUM_THREADS"])
    if "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the processes' own connections, loopback only
    try:
        with loopback_stores():
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
