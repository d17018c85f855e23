"""Data-parallel training on torch.distributed: the process group, and the collectives the losses and
the loop need to keep a contrastive batch whole.

Launch: ``ltd train --nproc N`` (one machine) or ``torchrun --nproc-per-node N --nnodes M … -m app.cli
train …``; either sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, and
:func:`init_from_env` joins the group: NCCL with one GPU per process on CUDA, gloo on the CPU.

Why this is not plain data parallelism. In-batch negatives are what a contrastive loss learns from:
splitting a batch of 128 over 4 processes must not become four batches of 32. So every process

* encodes its own part of the global batch (:class:`training.data.global_batches.Shard`),
* gathers every process's embeddings (:func:`gather_rows`: no gradient through the collective; its own
  rows are put back with theirs, open_clip's ``gather_features`` without ``gather_with_grad``),
* computes the contrastive loss of the **global** batch — InfoNCE, the hinge losses' hardest negative,
  IFM and order losses see exactly the scores one process would — whose gradient w.r.t. its own rows
  is its share of the global gradient.

DistributedDataParallel then *averages* the W processes' parameter gradients, while the global
gradient is their *sum*: :func:`scale_gradient` multiplies the contrastive term's gradient by W and
leaves its value alone. Reconstruction terms (LTD's 1 − cos, ITD's NLL) are per-caption means over a
process's own rows: :func:`mean_over_ranks` returns the global mean (all-reduced, weighted by each
part's size) as the value — so the constraint's λ, stepped from it, is the same on every process — and
sends the gradient to the local mean, weighted so that DDP's average is the global mean's gradient.
With one process and no process group none of this runs: the loss is computed exactly as before.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from training.data.global_batches import Shard
from training.device import default_device
from training.errors import Unavailable
from training.progress import set_progress

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0  # a collective waits this long for a silent peer (rank 0 validating, a hung GPU)


@dataclass(frozen=True)
class Rank:
    """This process's place in the group (rank 0 of 1 without a process group)."""

    rank: int = 0
    world: int = 1
    grouped: bool = False  # a process group is up (DDP wraps the model, collectives run; also with W = 1)

    @property
    def main(self) -> bool:
        """The one process that writes checkpoints, metrics and progress."""
        return self.rank == 0

    def shard(self, n: int) -> Shard:
        return Shard.of(n, self.rank, self.world)


def launched() -> bool:
    """Started by torchrun / ``ltd train --nproc`` (the launcher's variables are in the environment)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def current() -> Rank:
    """This process's place: from the process group when one is up."""
    if not (dist.is_available() and dist.is_initialized()):
        return Rank()
    return Rank(dist.get_rank(), dist.get_world_size(), grouped=True)


def backend_for(device: str) -> str:
    """NCCL when the processes train on CUDA, gloo on the CPU (``device``: a torch device name or "auto")."""
    cuda = torch.cuda.is_available() if device == "auto" else torch.device(device).type == "cuda"
    return "nccl" if cuda else "gloo"


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> Rank:
    """Join the process group the launcher described in the environment (a no-op when it did not, or
    when the group is up already), with the backend of the process's device (``training.device``). On
    CUDA each process takes the GPU ``LOCAL_RANK`` (torch's current device: "cuda" in this process is
    that GPU); a collective that waits more than ``timeout_s`` for a peer (one that died or hangs) raises
    instead of hanging forever."""
    if not launched() or (dist.is_available() and dist.is_initialized()):
        return current()
    if not dist.is_available():
        raise Unavailable("this PyTorch build has no torch.distributed: train with one process")
    backend = backend_for(default_device())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    kwargs = {}
    if backend == "nccl":
        if local_rank >= torch.cuda.device_count():
            raise Unavailable(f"process LOCAL_RANK={local_rank} has no GPU: {torch.cuda.device_count()} visible "
                               "(one process per GPU: --nproc-per-node at most the GPU count)")
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    r = current()
    if not r.main:  # one voice: the other processes only warn, and show no progress
        logging.getLogger().setLevel(max(logging.getLogger().level, logging.WARNING))
        set_progress(False)
    log.info("process group up: %d processes (%s), timeout %.0f s", r.world, backend, timeout_s)
    return r


def shutdown(*, clean: bool = False) -> None:
    """Leave the process group. ``clean``: every rank finished its work (the success path), so they meet
    at a barrier first and none tears its connections down while a peer still uses them (gloo aborts a
    process whose peer vanished mid-teardown). After a failure no barrier: a dead peer would never come."""
    if dist.is_available() and dist.is_initialized():
        if clean and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


