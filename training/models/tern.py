"""TERN-style encoders (Messina et al., 2020, "Transformer Reasoning Network for Image-Text Matching
and Retrieval"): no cross-attention; each modality is reasoned over on its own, then both go through
the *same* transformer layers (one module object, applied to each separately), and the first
token's output — a CLS token — is the global vector, mapped to the joint space by a shared linear map.

- Image: regions → linear projection (+ a learned embedding per region slot for grid cells, whose
  layout is fixed; precomputed bottom-up regions carry box coordinates in their channels instead,
  which is TERN's "project-and-sum" positional encoding) → a learned CLS token in front → a few
  image-only transformer layers → the shared layers.
- Caption (:mod:`.tern_text`): a pre-trained transformer fine-tuned (TERN: BERT-base; here the
  packaged all-MiniLM-L6-v2 stands in for it — it was itself trained on sentence pairs that include
  Flickr30k and COCO captions) → its token outputs, [CLS] first → linear projection → the shared layers.

The shared module is registered under both encoders, so the state dict lists it twice (both names
load the same tensors) and the optimiser sees its parameters once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.config import ModelConfig
from training.models.vsrn import regions_of


def transformer(dim: int, layers: int, heads: int, ff: int, dropout: float) -> nn.TransformerEncoder | None:
    """Post-norm transformer encoder layers (as TERN's), batch first; None for 0 layers."""
    if layers == 0:
        return None
    layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=ff, dropout=dropout, activation="relu",
                                       batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class SharedReasoning(nn.Module):
    """The layers both modalities share: transformer layers, then the CLS output → joint space (L2-normalised)."""

    def __init__(self, dim: int, embed_dim: int, *, layers: int = 2, heads: int = 4, ff: int = 1024,
                 dropout: float = 0.1):
        super().__init__()
        self.layers = transformer(dim, layers, heads, ff, dropout)
        self.proj = nn.Linear(dim, embed_dim)

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D) with the CLS token at position 0 (``padding``: (B, T) True where padded) → (B, E)."""
        if self.layers is not None:
            x = self.layers(x, src_key_padding_mask=padding)
        return F.normalize(self.proj(x[:, 0]), dim=-1)


class TERNImageHead(nn.Module):
    """Region rows (B, R·C) → (B, E) through image-only transformer layers and the shared layers."""

    def __init__(self, region_dim: int, n_regions: int, m: ModelConfig, shared: SharedReasoning):
        """``m``: the layers' width (``reasoning_dim``), depth (``reasoning_layers``), heads, feed-forward
        width and dropout, and whether each region slot has a learned embedding (``region_positions``)."""
        super().__init__()
        dim = m.reasoning_dim
        self.region_dim = region_dim
        self.fc = nn.Linear(region_dim, dim)
        self.norm = nn.LayerNorm(dim)  # region features arrive on the CNN's scale (grid: 0–6; bottom-up: 0–100s)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n_regions, dim) * 0.02) if m.region_positions else None
        self.encoder = transformer(dim, m.reasoning_layers, m.attention_heads, m.reasoning_ff, m.reasoning_dropout)
        self.shared = shared

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        x = self.fc(regions_of(rows, self.region_dim))
        if self.pos is not None:
            x = x + self.pos
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.norm(x)], dim=1)
        if self.encoder is not None:
            x = self.encoder(x)
        return self.shared(x)
