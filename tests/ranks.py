"""Run a function in W gloo processes (the tests' stand-in for torchrun): each process joins a process
group through a file in a temporary folder, runs ``fn(rank, world, *args)`` with one thread, and the
results come back by rank. A process that fails fails the call (torch.multiprocessing re-raises)."""
from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def run_ranks(fn, world: int, tmp: Path, *args) -> list:
    """``[fn(0, world, *args), …, fn(world-1, world, *args)]``, each computed in its own process."""
    tmp = Path(tmp) / f"ranks-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    torch.multiprocessing.spawn(_entry, args=(fn, world, str(tmp), args), nprocs=world, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(world)]  # plain results only


def _entry(rank: int, fn, world: int, tmp: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        result = fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    torch.save(result, f"{tmp}/rank{rank}.pt")
