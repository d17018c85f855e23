"""Retrieval training's run configuration: typed sections (``training/config_base.py``) loaded from
YAML and ``--set a.b=c`` overrides.

Sections are passed around separately (``cfg.model`` to the model builder, ``cfg.loss`` to the
objective, …), not as one global bag. Loading fails early with one line that names the key and the
valid choices. A saved config (a checkpoint's dict: ``config_from_dict``; a run folder's config.yaml:
``training.config_base.load_saved``, the pipeline's reuse check) loads under today's models.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from training import choices as C
from training.config_base import (
    CAPTION_PRESET_PREFIX,
    ConfigError,
    DropoutRate,
    Fraction,
    Invalid,
    NonNegative,
    NonNegativeInt,
    Positive,
    PositiveInt,
    Section,
    did_you_mean,
    dump_config,
    list_presets,
    load_layers,
    load_saved,
    must,
    parse_override,
    preset_path,
)
from training.data.shortcuts import VALID_CHOICES as SHORTCUT_CHOICES
from training.data.shortcuts import parse_setting
from training.models.clip_files import check_clip_config  # plain files and JSON only: no torch here

__all__ = ["CAPTION_PRESET_PREFIX", "Config", "ConfigError", "DataConfig", "LossConfig", "ModelConfig", "OptimConfig",
           "TrainConfig", "config_from_dict", "did_you_mean", "dump_config", "list_presets", "load_config",
           "parse_override", "preset_path"]


def _valid_shortcut(value: str) -> bool:
    try:
        parse_setting(value)
    except ValueError:
        return False
    return True


class DataConfig(Section):
    path: str = ""  # Karpathy JSON (or its folder), CSV/TSV, parquet, webdataset shards; "" = the synthetic scenes
    columns: str = ""  # CSV/parquet: image=COL,caption=COL,split=COL,metadata=A|B ("" = found by name; tables.py)
    images_root: str = ""  # "" = resolved by the reader (see training/data/karpathy.py)
    drop_missing: bool = False  # drop images listed in the JSON but missing on disk
    synthetic_images: int = 3000  # size of the synthetic dataset when path is ""
    synthetic_seed: int = 0
    min_word_count: PositiveInt = 1  # vocabulary: words seen fewer times in train captions become <unk>
    max_caption_len: PositiveInt = 40  # tokens; longer captions are truncated (Flickr8k max is 37)
    cache_dir: str = ""  # feature/target caches; "" = $LTD_CACHE_DIR or ~/.cache/ltd
    # none | unique | image_only | caption_only | bits:N (SVL)
    shortcuts: Annotated[str, must(_valid_shortcut, f"is not valid; choose one of: {SHORTCUT_CHOICES}")] = "none"
    val_split: str = "val"
    train_fraction: Fraction = 1.0  # < 1: train on a seeded subset of the training images, the same images a
    # captioner's SR-PL run with data.labelled_fraction = train_fraction keeps for the same seed
    train_subset_seed: int = -1  # the subset's seed; -1 = train.seed


class ModelConfig(Section):
    # Image side.
    backbone: C.Backbone = "efficientnet_lite0"
    precomputed_path: str = ""  # .npy aligned with the dataset's images, or .npz with ids + features
    backbone_weights: str = ""  # resnet*: local ImageNet weights file (never downloaded)
    image_features: C.ImageFeatures = "pooled"  # pooled (last block) | fne (full-network embedding) | grid
    fne_discretize: bool = True  # fne: map standardised features to {-1, 0, 1} (the FNE paper) or keep them
    feature_dropout: DropoutRate = 0.0  # dropout on the image features before the image head (training only)
    image_size: Annotated[int, must(lambda v: v >= 32, "must be >= 32")] = 224
    resize: int = 0  # short side before cropping; 0 = image_size (10-crop needs resize > image_size, e.g. 256)
    crops: C.Crops = 1  # 1 centre | 2 centre+flip | 10 ten-crop: cached views (see train.multi_view)
    freeze_backbone: bool = True  # frozen → features cached once, training runs heads only
    unfreeze_after_epoch: int = -1  # -1 never; the paper's recipe unfreezes at epoch 30
    backbone_lr_scale: float = 0.1
    image_head: C.Head = "mlp"  # mlp (2 layers) | linear (bias-free, as the FNE paper)
    # Image encoders that reason over regions (issue 21; training/models/reasoning.py). The regions are
    # the packaged CNN's grid cells (image_features=grid) or precomputed region features (backbone=precomputed).
    image_encoder: C.ImageEncoder = "head"  # head (features → projection head) | vsrn (graph reasoning + GRU) | tern
    # channels per region; 0 = from the features (1280 for grid cells, the file's for precomputed)
    region_dim: Annotated[int, must(lambda v: v >= 0, "must be >= 0 (0 = from the features)")] = 0
    region_boxes: bool = True  # precomputed regions: append [x1, y1, x2, y2, area] when the source has boxes
    region_positions: bool = False  # tern: a learned embedding per region slot (grid cells have a fixed layout)
    reasoning_dim: PositiveInt = 512  # width of the region projection, the GCN / transformer layers
    reasoning_layers: NonNegativeInt = 4  # vsrn: graph-convolution layers (VSRN: 4); tern: image-only layers (TERN: 4)
    shared_layers: NonNegativeInt = 2  # tern: transformer layers shared by both modalities (TERN: 2)
    attention_heads: PositiveInt = 4  # tern: heads per transformer layer (TERN: 4)
    reasoning_ff: PositiveInt = 1024  # tern: feed-forward width of the transformer layers (TERN: 2048)
    reasoning_dropout: DropoutRate = 0.1  # tern: dropout inside the transformer layers (TERN: 0.1)
    # Caption side.
    text_encoder: C.TextEncoder = "gru"  # gru (word embeddings → bi-GRU) | sbert (fine-tuned) | tern (shared layers) | clip
    clip_path: str = ""  # backbone/text_encoder=clip: a CLIP, SigLIP, sentence-transformers or open_clip folder (towers.py)
    clip_text_path: str = ""  # text_encoder=clip: a text tower replacing clip_path's (sentence-transformers, M-CLIP style)
    word_embeddings: str = "glove"  # glove (packaged 6B-50d) | random | path to a GloVe .txt file
    word_dim: int = 50  # only used with word_embeddings=random
    text_hidden: int = 512  # GRU hidden size per direction
    text_layers: int = 1
    token_dropout: DropoutRate = 0.0  # probability of replacing a caption token with <unk> while training
    text_pool: C.TextPool = "mean"  # gru: how the bi-GRU's states become one vector (over the caption's words)
    sbert_path: str = ""  # text_encoder=sbert: local sentence-transformers folder ("" = packaged MiniLM)
    # sbert/tern/clip text: -1 fine-tune all layers, 0 frozen (sbert: embeddings cached), k top k layers
    sbert_train_layers: Annotated[int, must(lambda v: v >= -1, "must be -1 (all), 0 (frozen) or a layer count")] = -1
    text_head: C.Head = "mlp"  # projection head of the caption encoder: mlp (2 layers) | linear
    # Joint space.
    embed_dim: PositiveInt = 1024
    head_hidden: int = 2048
    batchnorm: bool = False  # BatchNorm on the heads' outputs (the paper does this for triplet runs)
    # Decoder (LTD / ITD), used when loss.mode != none.
    decoder_hidden: int = 1024
    decoder_layers: PositiveInt = 3

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.resize and self.resize < self.image_size:
            raise Invalid("resize", self.resize, "must be 0 or >= model.image_size")
        if self.reasoning_dim % self.attention_heads:
            raise Invalid("attention_heads", self.attention_heads,
                          f"must be >= 1 and divide model.reasoning_dim={self.reasoning_dim}")
        if self.backbone == "precomputed" and not (self.precomputed_path and self.freeze_backbone):
            raise ValueError("model.backbone=precomputed needs model.precomputed_path and model.freeze_backbone=true "
                             "(precomputed features cannot be fine-tuned)")
        if self.image_features == "fne" and not self.freeze_backbone:
            raise ValueError("model.image_features=fne needs a frozen backbone (model.freeze_backbone=true)")
        _check_regions(self)
        check_clip_config(self)
        return self


def _check_regions(m: ModelConfig) -> None:
    """The region encoders (vsrn, tern) and the features they read."""
    if (m.image_encoder == "tern") != (m.text_encoder == "tern"):
        raise ValueError(f"model.image_encoder={m.image_encoder!r} with model.text_encoder={m.text_encoder!r}: "
                         "TERN's shared transformer layers need both sides, so set both to tern (or neither)")
    if m.image_encoder == "head":
        if m.image_features == "grid" and m.backbone != "precomputed":
            raise ValueError("model.image_features=grid gives a set of regions: pick a region encoder "
                             "(model.image_encoder=vsrn or tern)")
        return
    if m.image_features == "fne":
        raise ValueError(f"model.image_encoder={m.image_encoder} reads regions, not a full-network embedding: "
                         "model.image_features=fne does not apply")
    # precomputed: region features from the file (training/regions.py); else the packaged CNN's grid
    if m.backbone != "precomputed" and (m.backbone != "efficientnet_lite0" or m.image_features != "grid"):
        raise ValueError(f"model.image_encoder={m.image_encoder} reasons over regions: use the packaged CNN's grid "
                         "cells (model.backbone=efficientnet_lite0, model.image_features=grid) or precomputed region "
                         "features (model.backbone=precomputed, model.precomputed_path=...)")
    if m.crops != 1:
        raise ValueError(f"model.crops={m.crops}: region encoders read one view (the mean of a grid and its mirror "
                         "image is not a grid of anything); set model.crops=1")


class LossConfig(Section):
    contrastive: C.Contrastive = "infonce"
    tau: Positive = 0.05
    margin: NonNegative = 0.2
    ifm_epsilon: float = 0.1
    mode: C.CombineMode = "none"  # replay: constraint with a fixed, logged λ(t) (lambda_schedule)
    decoder: C.Decoder = "ltd"  # ltd (latent target) | itd (input tokens)
    itd_reduction: C.ItdReduction = "mean"  # itd: mean token NLL, or sum over each caption's tokens (the paper's)
    ltd_side: C.LtdSide = "text"  # ltd: decode the targets from the caption embedding (the paper's), image, or both
    ltd_targets: C.LtdTargets = "caption"  # ltd: own target; controls: "shuffled" (another caption's), "same_image" (a sibling's)
    beta: NonNegative = 1.0  # dual: L_con + beta * L_rec
    eta: Positive = 0.2  # constraint: L_con + lambda * (L_rec / eta - 1)
    lambda_init: float = 1.0
    lambda_lr: float = 5e-3
    lambda_momentum: float = 0.9
    lambda_dampening: float = 0.9
    lambda_max: Positive = 100.0
    lambda_schedule: str = ""  # replay: a finished constraint run's folder (or its lambda_trace.npz)
    # LTD targets: "" = packaged all-MiniLM-L6-v2, "all-mpnet-base-v2" (extra [mpnet]), "glove-mean",
    # "glove-randlstm" (both Flickr-clean: training/packaged_models.py) or a folder
    target_model: str = ""
    curriculum_patience: int = 0  # sh→mh: switch to max-of-hinges after this many epochs without val gain

    @model_validator(mode="after")
    def _consistent(self) -> LossConfig:
        if not 0 <= self.lambda_init <= self.lambda_max:
            raise Invalid("lambda_init", self.lambda_init, "must be in [0, lambda_max]")
        for key, default in (("ltd_side", "text"), ("ltd_targets", "caption")):
            if getattr(self, key) != default and self.decoder != "ltd":
                raise Invalid(key, getattr(self, key),
                              "needs loss.decoder=ltd (ITD decodes the caption's own tokens from the caption embedding)")
        if self.mode == "replay" and not self.lambda_schedule:
            raise ValueError("loss.mode=replay needs loss.lambda_schedule (a finished constraint run's folder)")
        return self


class OptimConfig(Section):
    optimizer: C.Optimizer = "adam"
    lr: Positive = 2e-4
    weight_decay: float = 0.0
    warmup_steps: NonNegativeInt = 200
    schedule: C.Schedule = "cosine"
    min_lr_ratio: float = 0.0
    grad_clip: Annotated[float, must(lambda v: v >= 0, "must be >= 0 (0 disables clipping)")] = 2.0


class TrainConfig(Section):
    name: str = ""
    epochs: PositiveInt = 20
    batch_size: Annotated[int, must(lambda v: v >= 2, "must be >= 2 (contrastive losses need negatives)")] = 128
    seed: int = 0
    device: C.Device = "auto"
    amp: bool = True  # mixed precision on CUDA (ignored on CPU)
    amp_dtype: C.AmpDtype = "fp16"  # CUDA autocast type: fp16 (with loss scaling) | bf16 (no scaling)
    cpu_amp: C.CpuAmp = "fp32"  # CPU autocast: bf16 | auto (bf16 only where native: AVX512-BF16 / AMX)
    log_every: PositiveInt = 50  # steps between metrics.jsonl lines
    checkpoint_every: NonNegativeInt = 0  # also checkpoint every N steps inside an epoch (0 = at epoch ends only)
    swa: bool = False  # average 5 snapshots from the last 10% of each epoch
    multi_view: bool = True  # sample one cached view (crop/flip) per image each step
    num_threads: int = 0  # torch CPU threads; 0 = torch default
    val_max_images: int = 0  # 0 = whole val split
    init_from: str = ""  # a retrieval checkpoint whose weights start this run (fine-tuning; not a resume: new optimiser)


class Config(Section):
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)


def load_config(path: str | Path | None = None, overrides: Iterable[str] = (), base: Mapping | None = None) -> Config:
    """Defaults ← ``base`` dict ← YAML file (path or preset name) ← ``--set`` overrides; validated."""
    return load_layers(Config, path, overrides, base, kind="train")


def config_from_dict(d: Mapping) -> Config:
    """A config dict as a checkpoint or config.yaml holds it (any age) → Config."""
    return load_saved(Config, d)

