"""The modules a pretrained tower becomes: an image backbone and a caption encoder around the tower's own
forward pass (``towers.py`` builds them for SigLIP, open_clip and sentence-transformers towers; CLIP's
own are in ``clip.py``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.models.backbones import Backbone
from training.models.tower_files import TowerError


class TowerImageBackbone(Backbone):
    """A pretrained image tower (pixels → its joint-space embedding, unnormalised) as a backbone."""

    rebuildable = False  # its weights travel in checkpoints
    cache_inference = False  # indexes embed from the files in float32: the feature cache stores float16
    train_augment = False  # fine-tuned on its own preprocessing, like CLIP

    def __init__(self, tower: nn.Module, preprocess, weights_id: str, out_dim: int, name: str):
        super().__init__()
        self.tower, self.preprocess, self.weights_id, self.out_dim = tower, preprocess, weights_id, int(out_dim)
        self.name, self.features = name, "pooled"

    def _use_bf16_cpu(self) -> bool:
        return False

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.tower(images)

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> torch.Tensor:
        was = self.training
        self.eval()
        out = self.forward(images)
        self.train(was)
        return out.float()


class TowerTextEncoder(nn.Module):
    """A pretrained text tower as a caption encoder: ``tokenize(texts)`` → the tower's inputs,
    ``tower(**inputs)`` → its joint-space embedding, normalised here. ``train_layers``: -1 fine-tunes
    everything, 0 freezes the tower (other counts need a tower that names its layers)."""

    def __init__(self, tower: nn.Module, tokenize, out_dim: int, train_layers: int = -1):
        super().__init__()
        self.tower, self.tokenize, self.out_dim = tower, tokenize, int(out_dim)
        if train_layers > 0:
            raise TowerError("model.sbert_train_layers: only -1 (all) or 0 (frozen) for this text tower")
        for p in self.tower.parameters():
            p.requires_grad_(train_layers != 0)

    def prepare(self, texts, train: bool = False, generator: torch.Generator | None = None) -> dict:
        return self.tokenize(list(texts))

    def forward(self, batch: dict) -> torch.Tensor:
        return F.normalize(self.tower(**batch), dim=-1)