# ---- the collectives of a step ---------------------------------------------------------------------
def gather_rows(x: Tensor, shard: Shard) -> Tensor:
    """The global batch's rows of ``x`` (every rank's part, in rank order). Only this rank's rows carry
    a gradient: the others arrive through a collective that autograd does not see."""
    if shard.world == 1:
        return x
    rows = max(shard.sizes)
    buf = x.detach()
    if buf.shape[0] < rows:  # parts differ by one row: all_gather needs equal shapes
        buf = torch.cat([buf, buf.new_zeros((rows - buf.shape[0], *buf.shape[1:]))])
    parts = [torch.empty_like(buf) for _ in range(shard.world)]
    dist.all_gather(parts, buf.contiguous())
    parts = [p[:n] for p, n in zip(parts, shard.sizes)]
    parts[shard.rank] = x
    return torch.cat(parts)


def scale_gradient(x: Tensor, factor: float) -> Tensor:
    """``x`` unchanged in value, its gradient multiplied by ``factor`` (x + f·(x − x) is exactly x)."""
    if factor == 1:
        return x
    d = x.detach()
    return d + factor * (x - d)


def mean_over_ranks(local_mean: Tensor, shard: Shard, share: float | None = None) -> Tensor:
    """The global batch's mean from each rank's mean over its own rows: the value is Σ_r share_r · mean_r
    (all-reduced, identical on every rank); the gradient flows to this rank's mean, scaled W · share so
    that DDP's average over the ranks is the gradient of the global mean. ``share``: this rank's weight
    when the mean is not over rows (a mean over tokens: :func:`share_of` its token count); default its
    share of the rows."""
    if shard.world == 1:
        return local_mean
    share = shard.share if share is None else share
    total = (local_mean.detach().float() * share).reshape(1)
    dist.all_reduce(total)
    return total[0] + shard.world * share * (local_mean - local_mean.detach())


def share_of(count: Tensor) -> float:
    """This rank's fraction of a count summed over the ranks (e.g. the batch's non-padding tokens)."""
    c = count.detach().to(torch.float64).reshape(1)
    total = c.clone()
    dist.all_reduce(total)
    return float(c / total.clamp_min(1))


def mean_of_scalars(values: dict[str, Tensor], shard: Shard) -> dict[str, Tensor]:
    """Detached per-rank diagnostics (0-d) → their global batch value in one all-reduce: weighted
    means for floats, sums for counts (integer tensors)."""
    if shard.world == 1 or not values:
        return values
    keys = list(values)
    w = torch.tensor([1.0 if not values[k].is_floating_point() else shard.share for k in keys], dtype=torch.float64)
    vec = torch.stack([values[k].detach().to(torch.float64).cpu() for k in keys]) * w
    vec = vec.to(_comm_device())
    dist.all_reduce(vec)
    return {k: vec[i].to(values[k].dtype).to(values[k].device) for i, k in enumerate(keys)}


def average_gradients(params) -> None:
    """DDP's gradient averaging by hand, for a model whose step is not one forward (the captioner's: an
    encoder, a teacher-forced or sampling loop over its decoder) — DDP only synchronises gradients of a
    forward it ran. One all-reduce of all gradients flattened; a parameter without a gradient counts as
    zeros (every rank runs the same code, so the same ones lack it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def rank_seed(step_seed: int, rank: int) -> int:
    """The global generator's seed for a step on ``rank`` (dropout masks): rank 0 keeps the step's seed,
    so one process trains exactly as before; the others draw masks of their own."""
    return step_seed if rank == 0 else int(np.random.default_rng([step_seed, rank]).integers(2**62))


# ---- agreement between the processes -------------------------------------------------------------------
def broadcast_float(value: float) -> float:
    """Rank 0's ``value`` on every rank (rank 0 validates; all ranks act on its result)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_comm_device())
    dist.broadcast(t, src=0)
    return float(t[0])


def gather_ints(value: int) -> list[int]:
    """Every rank's ``value`` (e.g. the step each resumed from), on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [int(o[0]) for o in out]


def check_same_step(step: int) -> None:
    """Every process must continue from the same step: a run folder that one machine sees and another
    does not would otherwise split the run silently (each process reads the checkpoint)."""
    steps = gather_ints(step)
    if len(set(steps)) > 1:
        raise Unavailable(f"the processes start from different steps {steps}: put the run folder on storage "
                          "that every machine sees (each process reads the checkpoint)")


def _comm_device() -> torch.device:
    """Where a collective's tensors live: NCCL's on this process's GPU, gloo's on the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def data_parallel(module: nn.Module) -> nn.Module:
    """``module`` (on this process's device) under DistributedDataParallel when a process group is up
    (the module itself otherwise).

    ``static_graph``: the set of parameters a step uses is fixed for the life of the wrapper (the loop
    builds a new one when the backbone unfreezes), so DDP learns it in the first step — parameters
    unused by a configuration (a decoder's unused side, a frozen tower's head) need no flag."""
    if not (dist.is_available() and dist.is_initialized()):
        return module
    device = next(module.parameters()).device
    if device.type == "cuda":
        module = nn.SyncBatchNorm.convert_sync_batchnorm(module)  # batch statistics of the global batch
        return DistributedDataParallel(module, device_ids=[device.index if device.index is not None
                                                           else torch.cuda.current_device()], static_graph=True)
    return DistributedDataParallel(module, static_graph=True)
