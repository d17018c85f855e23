"""The encoder families that reason over image regions (``model.image_encoder``), built from config:

| family | image side | caption side |
|---|---|---|
| ``head`` (today's) | pooled / FNE features → projection head | bi-GRU or sentence-transformer |
| ``vsrn`` | regions → GCN layers → GRU → head (:mod:`.vsrn`) | bi-GRU (the LTD paper's VSRN) |
| ``tern`` | regions + CLS → transformer → shared layers (:mod:`.tern`) | pre-trained transformer → shared layers |

Regions are rows of R·C values, as the feature cache stores grid cells and precomputed regions;
``model.region_dim`` is C (0: the packaged CNN's 1280 channels, or what the precomputed reader
found, which the run's checkpoints record as ``region_dim``).
"""
from __future__ import annotations

from torch import nn

from training.config import ModelConfig
from training.errors import UserValueError
from training.models.backbones import Backbone
from training.models.tern import SharedReasoning, TERNImageHead
from training.models.tern_text import TERNTextEncoder
from training.models.vsrn import VSRNImageHead
from training.targets import resolve_sentence_model

REGION_ENCODERS = ("vsrn", "tern")


def region_layout(m: ModelConfig, feat_dim: int, backbone: Backbone | None, found: int = 0) -> tuple[int, int]:
    """(channels per region, regions per image) of rows of ``feat_dim`` values: ``model.region_dim``,
    else what the precomputed reader ``found`` (a checkpoint records it), else the grid's channels."""
    side = getattr(backbone, "grid_side", 0) if backbone is not None else 0
    channels = m.region_dim or found or (feat_dim // side ** 2 if side else 0)
    if channels <= 0:
        raise UserValueError("model.region_dim is unknown: set it to the channels per region of the precomputed "
                         "features")
    if feat_dim % channels:
        raise UserValueError(f"features of {feat_dim} values are not regions of model.region_dim={channels} channels")
    return channels, feat_dim // channels


def shared_layers(m: ModelConfig) -> SharedReasoning | None:
    """TERN's layers shared by both modalities (None for other families)."""
    if m.image_encoder != "tern":
        return None
    return SharedReasoning(m.reasoning_dim, m.embed_dim, layers=m.shared_layers, heads=m.attention_heads,
                           ff=m.reasoning_ff, dropout=m.reasoning_dropout)


def region_image_head(m: ModelConfig, feat_dim: int, backbone: Backbone | None, shared: SharedReasoning | None,
                      region_dim: int = 0) -> nn.Module | None:
    """The image encoder's head for a region family (None: the plain projection head)."""
    if m.image_encoder not in REGION_ENCODERS:
        return None
    channels, n_regions = region_layout(m, feat_dim, backbone, region_dim)
    if m.image_encoder == "vsrn":
        return VSRNImageHead(channels, m.reasoning_dim, m.embed_dim, layers=m.reasoning_layers, head=m.image_head,
                             head_hidden=m.head_hidden, batchnorm=m.batchnorm)
    assert shared is not None
    return TERNImageHead(channels, n_regions, m, shared)


def tern_text_encoder(m: ModelConfig, shared: SharedReasoning, max_len: int) -> TERNTextEncoder:
    return TERNTextEncoder(str(resolve_sentence_model(m.sbert_path)), m.reasoning_dim, shared,
                           train_layers=m.sbert_train_layers, max_len=max_len)
