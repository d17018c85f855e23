"""Reconstruction losses: latent target decoding (LTD) and input target decoding (ITD).

LTD: a decoder maps the caption embedding to the (frozen, precomputed) sentence-transformer
embedding of the same caption; the loss is ``mean_i (1 - cos(pred_i, target_i))`` in [0, 2]
(the paper's ``reconstruction_metric='cosine'``). Cosine rather than L2 because the targets'
norm carries no meaning, only their direction.

ITD: a language-model decoder conditioned on the caption embedding reconstructs the caption's
tokens. ``reduction="mean"``: the mean negative log-likelihood over the non-padding tokens of the
batch (each token weighs the same). ``reduction="sum"``: each caption's summed token NLL, averaged
over the captions (the LTD paper's ITD; ~ caption length × stronger at the same weight).

Both are computed in float32 so an autocast half-precision decoder cannot underflow them.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def cosine_reconstruction_loss(pred: Tensor, target: Tensor) -> Tensor:
    """``mean(1 - cos(pred, target))`` over the batch; pred and target are (B, D)."""
    if pred.shape != target.shape or pred.dim() != 2:
        raise ValueError(
            f"pred and target must both be (B, D), got {tuple(pred.shape)} and {tuple(target.shape)}"
        )
    dtype = torch.promote_types(pred.dtype, torch.float32)  # fp16/bf16 → fp32, keeps fp64
    cos = F.cosine_similarity(pred.to(dtype), target.to(dtype), dim=-1, eps=1e-8)
    return (1.0 - cos).mean()


def token_nll_loss(logits: Tensor, targets: Tensor, pad_id: int = 0, reduction: str = "mean") -> Tensor:
    """NLL of ``targets`` (B, T) under ``logits`` (B, T, V), ignoring ``pad_id`` tokens.

    ``reduction="mean"``: per non-pad token; ``"sum"``: summed over each caption's tokens, then
    averaged over the captions that have at least one token. ``logits[b, t]`` must already be the
    prediction *for* ``targets[b, t]`` (the caller shifts for teacher forcing). A batch with no
    non-pad token returns 0 rather than NaN.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (B, T, V) and targets (B, T), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    total = F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)).reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=pad_id,
        reduction="sum",
    )
    if reduction == "sum":
        n_captions = (targets != pad_id).any(dim=1).sum()
        return total / n_captions.clamp(min=1)
    n_tokens = (targets != pad_id).sum()
    return total / n_tokens.clamp(min=1)


class LTDReconstructionLoss(nn.Module):
    """``forward(pred, target)`` → ``loss`` (= mean 1 − cos) and detached ``cos_sim`` (mean cos)."""

    def forward(self, pred: Tensor, target: Tensor) -> dict[str, Tensor]:
        loss = cosine_reconstruction_loss(pred, target)
        return {"loss": loss, "cos_sim": 1.0 - loss.detach()}


class ITDReconstructionLoss(nn.Module):
    """``forward(logits, targets)`` → ``loss`` (token NLL, ``reduction`` mean or sum per caption),
    detached ``perplexity`` (per token, whatever the reduction) and ``n_tokens``."""

    def __init__(self, pad_id: int = 0, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.pad_id = int(pad_id)
        self.reduction = reduction

    def forward(self, logits: Tensor, targets: Tensor) -> dict[str, Tensor]:
        loss = token_nll_loss(logits, targets, pad_id=self.pad_id, reduction=self.reduction)
        per_token = loss if self.reduction == "mean" else token_nll_loss(logits.detach(), targets, self.pad_id)
        return {
            "loss": loss,
            "perplexity": per_token.detach().exp(),
            "n_tokens": (targets != self.pad_id).sum(),
        }

    def extra_repr(self) -> str:
        return f"pad_id={self.pad_id}, reduction={self.reduction!r}"
