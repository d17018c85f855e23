"""Hinge (triplet) losses: max of hinges (MH, VSE++) and sum of hinges (SH).

With a score matrix ``S[i, j] = s(img_i, txt_j)`` (cosine for L2-normalised embeddings, or the
order similarity of :mod:`.order`), margin α and the positive on the diagonal:

    cost_i2t[i, j] = max(0, α + S[i, j] - S[i, i])   image i as query, caption j a negative
    cost_t2i[i, j] = max(0, α + S[i, j] - S[j, j])   caption j as query, image i a negative

SH (Vendrov et al. 2016; Kiros et al.) sums every negative's hinge; MH (Faghri et al., VSE++)
keeps only the hardest in-batch negative of each query. Both directions are added.

Reduction: **sum over the batch** by default, exactly as VSE++ and the LTD paper's code do
(``cost_i2t.sum() + cost_t2i.sum()``), so the paper's margin/learning rates carry over. Note the
loss then scales with B, unlike InfoNCE (a mean). ``reduction="mean"`` divides each direction by
B instead (= the sum / B). SH and MH always use the same rule.

Same-image masking (``image_ids``): off-diagonal pairs that share an image id are other
positives, so their hinge costs are set to 0 (like the diagonal) and they can never be chosen as
the hardest negative. A query whose row has no negative left (B = 1, or every row is the same
image) costs 0 and reports hardest index -1.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .infonce import _check_pair, same_image_mask

REDUCTIONS = ("sum", "mean")


def _check_hinge_args(margin: float, reduction: str) -> None:
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def hinge_loss_from_scores(
    scores: Tensor,
    margin: float = 0.2,
    *,
    max_violation: bool,
    image_ids: Tensor | None = None,
    reduction: str = "sum",
) -> dict[str, Tensor]:
    """Bidirectional hinge loss on a (B, B) score matrix; the engine of SH, MH and order losses.

    Returns ``loss`` and diagnostics: ``l_i2t``/``l_t2i`` (each direction, same reduction),
    ``hardest_neg_i2t`` (B,) caption index of each image's hardest negative,
    ``hardest_neg_t2i`` (B,) image index of each caption's hardest negative (-1 if none),
    ``pos_sim`` (mean positive score) and ``hardest_neg_sim`` (mean hardest-negative score).
    """
    _check_hinge_args(margin, reduction)
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(f"scores must be a square (B, B) matrix, got {tuple(scores.shape)}")
    b = scores.shape[0]
    not_neg = torch.eye(b, dtype=torch.bool, device=scores.device)
    same = same_image_mask(image_ids, b)
    if same is not None:
        not_neg = not_neg | same.to(scores.device)

    pos = scores.diagonal()
    cost_i2t = (margin + scores - pos.view(b, 1)).clamp(min=0).masked_fill(not_neg, 0.0)
    cost_t2i = (margin + scores - pos.view(1, b)).clamp(min=0).masked_fill(not_neg, 0.0)

    if max_violation:
        # max over the costs (not the scores) is VSE++'s formulation: equal to the hinge on the
        # hardest negative, and a query with no violation contributes 0 either way.
        q_i2t = cost_i2t.max(dim=1).values
        q_t2i = cost_t2i.max(dim=0).values
    else:
        q_i2t = cost_i2t.sum(dim=1)
        q_t2i = cost_t2i.sum(dim=0)

    if reduction == "sum":
        l_i2t, l_t2i = q_i2t.sum(), q_t2i.sum()
    else:
        l_i2t, l_t2i = q_i2t.mean(), q_t2i.mean()

    with torch.no_grad():
        neg_scores = scores.detach().masked_fill(not_neg, float("-inf"))
        best_i2t, idx_i2t = neg_scores.max(dim=1)
        best_t2i, idx_t2i = neg_scores.max(dim=0)
        has_i2t, has_t2i = torch.isfinite(best_i2t), torch.isfinite(best_t2i)
        idx_i2t = torch.where(has_i2t, idx_i2t, torch.full_like(idx_i2t, -1))
        idx_t2i = torch.where(has_t2i, idx_t2i, torch.full_like(idx_t2i, -1))
        hardest = torch.cat([best_i2t[has_i2t], best_t2i[has_t2i]])
        hardest_sim = hardest.mean() if hardest.numel() else scores.new_tensor(float("nan"))

    return {
        "loss": l_i2t + l_t2i,
        "l_i2t": l_i2t.detach(),
        "l_t2i": l_t2i.detach(),
        "hardest_neg_i2t": idx_i2t,
        "hardest_neg_t2i": idx_t2i,
        "pos_sim": pos.detach().mean(),
        "hardest_neg_sim": hardest_sim,
    }


def max_hinge_loss(
    img: Tensor,
    txt: Tensor,
    margin: float = 0.2,
    image_ids: Tensor | None = None,
    reduction: str = "sum",
) -> Tensor:
    """VSE++ max of hinges (hardest in-batch negative, both directions) on cosine scores."""
    _check_pair(img, txt)
    return hinge_loss_from_scores(
        img @ txt.t(), margin, max_violation=True, image_ids=image_ids, reduction=reduction
    )["loss"]


def sum_hinge_loss(
    img: Tensor,
    txt: Tensor,
    margin: float = 0.2,
    image_ids: Tensor | None = None,
    reduction: str = "sum",
) -> Tensor:
    """Sum of hinges over all in-batch negatives, both directions, on cosine scores."""
    _check_pair(img, txt)
    return hinge_loss_from_scores(
        img @ txt.t(), margin, max_violation=False, image_ids=image_ids, reduction=reduction
    )["loss"]


class _CosineHingeLoss(nn.Module):
    similarity = "cosine"
    max_violation: bool

    def __init__(self, margin: float = 0.2, reduction: str = "sum") -> None:
        super().__init__()
        _check_hinge_args(margin, reduction)
        self.margin = float(margin)
        self.reduction = reduction

    def forward(self, img: Tensor, txt: Tensor, image_ids: Tensor | None = None) -> dict[str, Tensor]:
        _check_pair(img, txt)
        return hinge_loss_from_scores(
            img @ txt.t(),
            self.margin,
            max_violation=self.max_violation,
            image_ids=image_ids,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


class MaxHingeLoss(_CosineHingeLoss):
    """VSE++ triplet loss: hinge on the hardest in-batch negative (α = 0.2 as in VSE++/LTD)."""

    max_violation = True


class SumHingeLoss(_CosineHingeLoss):
    """Sum of hinges over all in-batch negatives (the pre-VSE++ objective)."""

    max_violation = False
