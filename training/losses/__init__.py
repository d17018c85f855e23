"""Losses for LTD retrieval: one file per loss, a pure function on embeddings under each module.

Conventions (every contrastive loss): ``img`` and ``txt`` are (B, D), L2-normalised, row i of
each is a positive pair; optional ``image_ids`` (B,) marks rows showing the same image, which are
then excluded from each other's negatives. Every module's ``forward`` returns a
``dict[str, Tensor]`` whose ``"loss"`` is the scalar to minimise; the other keys are detached
diagnostics for logging and are never summed into it.

:class:`.objective.TrainingObjective` composes them for training (contrastive + reconstruction,
combined, with the sh → mh curriculum) and is the only reader of the loss config.
"""
from .constraint import COMBINE_MODES, LambdaSettings, LossCombiner
from .factory import (
    CONTRASTIVE_LOSSES,
    SIMILARITIES,
    build_contrastive_loss,
    cosine_similarity,
    similarity_fn,
    similarity_for,
)
from .ifm import IFMLoss, ifm_loss, ifm_similarities
from .infonce import InfoNCELoss, Temperature, infonce_loss, same_image_mask, symmetric_cross_entropy
from .objective import ObjectiveNeeds, TrainingObjective, objective_needs
from .order import OrderLoss, order_similarity, order_violation
from .reconstruction import (
    ITDReconstructionLoss,
    LTDReconstructionLoss,
    cosine_reconstruction_loss,
    token_nll_loss,
)
from .triplet import (
    MaxHingeLoss,
    SumHingeLoss,
    hinge_loss_from_scores,
    max_hinge_loss,
    sum_hinge_loss,
)

__all__ = [
    "COMBINE_MODES",
    "CONTRASTIVE_LOSSES",
    "SIMILARITIES",
    "IFMLoss",
    "ITDReconstructionLoss",
    "InfoNCELoss",
    "LTDReconstructionLoss",
    "LambdaSettings",
    "LossCombiner",
    "MaxHingeLoss",
    "ObjectiveNeeds",
    "OrderLoss",
    "SumHingeLoss",
    "Temperature",
    "TrainingObjective",
    "build_contrastive_loss",
    "cosine_reconstruction_loss",
    "cosine_similarity",
    "hinge_loss_from_scores",
    "ifm_loss",
    "ifm_similarities",
    "infonce_loss",
    "max_hinge_loss",
    "objective_needs",
    "order_similarity",
    "order_violation",
    "same_image_mask",
    "similarity_fn",
    "similarity_for",
    "sum_hinge_loss",
    "symmetric_cross_entropy",
    "token_nll_loss",
]
