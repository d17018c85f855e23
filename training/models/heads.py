"""Projection heads and the Full-Network-Embedding feature discretiser."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ProjectionHead(nn.Module):
    """``mlp``: Linear → ReLU → Linear (2 layers, as the LTD paper's heads); ``linear``: one bias-free
    Linear (the FNE paper's projection). Optional BatchNorm on the output (the paper's triplet runs)."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 2048, kind: str = "mlp", batchnorm: bool = False):
        super().__init__()
        if kind == "mlp":
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim))
        elif kind == "linear":
            self.net = nn.Linear(in_dim, out_dim, bias=False)
        else:
            raise ValueError(f"unknown head {kind!r}; choose mlp or linear")
        self.bn = nn.BatchNorm1d(out_dim) if batchnorm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net(x)
        if self.bn is not None:
            x = self.bn(x)
        return F.normalize(x, dim=-1)


class FNEDiscretize(nn.Module):
    """Standardise each feature with train-set mean/std, then map to {-1, 0, 1} with the FNE paper's
    thresholds (x < -0.25 → -1, x > 0.15 → 1), or keep the standardised values (``discretize=False``).
    The statistics are buffers, so checkpoints carry them."""

    def __init__(self, dim: int, low: float = -0.25, high: float = 0.15, discretize: bool = True):
        super().__init__()
        self.discretize = discretize
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))
        self.low, self.high = low, high

    @torch.no_grad()
    def fit(self, feats: torch.Tensor) -> None:
        self.mean.copy_(feats.mean(0))
        self.std.copy_(feats.std(0).clamp_min(1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean) / self.std
        if not self.discretize:
            return z
        return (z > self.high).to(x.dtype) - (z < self.low).to(x.dtype)
