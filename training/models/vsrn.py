"""VSRN-style image encoder (Li et al., 2019, "Visual Semantic Reasoning for Image-Text Matching"):
regions → linear projection (L2-normalised per region) → graph convolutions over the fully connected
region graph → GRU over the reasoned regions → its last hidden state → projection head.

The graph convolution is VSRN's ``Rs_GCN``: the affinity of regions i and j is
``φ(v_i)·ψ(v_j)``, divided by the number of regions; each layer adds ``BN(W (R g(V)))`` to its input.
BN's scale starts at 0 (as in VSRN), so every layer starts as the identity and the graph part of the
encoder grows in from the GRU's view of the plain regions. As in the LTD paper's use of VSRN, its
caption decoder is left out and the caption side is this project's bi-GRU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.models.heads import ProjectionHead


def regions_of(rows: torch.Tensor, region_dim: int) -> torch.Tensor:
    """(B, R·C) region rows as the feature cache stores them → (B, R, C) float32 (a view when already float32)."""
    if rows.dim() != 2 or rows.shape[1] % region_dim:
        raise ValueError(f"region rows must be (B, R·{region_dim}), got {tuple(rows.shape)}")
    return rows.float().reshape(rows.shape[0], rows.shape[1] // region_dim, region_dim)


class RegionGCN(nn.Module):
    """One graph-reasoning layer over a fully connected region graph with learned affinities."""

    def __init__(self, dim: int, inner: int | None = None):
        super().__init__()
        inner = inner or dim
        self.g, self.theta, self.phi = (nn.Linear(dim, inner) for _ in range(3))
        self.w = nn.Linear(inner, dim)
        self.bn = nn.BatchNorm1d(dim)
        nn.init.zeros_(self.bn.weight)  # VSRN: the residual branch starts switched off
        nn.init.zeros_(self.bn.bias)

    def affinity(self, v: torch.Tensor) -> torch.Tensor:
        """(B, R, D) → (B, R, R): φ(v_i)·ψ(v_j) / R."""
        return self.theta(v) @ self.phi(v).transpose(1, 2) / v.shape[1]

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        y = self.w(self.affinity(v) @ self.g(v))  # (B, R, D)
        return v + self.bn(y.transpose(1, 2)).transpose(1, 2)


class VSRNImageHead(nn.Module):
    """Region rows (B, R·C) → (B, E) L2-normalised image embeddings."""

    def __init__(self, region_dim: int, dim: int, embed_dim: int, *, layers: int = 4, head: str = "mlp",
                 head_hidden: int = 2048, batchnorm: bool = False):
        super().__init__()
        self.region_dim = region_dim
        self.fc = nn.Linear(region_dim, dim)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)
        self.gcn = nn.ModuleList(RegionGCN(dim) for _ in range(layers))
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.head = ProjectionHead(dim, embed_dim, head_hidden, head, batchnorm)

    def reason(self, rows: torch.Tensor) -> torch.Tensor:
        """(B, R·C) → (B, R, D): projected, normalised regions after the graph layers (normalised again)."""
        v = F.normalize(self.fc(regions_of(rows, self.region_dim)), dim=-1)
        for layer in self.gcn:
            v = layer(v)
        return F.normalize(v, dim=-1)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(self.reason(rows))
        return self.head(h[-1])
