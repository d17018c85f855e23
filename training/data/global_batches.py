"""The order of training captions, in global batches, and each process's part of a global batch.

A run's batches do not depend on how many processes train it: epoch e's caption order is a
permutation seeded by (seed, e), cut into batches of ``train.batch_size`` (the *global* batch).
Under data-parallel training (:mod:`training.distributed`) process r of W takes the r-th of W
contiguous parts of every global batch (sizes differ by at most one), so the W parts, concatenated
in rank order, are the batch a single process would train on. That is what lets a run resume on
another number of processes from the same sample, and the losses see exactly one process's negatives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def epoch_batches(seed: int, epoch: int, n: int, batch_size: int, world: int = 1) -> list[np.ndarray]:
    """Every caption once per epoch, in global batches of ``batch_size``. A final batch smaller than 2
    (no negatives) is dropped; under W processes also one smaller than W (a process with no rows has
    nothing to encode) — at most W − 1 captions of an epoch, the remainder DistributedSampler drops too."""
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    smallest = max(2, world)
    return [b for b in (perm[i : i + batch_size] for i in range(0, n, batch_size)) if len(b) >= smallest]


@dataclass(frozen=True)
class Shard:
    """Where one process's rows sit in a global batch: ``sizes[r]`` rows for rank r, in rank order."""

    rank: int
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, n: int, rank: int = 0, world: int = 1) -> Shard:
        """Rank ``rank`` of ``world`` in a global batch of ``n`` rows (the first n mod W ranks get one more)."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in [0, {world})")
        base, extra = divmod(n, world)
        return cls(rank, tuple(base + (r < extra) for r in range(world)))

    @property
    def world(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        """Rows in the global batch."""
        return sum(self.sizes)

    @property
    def rows(self) -> slice:
        """This rank's rows of the global batch."""
        start = sum(self.sizes[: self.rank])
        return slice(start, start + self.sizes[self.rank])

    @property
    def share(self) -> float:
        """This rank's fraction of the global batch (the weight of its per-rank means)."""
        return self.sizes[self.rank] / max(1, self.total)
