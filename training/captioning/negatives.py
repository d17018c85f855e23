"""SR-PL: unlabelled images as moderately hard negatives.

For every labelled training caption, the judge ranks the unlabelled pool by similarity; a batch pairs
each labelled image with one unlabelled image drawn (for one of its captions, at random) from ranks
[h_min, h_max] (1-based): similar enough to make the retrieval reward discriminative, not so similar
that it is a near duplicate. ``random`` draws uniformly from the pool ("no mining"); ``hardest``
takes rank 1.
"""
from __future__ import annotations

import numpy as np

from training import choices


class NegativeSampler:
    def __init__(self, ranked: np.ndarray | None, caption_image: np.ndarray, pool_size: int, *, mode: str = "moderate",
                 h_min: int = 10, h_max: int = 100):
        """``ranked`` (n_labelled_captions, ≥ h_max): pool positions best first (None for ``random``);
        ``caption_image`` (n_labelled_captions,): the labelled image (0..n_labelled−1) of each caption."""
        if mode not in choices.names(choices.SamplingNegatives):
            raise ValueError(f"unknown negative mining {mode!r}; choose one of: "
                             f"{', '.join(choices.names(choices.SamplingNegatives))}")
        self.mode, self.pool_size = mode, pool_size
        self.lo, self.hi = min(h_min, pool_size) - 1, min(h_max, pool_size)
        self.ranked = ranked
        order = np.argsort(caption_image, kind="stable")
        self.caps_sorted = order
        n_img = int(caption_image.max()) + 1 if len(caption_image) else 0
        self.bounds = np.searchsorted(caption_image[order], np.arange(n_img + 1))

    def sample(self, labelled: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Pool positions, one per labelled image in ``labelled``, without duplicates where the pool allows."""
        n = len(labelled)
        if self.mode == "random" or self.ranked is None:
            return rng.choice(self.pool_size, size=n, replace=self.pool_size < n)
        start, count = self.bounds[labelled], self.bounds[labelled + 1] - self.bounds[labelled]
        cap = self.caps_sorted[start + (rng.random(n) * count).astype(np.int64)]
        if self.mode == "hardest":
            rank = np.zeros(n, dtype=np.int64)
        else:
            rank = rng.integers(self.lo, self.hi, size=n)
        picked = self.ranked[cap, rank]
        return _dedupe(picked, self.pool_size, rng)


def _dedupe(picked: np.ndarray, pool_size: int, rng: np.random.Generator) -> np.ndarray:
    """Replace repeated picks with pool images not yet in the batch (a twin image would be its own
    hardest negative)."""
    _, first = np.unique(picked, return_index=True)
    dup = np.setdiff1d(np.arange(len(picked)), first)
    if len(dup) == 0 or pool_size <= len(np.unique(picked)):
        return picked
    free = np.setdiff1d(np.arange(pool_size), picked)
    out = picked.copy()
    out[dup] = rng.choice(free, size=len(dup), replace=len(free) < len(dup))
    return out
