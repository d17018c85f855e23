"""Order embeddings (Vendrov et al. 2016), as used by Vilalta et al.'s full-network pipeline.

A caption is a more *general* concept than the image it describes (the image is one instance of
it), so image ⪯ caption in the reversed product order on the non-negative orthant: a perfect
pair has ``img_d >= txt_d`` in every coordinate. The order violation and similarity are

    E(img, txt) = || max(0, txt - img) ||²        S(img, txt) = -E(img, txt)

(squared norm as in Vendrov's paper and code; VSE++'s ``order_sim`` takes the square root).
Embeddings are made non-negative with ``abs`` as in the paper; :func:`order_similarity` applies
it itself, so callers may pass the plain L2-normalised encoder outputs (abs is idempotent if the
encoder already did it). The loss is the bidirectional hinge loss of :mod:`.triplet` on S: sum of
hinges (Vendrov's objective) by default, max of hinges (VSE++'s ``--measure order``) with
``max_violation=True``. Vendrov used α = 0.05; the default here is 0.2 to match the other hinge
losses built by the factory.

Retrieval must rank with :func:`order_similarity` (higher = better), not with a dot product.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .infonce import _check_pair
from .triplet import _check_hinge_args, hinge_loss_from_scores

# Elements of the (chunk, N_txt, D) broadcast held at once: 2**24 floats = 64 MiB in float32.
_MAX_BROADCAST_ELEMENTS = 1 << 24


def order_violation(img: Tensor, txt: Tensor, chunk_size: int | None = None) -> Tensor:
    """(N_img, N_txt) matrix of ``||max(0, |txt_j| - |img_i|)||²`` (≥ 0; 0 = order satisfied).

    The (N_img, N_txt, D) difference has no matmul shortcut, so it is built ``chunk_size`` image
    rows at a time (default: as many as fit in ~64 MiB) to keep large retrieval sets in memory.
    """
    if img.dim() != 2 or txt.dim() != 2 or img.shape[1] != txt.shape[1]:
        raise ValueError(
            f"img (N, D) and txt (M, D) must share D, got {tuple(img.shape)} and {tuple(txt.shape)}"
        )
    img, txt = img.abs(), txt.abs()
    n_img, n_txt, dim = img.shape[0], txt.shape[0], img.shape[1]
    if chunk_size is None:
        chunk_size = max(1, _MAX_BROADCAST_ELEMENTS // max(1, n_txt * dim))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    rows = [
        (txt.unsqueeze(0) - img[start : start + chunk_size].unsqueeze(1)).clamp(min=0).pow(2).sum(-1)
        for start in range(0, n_img, chunk_size)
    ]
    return torch.cat(rows, dim=0) if rows else img.new_zeros((0, n_txt))


def order_similarity(img: Tensor, txt: Tensor, chunk_size: int | None = None) -> Tensor:
    """(N_img, N_txt) order similarity ``-||max(0, |txt_j| - |img_i|)||²`` (higher = better)."""
    return -order_violation(img, txt, chunk_size=chunk_size)


class OrderLoss(nn.Module):
    """Hinge loss on order similarity: SH (Vendrov) or MH (VSE++) via ``max_violation``.

    ``forward(img, txt, image_ids=None)`` returns the dict of
    :func:`.triplet.hinge_loss_from_scores` (``loss``, ``l_i2t``, ``l_t2i``, hardest-negative
    indices, ``pos_sim``, ``hardest_neg_sim``). Reduction and masking as in :mod:`.triplet`.
    """

    similarity = "order"

    def __init__(self, margin: float = 0.2, max_violation: bool = False, reduction: str = "sum") -> None:
        super().__init__()
        _check_hinge_args(margin, reduction)
        self.margin = float(margin)
        self.max_violation = bool(max_violation)
        self.reduction = reduction

    def forward(self, img: Tensor, txt: Tensor, image_ids: Tensor | None = None) -> dict[str, Tensor]:
        _check_pair(img, txt)
        return hinge_loss_from_scores(
            order_similarity(img, txt),
            self.margin,
            max_violation=self.max_violation,
            image_ids=image_ids,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, max_violation={self.max_violation}, "
            f"reduction={self.reduction!r}"
        )
