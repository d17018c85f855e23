"""An inference-only copy of EfficientNet-Lite with BatchNorm folded into the convolutions.

Why: on a CPU, the package model spends ~60% of its time outside the convolutions (separate
BatchNorm, ReLU6 clamps and explicit "same" padding copies). Folding BN into the conv weights,
padding inside the conv where TF-"same" padding is symmetric and using in-place ReLU6 roughly
doubles feature-extraction throughput. The result equals the package model to float tolerance
(tests/test_grid_features.py checks the grid path against it); it is used only for frozen-backbone feature extraction.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    w = conv.weight * scale.reshape(-1, 1, 1, 1)
    b = bn.bias - bn.running_mean * scale
    if conv.bias is not None:
        b = b + conv.bias * scale
    return w.detach().clone(), b.detach().clone()


class SameConv(nn.Module):
    """Conv with BN folded in and TensorFlow "same" padding computed for the actual input size."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, relu6: bool):
        super().__init__()
        w, b = _fold(conv, bn)
        self.weight = nn.Parameter(w, requires_grad=False)
        self.bias = nn.Parameter(b, requires_grad=False)
        st = conv.stride
        self.stride = int(st[0]) if isinstance(st, (tuple, list)) else int(st)
        self.k = w.shape[-1]
        self.groups = conv.groups
        self.relu6 = relu6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ih, iw = x.shape[-2:]
        s, k = self.stride, self.k
        ph = max((math.ceil(ih / s) - 1) * s + k - ih, 0)
        pw = max((math.ceil(iw / s) - 1) * s + k - iw, 0)
        if ph % 2 == 0 and pw % 2 == 0:
            y = F.conv2d(x, self.weight, self.bias, s, (ph // 2, pw // 2), 1, self.groups)
        else:
            x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
            y = F.conv2d(x, self.weight, self.bias, s, 0, 1, self.groups)
        return F.hardtanh_(y, 0.0, 6.0) if self.relu6 else y


class FusedBlock(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        a = block._block_args
        self.expand = SameConv(block._expand_conv, block._bn0, True) if a.expand_ratio != 1 else None
        self.depthwise = SameConv(block._depthwise_conv, block._bn1, True)
        self.project = SameConv(block._project_conv, block._bn2, False)
        self.skip = bool(a.id_skip and a.stride == 1 and a.input_filters == a.output_filters)
        if getattr(block, "has_se", False):
            raise ValueError("squeeze-excitation blocks are not supported (EfficientNet-Lite has none)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.depthwise(y))
        return y + x if self.skip else y


class FusedEfficientNetLite(nn.Module):
    """Returns the spatially averaged output of the stem, of every block and of the head
    (``forward_all``), only the head's pooled features (``forward``), or the head's whole feature
    map, one row per grid cell (``forward_grid``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        if not isinstance(model._swish, nn.ReLU6):
            raise ValueError("only EfficientNet-Lite (ReLU6) models can be fused")
        model = model.eval()
        self.stem = SameConv(model._conv_stem, model._bn0, True)
        self.blocks = nn.ModuleList(FusedBlock(b) for b in model._blocks)
        self.head = SameConv(model._conv_head, model._bn1, True)
        self.dims = [self.stem.weight.shape[0]] + [b.project.weight.shape[0] for b in self.blocks] + [
            self.head.weight.shape[0]]

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x).mean((2, 3))

    @torch.no_grad()
    def forward_grid(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H·W·C): the head's feature map in row-major cell order, channels last within a cell
        (7×7×1280 at 224 px), so ``reshape(B, H·W, C)`` gives one region per cell."""
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x).permute(0, 2, 3, 1).flatten(1)

    @torch.no_grad()
    def forward_all(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        outs = [x.mean((2, 3))]
        for b in self.blocks:
            x = b(x)
            outs.append(x.mean((2, 3)))
        outs.append(self.head(x).mean((2, 3)))
        return torch.cat(outs, 1)
