"""Build a contrastive loss by name, and tell callers which similarity retrieval must use.

    infonce   symmetric InfoNCE (τ)                                  similarity: cosine
    triplet   = mh: VSE++ max of hinges, hardest in-batch negative (α) similarity: cosine
    mh        max of hinges (α)                                      similarity: cosine
    sh        sum of hinges over all in-batch negatives (α)          similarity: cosine
    ifm       ½ IFM-perturbed InfoNCE + ½ InfoNCE (τ, ε)             similarity: cosine
    order     Vendrov order embeddings, sum of hinges (α)            similarity: order

"cosine" means the dot product of L2-normalised embeddings (what a FAISS inner-product index
computes); "order" means :func:`.order.order_similarity`, which no inner-product index computes,
so an order-trained model needs brute-force scoring with that function.
"""
from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn
from torch import Tensor

from training import choices

from .ifm import IFMLoss
from .infonce import InfoNCELoss
from .order import OrderLoss, order_similarity
from .triplet import MaxHingeLoss, SumHingeLoss

CONTRASTIVE_LOSSES = choices.names(choices.ContrastiveLoss)
SIMILARITIES = choices.names(choices.Similarity)

_SIMILARITY_OF = {name: "cosine" for name in CONTRASTIVE_LOSSES} | {"order": "order"}


def _check_name(name: str) -> str:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in CONTRASTIVE_LOSSES:
        raise ValueError(f"unknown contrastive loss {name!r}; valid names: {', '.join(CONTRASTIVE_LOSSES)}")
    return key


def build_contrastive_loss(
    name: str, *, tau: float = 0.05, margin: float = 0.2, epsilon: float = 0.1
) -> nn.Module:
    """The loss module for ``name``; only the hyperparameters that loss uses are read.

    Every returned module has ``forward(img, txt, image_ids=None) -> dict`` with a ``"loss"``
    key and a class attribute ``similarity`` (``"cosine"`` or ``"order"``).
    """
    key = _check_name(name)
    if key == "infonce":
        return InfoNCELoss(tau=tau)
    if key in ("triplet", "mh"):
        return MaxHingeLoss(margin=margin)
    if key == "sh":
        return SumHingeLoss(margin=margin)
    if key == "ifm":
        return IFMLoss(tau=tau, epsilon=epsilon)
    return OrderLoss(margin=margin, max_violation=False)


def similarity_for(name: str) -> str:
    """``"cosine"`` or ``"order"``: the similarity a model trained with loss ``name`` ranks by."""
    return _SIMILARITY_OF[_check_name(name)]


def cosine_similarity(img: Tensor, txt: Tensor) -> Tensor:
    """(N_img, N_txt) dot products; equal to cosine for L2-normalised embeddings."""
    return img @ txt.t()


def similarity_fn(similarity: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The (img (N, D), txt (M, D)) -> (N, M) scoring function for ``"cosine"`` or ``"order"``."""
    if similarity == "cosine":
        return cosine_similarity
    if similarity == "order":
        return order_similarity
    raise ValueError(f"unknown similarity {similarity!r}; valid: {', '.join(SIMILARITIES)}")
