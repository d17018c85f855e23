"""Implicit Feature Modification (IFM) on InfoNCE.

Robinson et al. 2021 ("Can contrastive learning avoid shortcut solutions?") perturb the
embeddings adversarially within an ε-ball; for InfoNCE on normalised embeddings the worst case
has a closed form on the *similarities*: the positive similarity moves down by ε and every
negative similarity moves up by ε, before division by τ:

    S_ifm[i, i] = (s_ii - ε) / τ        S_ifm[i, j] = (s_ij + ε) / τ   (i ≠ j)

i.e. each logit is shifted by ε/τ. Following Bleeker et al. ("Demonstrating and Reducing
Shortcuts in Vision-Language Representation Learning", their ``InfoNCE(use_ifm=True)``) the
trained loss is the average of the perturbed and the plain loss:

    L = ½ · InfoNCE(S_ifm) + ½ · InfoNCE(S)

Same-image masking is the one of :mod:`.infonce` (masked logits are ``-inf`` after the shift,
so they stay out of both losses).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .infonce import Temperature, _check_pair, same_image_mask, symmetric_cross_entropy


def ifm_similarities(scores: Tensor, epsilon: float) -> Tensor:
    """Return ``scores`` with ε subtracted on the diagonal and added everywhere else."""
    eye = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
    return scores + torch.full_like(scores, epsilon).masked_fill(eye, -epsilon)


def _ifm_terms(
    img: Tensor, txt: Tensor, tau: Tensor | float, epsilon: float, image_ids: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, l_infonce, l_ifm, l_ifm_i2t, l_ifm_t2i)."""
    _check_pair(img, txt)
    mask = same_image_mask(image_ids, img.shape[0])
    scores = img @ txt.t()
    plain = symmetric_cross_entropy(scores / tau, mask)
    shifted = symmetric_cross_entropy(ifm_similarities(scores, epsilon) / tau, mask)
    l_infonce = 0.5 * (plain[0] + plain[1])
    l_ifm = 0.5 * (shifted[0] + shifted[1])
    return 0.5 * (l_ifm + l_infonce), l_infonce, l_ifm, *shifted


def ifm_loss(
    img: Tensor,
    txt: Tensor,
    tau: float | Tensor,
    epsilon: float,
    image_ids: Tensor | None = None,
) -> Tensor:
    """½ · symmetric InfoNCE on ε-perturbed similarities + ½ · plain symmetric InfoNCE."""
    return _ifm_terms(img, txt, tau, epsilon, image_ids)[0]


class IFMLoss(nn.Module):
    """IFM-augmented InfoNCE. ε = 0.1 is the value Bleeker et al. found to work for retrieval.

    ``forward`` returns ``loss`` = ½(l_ifm + l_infonce), and detached ``l_infonce``, ``l_ifm``,
    ``l_ifm_i2t``, ``l_ifm_t2i`` and ``tau``.
    """

    similarity = "cosine"

    def __init__(self, tau: float = 0.05, epsilon: float = 0.1, learnable_tau: bool = False) -> None:
        super().__init__()
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        self.epsilon = float(epsilon)
        self.temperature = Temperature(tau, learnable=learnable_tau)

    def forward(self, img: Tensor, txt: Tensor, image_ids: Tensor | None = None) -> dict[str, Tensor]:
        loss, l_infonce, l_ifm, l_ifm_i2t, l_ifm_t2i = _ifm_terms(
            img, txt, self.temperature(), self.epsilon, image_ids
        )
        return {
            "loss": loss,
            "l_infonce": l_infonce.detach(),
            "l_ifm": l_ifm.detach(),
            "l_ifm_i2t": l_ifm_i2t.detach(),
            "l_ifm_t2i": l_ifm_t2i.detach(),
            "tau": self.temperature.value(),
        }

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}"
