"""End-to-end training batches: one item = one batch of augmented images, decoded in worker processes.

Augmentation is a random resized crop (scale 0.5–1, aspect 3/4–4/3) and a horizontal flip, drawn
from a generator seeded by (seed, epoch, step): a resumed run sees exactly the images an
uninterrupted one would. A data-parallel process decodes only its part of each batch and appends
``stream`` (process count, rank) to the seed, so its draws are its own and still deterministic.
Without augmentation (a backbone fine-tuned on its own preprocessing, as the shortcuts paper
fine-tunes CLIP) each image is the preprocessing's centre crop. ``transform`` (the synthetic
shortcuts) then draws on the final view, as it does on the feature cache's views.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.data.decode_pool import ImageTransform
from training.data.images import load_image


@dataclass(frozen=True)
class EpochPosition:
    """Where :class:`AugmentedImageBatches` starts and what seeds its draws: the run's ``seed``, the
    ``epoch``, the batches already taken (``skip``: a resumed run's step in the epoch) and the process's
    ``stream`` (process count, rank; empty for a single process)."""

    seed: int
    epoch: int
    skip: int
    stream: tuple[int, ...] = ()


class AugmentedImageBatches(torch.utils.data.Dataset):
    """Item i = the images of ``batches[at.skip + i]`` (dataset image indices), augmented unless
    ``augment`` is False, as a (B, 3, S, S) tensor."""

    def __init__(self, paths: list[Path], pre, batches: list[np.ndarray], at: EpochPosition, *,
                 augment: bool = True, transform: ImageTransform | None = None):
        """``at``: the first batch and the seed of the draws; ``transform``: drawn on each final view."""
        self.paths, self.pre, self.batches = paths, pre, batches
        self.seed, self.epoch, self.skip, self.stream = at.seed, at.epoch, at.skip, at.stream
        self.augment, self.transform = augment, transform

    def __len__(self) -> int:
        return len(self.batches) - self.skip

    def __getitem__(self, i: int) -> torch.Tensor:
        s = i + self.skip
        rng = np.random.default_rng([self.seed, self.epoch, s, 7, *self.stream])
        out = []
        for idx in self.batches[s]:
            img = load_image(self.paths[idx])
            img = self._augmented(img, rng) if self.augment else self.pre.crops(img, 1)[0]
            if self.transform is not None:
                img = self.transform(int(idx), img)
            out.append(self.pre.to_tensor(img))
        return torch.stack(out)

    def _augmented(self, img, rng: np.random.Generator):
        """A random resized crop of ``img`` at the preprocessing's size, flipped half of the time."""
        w, h = img.size
        scale, ratio = rng.uniform(0.5, 1.0), math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw = min(w, int(round(math.sqrt(scale * w * h * ratio))))
        ch = min(h, int(round(math.sqrt(scale * w * h / ratio))))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        img = img.crop((x0, y0, x0 + cw, y0 + ch)).resize((self.pre.size, self.pre.size))
        if rng.random() < 0.5:
            img = img.transpose(0)  # FLIP_LEFT_RIGHT
        return img
