"""Cross-entropy training of the captioner, with scheduled sampling (Bengio et al. 2015).

The feedback probability (how often the model's own sampled word replaces the reference word as
the next input) starts at 0 and rises by ``ss_step`` every ``ss_every`` epochs up to ``ss_max``
(the paper: +0.05 every 5 epochs up to 0.25).
"""
from __future__ import annotations

import numpy as np
import torch

from training.captioning.model import TopDownCaptioner


def feedback_probability(epoch: int, every: int = 5, step: float = 0.05, maximum: float = 0.25) -> float:
    """Scheduled-sampling probability in (0-based) ``epoch``."""
    return float(min(maximum, (epoch // every) * step))


def token_nll(logprobs: torch.Tensor, targets: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """Mean negative log-likelihood over the non-pad target tokens (<eos> included)."""
    t = logprobs.shape[1]
    tgt = targets[:, :t]
    mask = (tgt != pad_id).to(logprobs.dtype)
    nll = -logprobs.gather(2, tgt.unsqueeze(2)).squeeze(2)
    return (nll * mask).sum() / mask.sum().clamp_min(1.0)


def epoch_captions(image_captions: list[np.ndarray], images: np.ndarray, per_image: int,
                   rng: np.random.Generator) -> np.ndarray:
    """(len(images), per_image) caption indices: ``per_image`` of each image's captions, drawn
    without replacement (with replacement when an image has fewer)."""
    out = np.empty((len(images), per_image), dtype=np.int64)
    for j, i in enumerate(images):
        caps = image_captions[i]
        out[j] = rng.choice(caps, size=per_image, replace=len(caps) < per_image)
    return out


def xe_loss(model: TopDownCaptioner, regions: torch.Tensor, targets: torch.Tensor, per_image: int,
            ss_prob: float, generator: torch.Generator) -> torch.Tensor:
    """``regions`` (B, R, C); ``targets`` (B · per_image, T), image-major."""
    ctx = model.encode(regions).expand(per_image)
    logp = model.teacher_forced(ctx, targets, ss_prob=ss_prob, generator=generator)
    return token_nll(logp, targets, model.pad_id)
