"""Symmetric InfoNCE (the contrastive loss of the LTD paper and of CLIP).

For a batch of B positive pairs (img_i, txt_i) with logits ``S[i, j] = img_i · txt_j / τ``:

    L = ½ · CE(S, labels=arange(B))      # image → text: row i is a softmax over captions
      + ½ · CE(Sᵀ, labels=arange(B))     # text → image: row j is a softmax over images

Each direction is the mean over the B queries (``F.cross_entropy``'s default), as in the paper's
code and open_clip. τ = 0.05 is the paper's value for the ResNet/GRU setting.

Same-image masking (``image_ids``): a batch may hold several captions of one image, so
row i and row k (i ≠ k) with ``image_ids[i] == image_ids[k]`` are positives of each other.
Treating txt_k as a negative of img_i would push apart two correct matches, so those
off-diagonal logits are set to ``-inf`` before the softmax in *both* directions: they drop out of
the denominator (probability exactly 0, gradient exactly 0) and the target of each row stays its
own diagonal entry. The diagonal is never masked, so every row keeps at least one finite logit.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

# CLIP caps the learnable logit scale 1/τ at 100 (τ ≥ 0.01) so the logits cannot blow up.
MAX_LOGIT_SCALE = 100.0


def same_image_mask(image_ids: Tensor | None, batch_size: int) -> Tensor | None:
    """(B, B) bool mask of *off-diagonal* pairs that share an image id, or None.

    ``True`` at [i, k] means "txt_k / img_k is another positive of row i": exclude it from the
    negatives. The diagonal is always ``False`` (it is the positive itself). Shared by every
    loss in this package so they all mask the same way.
    """
    if image_ids is None:
        return None
    if image_ids.dim() != 1 or image_ids.shape[0] != batch_size:
        raise ValueError(
            f"image_ids must have shape ({batch_size},), got {tuple(image_ids.shape)}"
        )
    same = image_ids.view(-1, 1) == image_ids.view(1, -1)
    same.fill_diagonal_(False)
    return same


def _check_pair(img: Tensor, txt: Tensor) -> None:
    if img.dim() != 2 or img.shape != txt.shape:
        raise ValueError(
            f"img and txt must both be (B, D) with the same shape, got "
            f"{tuple(img.shape)} and {tuple(txt.shape)}"
        )


def symmetric_cross_entropy(logits: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(l_i2t, l_t2i): mean CE over rows and over columns of a (B, B) logit matrix.

    ``logits[i, j]`` scores image i against caption j; the positive of row/column i is i.
    ``mask`` (from :func:`same_image_mask`) removes other positives from the denominators.
    Computed in float32 so a half-precision autocast matmul cannot underflow the softmax.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp16/bf16 → fp32
    if mask is not None:
        logits = logits.masked_fill(mask, float("-inf"))
    labels = torch.arange(logits.shape[0], device=logits.device)
    l_i2t = F.cross_entropy(logits, labels)
    l_t2i = F.cross_entropy(logits.t(), labels)  # the mask is symmetric, so .t() keeps it valid
    return l_i2t, l_t2i


def infonce_loss(
    img: Tensor, txt: Tensor, tau: float | Tensor, image_ids: Tensor | None = None
) -> Tensor:
    """Symmetric InfoNCE ½(CE_i2t + CE_t2i) with logits ``img @ txt.T / tau`` (a scalar)."""
    _check_pair(img, txt)
    mask = same_image_mask(image_ids, img.shape[0])
    l_i2t, l_t2i = symmetric_cross_entropy(img @ txt.t() / tau, mask)
    return 0.5 * (l_i2t + l_t2i)


class Temperature(nn.Module):
    """τ, fixed or learnable.

    Learnable τ is parametrised like CLIP as ``log(1/τ)`` and used clamped to
    ``[0, log(MAX_LOGIT_SCALE)]`` (τ in [0.01, 1]). The clamp in :meth:`forward` only bounds the
    value the loss sees; call :meth:`project_` after the optimizer step (open_clip's loop does the
    same ``clamp_``) so the stored parameter itself cannot drift outside the range.
    Remember to hand this module's parameters to the model's optimizer when it is learnable.
    """

    def __init__(self, tau: float = 0.05, learnable: bool = False) -> None:
        super().__init__()
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.learnable = learnable
        self.tau_init = float(tau)
        if learnable:
            self.log_inv_tau = nn.Parameter(torch.tensor(math.log(1.0 / tau)))

    def forward(self) -> Tensor | float:
        """τ to divide the similarities by: a 0-d tensor if learnable, else the plain float
        (a Python scalar keeps the logits' dtype and is exact for float64 inputs)."""
        if self.learnable:
            return self.log_inv_tau.clamp(0.0, math.log(MAX_LOGIT_SCALE)).exp().reciprocal()
        return self.tau_init

    def share(self, log_inv_tau: nn.Parameter) -> None:
        """Use, and train, a ``log(1/τ)`` held by the model instead of ``tau`` (a pretrained CLIP's
        logit scale, fine-tuned end to end); the model's optimizer steps it."""
        self.learnable, self.log_inv_tau = True, log_inv_tau

    def value(self) -> Tensor:
        """Current τ as a detached 0-d tensor, for logging."""
        return torch.as_tensor(self.forward()).detach().clone()

    @torch.no_grad()
    def project_(self) -> None:
        if self.learnable:
            self.log_inv_tau.clamp_(0.0, math.log(MAX_LOGIT_SCALE))

    def extra_repr(self) -> str:
        return f"tau={self.tau_init:g}, learnable={self.learnable}"


class InfoNCELoss(nn.Module):
    """Symmetric InfoNCE as a module.

    ``forward(img, txt, image_ids=None)`` returns ``loss`` (to minimise) and the diagnostics
    ``l_i2t``, ``l_t2i`` (each direction's mean CE, detached) and ``tau`` (detached).
    """

    similarity = "cosine"

    def __init__(self, tau: float = 0.05, learnable_tau: bool = False) -> None:
        super().__init__()
        self.temperature = Temperature(tau, learnable=learnable_tau)

    def forward(self, img: Tensor, txt: Tensor, image_ids: Tensor | None = None) -> dict[str, Tensor]:
        _check_pair(img, txt)
        mask = same_image_mask(image_ids, img.shape[0])
        l_i2t, l_t2i = symmetric_cross_entropy(img @ txt.t() / self.temperature(), mask)
        return {
            "loss": 0.5 * (l_i2t + l_t2i),
            "l_i2t": l_i2t.detach(),
            "l_t2i": l_t2i.detach(),
            "tau": self.temperature.value(),
        }
