"""``--nproc`` and ``--dist-timeout`` of the training commands (``ltd train``, ``ltd caption train``) and
the arguments each launched process runs. Kept apart from :mod:`app.launch`, which starts the processes,
so that building the parser (``ltd --help``) needs no torch."""
from __future__ import annotations

import argparse
from pathlib import Path

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
