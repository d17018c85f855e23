"""The dual encoder (image encoder + caption encoder + optional reconstruction decoder).

Models only encode; losses live in ``training/losses``. ``build_model`` makes a model from the
config sections, and ``model_from_checkpoint`` rebuilds one from a checkpoint without touching the
network or the GloVe file (word vectors come from the saved state).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from PIL import Image
from torch import nn

from training.config import Config, ModelConfig
from training.data.vocab import Vocab
from training.device import to_device
from training.errors import UserError
from training.losses.objective import objective_needs
from training.models.backbones import Backbone, build_backbone
from training.models.clip import ClipSource, NormalizedIdentity
from training.models.clip_files import uses_clip
from training.models.decoders import InputTokenDecoder, LatentTargetDecoder
from training.models.heads import FNEDiscretize, ProjectionHead
from training.models.reasoning import region_image_head, shared_layers, tern_text_encoder
from training.models.text_encoder import GRUTextEncoder, SBERTTextEncoder
from training.models.towers import source_from_dir
from training.targets import resolve_sentence_model


class NoImageBackbone(UserError, RuntimeError):
    """Raised when raw images are encoded with a model trained on precomputed features."""


class ImageEncoder(nn.Module):
    """Backbone (or cached features) → ``head``: a projection head, or a region-reasoning head
    (:mod:`training.models.reasoning`) that reads the features as regions."""

    def __init__(self, backbone: Backbone | None, feat_dim: int, cfg: ModelConfig, head: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.fne = FNEDiscretize(feat_dim, discretize=cfg.fne_discretize) if cfg.image_features == "fne" else None
        self.dropout = nn.Dropout(cfg.feature_dropout) if cfg.feature_dropout > 0 else nn.Identity()
        self.head = head or ProjectionHead(feat_dim, cfg.embed_dim, cfg.head_hidden, cfg.image_head, cfg.batchnorm)
        self.n_crops = cfg.crops
        self.frozen = cfg.freeze_backbone
        self.feat_dim, self.embed_dim = feat_dim, cfg.embed_dim

    def encode_features(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, D) backbone features (already averaged over views) → (B, E) normalised embeddings."""
        if self.fne is not None:
            feats = self.fne(feats)
        return self.head(self.dropout(feats))

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) or (B, V, 3, H, W) → (B, D), averaged over views."""
        if self.backbone is None:
            raise NoImageBackbone("this model was trained on precomputed features and has no image backbone")
        views = images.dim() == 5
        x = images.flatten(0, 1) if views else images
        f = self.backbone.extract(x) if self.frozen else self.backbone(x)
        return f.view(images.shape[0], images.shape[1], -1).mean(1) if views else f

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.encode_features(self.features(images))

    def prepare(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """PIL RGB images → (B, V, 3, H, W) with the same views the feature cache averages."""
        if self.backbone is None:
            raise NoImageBackbone("this model was trained on precomputed features and has no image backbone")
        return torch.stack([self.backbone.preprocess(im, self.n_crops).reshape(self.n_crops, 3,
                            self.backbone.preprocess.size, self.backbone.preprocess.size) for im in images])


class DualEncoder(nn.Module):
    """``logit_scale``: a pretrained temperature the model carries (CLIP's ``log(1/τ)``) that the
    contrastive loss uses and fine-tunes instead of ``loss.tau``; None for the others."""

    def __init__(self, image: ImageEncoder, text: nn.Module, decoder: nn.Module | None = None,
                 similarity: str = "cosine", logit_scale: nn.Parameter | None = None):
        super().__init__()
        self.image, self.text, self.decoder, self.similarity = image, text, decoder, similarity
        self.logit_scale = logit_scale

    @property
    def device(self) -> torch.device:
        return next(self.text.parameters()).device

    def encode_image_features(self, feats: torch.Tensor) -> torch.Tensor:
        return self.image.encode_features(feats)

    def frozen_prefixes(self, backbone_trained: bool) -> list[str]:
        """State-dict prefixes of frozen pretrained parts that are rebuilt from their package or
        folder rather than saved in checkpoints."""
        bb = self.image.backbone
        out = [] if backbone_trained or bb is None or not bb.rebuildable else ["image.backbone."]
        return out + [f"text.{p}" for p in getattr(self.text, "frozen_prefixes", lambda: [])()]

    def encode_text(self, batch: dict) -> torch.Tensor:
        return self.text(batch)

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """Normalised caption embeddings (n, E) on the CPU (inference mode)."""
        was = self.training
        self.eval()
        if hasattr(self.text, "embed_corpus"):
            self.text.embed_corpus(texts)
        out = [self.text(to_device(self.text.prepare(texts[i : i + batch_size]), self.device)).float().cpu()
               for i in range(0, len(texts), batch_size)]
        self.train(was)
        return torch.cat(out) if out else torch.zeros(0, self.text.out_dim)


class StepEncoders(nn.Module):
    """A training step's two encoders as one forward: DistributedDataParallel synchronises the gradients
    of the module whose forward it runs (the decoder, used by the objective on these outputs, is part
    of that module and so is synchronised too). Without a process group it is a plain call."""

    def __init__(self, model: DualEncoder):
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor | None, feats: torch.Tensor | None,
                tokens: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(image, caption) embeddings: from images end to end (``pixels``) or cached features (``feats``)."""
        img = self.model.image(pixels) if pixels is not None else self.model.encode_image_features(feats)
        return img, self.model.encode_text(tokens)


@dataclass(frozen=True)
class ModelDims:
    """The sizes :func:`build_model` takes from the data rather than the config: ``feat_dim``, the
    precomputed features' width (required for them; a backbone's own otherwise), ``region_dim``, the
    channels per precomputed region (when ``model.region_dim`` is 0), and ``target_dim``, the LTD
    targets' width (from the target cache; 0: none)."""

    feat_dim: int | None = None
    region_dim: int = 0
    target_dim: int = 0


@dataclass(frozen=True)
class PretrainedParts:
    """What :func:`build_model` may reuse instead of loading: the GRU's ``word_embeddings`` (GloVe rows),
    an already-loaded ``backbone`` to share, and ``clip``, the CLIP of ``model.clip_path`` (already read,
    or a checkpoint's copy; read from the folder when None and a tower needs it)."""

    word_embeddings: torch.Tensor | None = None
    backbone: Backbone | None = None
    clip: ClipSource | None = None


def build_model(cfg: Config, vocab: Vocab, *, dims: ModelDims | None = None,
                parts: PretrainedParts | None = None) -> DualEncoder:
    """Build from config sections, with the data's sizes ``dims`` and the pretrained ``parts`` to reuse
    (None: the defaults of :class:`ModelDims` and :class:`PretrainedParts`)."""
    dims = dims if dims is not None else ModelDims()
    parts = parts if parts is not None else PretrainedParts()
    feat_dim, region_dim, target_dim = dims.feat_dim, dims.region_dim, dims.target_dim
    word_embeddings, backbone, clip = parts.word_embeddings, parts.backbone, parts.clip
    m = cfg.model
    clip_head = None
    if uses_clip(m):
        clip = clip or source_from_dir(m.clip_path, m.clip_text_path or None)
        cfg = copy.deepcopy(cfg)  # the joint space is CLIP's: other towers and the decoder project into it
        cfg.model.embed_dim = clip.embed_dim
        m = cfg.model
        if m.backbone == "clip":  # CLIP's own projection is the image side's head
            backbone = backbone if backbone is not None else clip.image_backbone()
            clip_head = NormalizedIdentity()
    if backbone is None and m.backbone != "precomputed":
        backbone = build_backbone(m.backbone, features=m.image_features, image_size=m.image_size,
                                  weights=m.backbone_weights, resize=m.resize)
    if backbone is not None:
        feat_dim = backbone.out_dim
        for p in backbone.parameters():
            p.requires_grad_(not m.freeze_backbone)
    if feat_dim is None:
        raise ValueError("feat_dim is required when the backbone is precomputed")
    shared = shared_layers(m)  # TERN: one module that both encoders apply
    head = clip_head if clip_head is not None else region_image_head(m, feat_dim, backbone, shared, region_dim)
    image = ImageEncoder(backbone, feat_dim, m, head=head)
    text = clip.text_encoder(m.sbert_train_layers) if m.text_encoder == "clip" else \
        build_text_encoder(cfg, vocab, word_embeddings, shared)
    needs = objective_needs(cfg.loss)  # which decoder and similarity the training objective asks for
    decoder: nn.Module | None = None
    if needs.decoder == "ltd":
        if target_dim <= 0:
            raise ValueError("LTD needs the target dimension (from the target cache)")
        decoder = LatentTargetDecoder(m.embed_dim, target_dim, m.decoder_hidden, m.decoder_layers)
    elif needs.decoder == "itd":
        decoder = InputTokenDecoder(m.embed_dim, len(vocab), m.decoder_hidden)
    both_clip = m.backbone == "clip" and m.text_encoder == "clip"
    return DualEncoder(image, text, decoder, similarity=needs.similarity, logit_scale=clip.logit_scale if both_clip else None)


def build_text_encoder(cfg: Config, vocab: Vocab, word_embeddings: torch.Tensor | None,
                       shared: nn.Module | None = None) -> nn.Module:
    """The caption encoder of ``model.text_encoder``: gru | sbert | tern (which needs the shared layers)."""
    m = cfg.model
    if m.text_encoder == "gru":
        return GRUTextEncoder(vocab, m, max_len=cfg.data.max_caption_len, embeddings=word_embeddings)
    if m.text_encoder == "tern":
        return tern_text_encoder(m, shared, cfg.data.max_caption_len)
    return SBERTTextEncoder(str(resolve_sentence_model(m.sbert_path)), m, max_len=cfg.data.max_caption_len,
                            cache_dir=cfg.data.cache_dir)
