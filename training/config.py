"""Typed run configuration: dataclasses loaded from YAML, overridable with ``--set a.b=c``.

Sections are passed around separately (``cfg.model`` to the model builder, …), not as one global
bag. ``validate`` fails early with a message that names the key and the valid choices.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from training.fsio import atomic_write_text


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key."""


@dataclass
class DataConfig:
    path: str = ""  # Karpathy JSON (or its folder); "" = the embedded synthetic scenes
    images_root: str = ""  # "" = resolved by the reader (see training/data/karpathy.py)
    drop_missing: bool = False  # drop images listed in the JSON but missing on disk
    synthetic_images: int = 3000  # size of the synthetic dataset when path is ""
    synthetic_seed: int = 0
    min_word_count: int = 1  # vocabulary: words seen fewer times in train captions become <unk>
    max_caption_len: int = 40  # tokens; longer captions are truncated (Flickr8k max is 37)
    cache_dir: str = ""  # feature/target caches; "" = $LTD_CACHE_DIR or ~/.cache/ltd
    shortcuts: str = "none"  # none | unique | image_only | caption_only | bits:N (SVL)
    val_split: str = "val"
    train_fraction: float = 1.0  # < 1: train on a seeded subset of the training images, the same images a
    # captioner's SR-PL run with data.labelled_fraction = train_fraction keeps for the same seed
    train_subset_seed: int = -1  # the subset's seed; -1 = train.seed


@dataclass
class ModelConfig:
    # Image side.
    backbone: str = "efficientnet_lite0"  # efficientnet_lite0 | resnet50 | resnet152 | precomputed
    precomputed_path: str = ""  # .npy aligned with the dataset's images, or .npz with ids + features
    backbone_weights: str = ""  # resnet*: local ImageNet weights file (never downloaded)
    image_features: str = "pooled"  # pooled (last block) | fne (full-network embedding)
    fne_discretize: bool = True  # fne: map standardised features to {-1, 0, 1} (the FNE paper) or keep them
    feature_dropout: float = 0.0  # dropout on the image features before the image head (training only)
    image_size: int = 224
    resize: int = 0  # short side before cropping; 0 = image_size (10-crop needs resize > image_size, e.g. 256)
    crops: int = 1  # 1 centre | 2 centre+flip | 10 ten-crop: cached views (see train.multi_view)
    freeze_backbone: bool = True  # frozen → features cached once, training runs heads only
    unfreeze_after_epoch: int = -1  # -1 never; the paper's recipe unfreezes at epoch 30
    backbone_lr_scale: float = 0.1
    image_head: str = "mlp"  # mlp (2 layers) | linear (bias-free, as the FNE paper)
    # Image encoders that reason over regions (issue 21; training/models/reasoning.py). The regions are
    # the packaged CNN's grid cells (image_features=grid) or precomputed region features (backbone=precomputed).
    image_encoder: str = "head"  # head (features → projection head) | vsrn (graph reasoning + GRU) | tern (transformer)
    region_dim: int = 0  # channels per region; 0 = from the features (1280 for grid cells, the file's for precomputed)
    region_boxes: bool = True  # precomputed regions: append [x1, y1, x2, y2, area] when the source has boxes
    region_positions: bool = False  # tern: a learned embedding per region slot (grid cells have a fixed layout)
    reasoning_dim: int = 512  # width of the region projection, the GCN / transformer layers (and TERN's shared ones)
    reasoning_layers: int = 4  # vsrn: graph-convolution layers (VSRN: 4); tern: image-only transformer layers (TERN: 4)
    shared_layers: int = 2  # tern: transformer layers shared by both modalities, applied to each separately (TERN: 2)
    attention_heads: int = 4  # tern: heads per transformer layer (TERN: 4)
    reasoning_ff: int = 1024  # tern: feed-forward width of the transformer layers (TERN: 2048)
    reasoning_dropout: float = 0.1  # tern: dropout inside the transformer layers (TERN: 0.1)
    # Caption side.
    text_encoder: str = "gru"  # gru (word embeddings → bi-GRU) | sbert (fine-tuned sentence-transformer) | tern (its tokens → shared layers)
    word_embeddings: str = "glove"  # glove (packaged 6B-50d) | random | path to a GloVe .txt file
    word_dim: int = 50  # only used with word_embeddings=random
    text_hidden: int = 512  # GRU hidden size per direction
    text_layers: int = 1
    token_dropout: float = 0.0  # probability of replacing a caption token with <unk> while training
    text_pool: str = "mean"  # gru: how the bi-GRU's states become one vector: mean | max (over the caption's words)
    sbert_path: str = ""  # text_encoder=sbert: local sentence-transformers folder ("" = packaged MiniLM)
    sbert_train_layers: int = -1  # sbert/tern: -1 fine-tune all layers, 0 frozen (sbert: embeddings cached), k top k layers
    text_head: str = "mlp"  # projection head of the caption encoder: mlp (2 layers) | linear
    # Joint space.
    embed_dim: int = 1024
    head_hidden: int = 2048
    batchnorm: bool = False  # BatchNorm on the heads' outputs (the paper does this for triplet runs)
    # Decoder (LTD / ITD), used when loss.mode != none.
    decoder_hidden: int = 1024
    decoder_layers: int = 3


@dataclass
class LossConfig:
    contrastive: str = "infonce"  # infonce | triplet | ifm | sh | mh | order
    tau: float = 0.05
    margin: float = 0.2
    ifm_epsilon: float = 0.1
    mode: str = "none"  # none | dual | constraint | replay (constraint with a fixed, logged λ(t): lambda_schedule)
    decoder: str = "ltd"  # ltd (latent target) | itd (input tokens)
    itd_reduction: str = "mean"  # itd: mean token NLL, or sum over each caption's tokens (the paper's), mean over captions
    ltd_side: str = "text"  # ltd: decode the targets from the caption embedding (the paper's), the image embedding, or both (mean)
    ltd_targets: str = "caption"  # ltd: each caption's own target, or "shuffled" (another caption's, a fixed permutation: a control)
    beta: float = 1.0  # dual: L_con + beta * L_rec
    eta: float = 0.2  # constraint: L_con + lambda * (L_rec / eta - 1)
    lambda_init: float = 1.0
    lambda_lr: float = 5e-3
    lambda_momentum: float = 0.9
    lambda_dampening: float = 0.9
    lambda_max: float = 100.0
    lambda_schedule: str = ""  # replay: a finished constraint run's folder (or its lambda_trace.npz)
    target_model: str = ""  # LTD targets: "" = packaged all-MiniLM-L6-v2, "all-mpnet-base-v2" (extra [mpnet]), "glove-mean" (Flickr-clean) or a folder
    curriculum_patience: int = 0  # sh→mh: switch to max-of-hinges after this many epochs without val gain


@dataclass
class OptimConfig:
    optimizer: str = "adam"  # adam | adamw
    lr: float = 2e-4
    weight_decay: float = 0.0
    warmup_steps: int = 200
    schedule: str = "cosine"  # cosine | constant
    min_lr_ratio: float = 0.0
    grad_clip: float = 2.0


@dataclass
class TrainConfig:
    name: str = ""
    epochs: int = 20
    batch_size: int = 128
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    amp: bool = True  # mixed precision on CUDA (ignored on CPU)
    amp_dtype: str = "fp16"  # CUDA autocast type: fp16 (with loss scaling) | bf16 (no scaling: fp32's exponent range)
    cpu_amp: str = "fp32"  # CPU autocast: fp32 | bf16 | auto (bf16 only where native: AVX512-BF16 / AMX)
    log_every: int = 50  # steps between metrics.jsonl lines
    checkpoint_every: int = 0  # also checkpoint every N steps inside an epoch (0 = at epoch ends only)
    swa: bool = False  # average 5 snapshots from the last 10% of each epoch
    multi_view: bool = True  # sample one cached view (crop/flip) per image each step
    num_threads: int = 0  # torch CPU threads; 0 = torch default
    val_max_images: int = 0  # 0 = whole val split


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)


CHOICES: dict[str, tuple[str, ...]] = {
    "model.backbone": ("efficientnet_lite0", "resnet50", "resnet152", "precomputed"),
    "model.image_features": ("pooled", "fne", "grid"),
    "model.image_encoder": ("head", "vsrn", "tern"),
    "model.image_head": ("mlp", "linear"),
    "model.text_head": ("mlp", "linear"),
    "model.text_pool": ("mean", "max"),
    "model.text_encoder": ("gru", "sbert", "tern"),
    "model.crops": ("1", "2", "10"),
    "loss.contrastive": ("infonce", "triplet", "ifm", "sh", "mh", "order", "sh_mh"),
    "loss.mode": ("none", "dual", "constraint", "replay"),
    "loss.decoder": ("ltd", "itd"),
    "loss.itd_reduction": ("mean", "sum"),
    "loss.ltd_side": ("text", "image", "both"),
    "loss.ltd_targets": ("caption", "shuffled"),
    "optim.optimizer": ("adam", "adamw"),
    "optim.schedule": ("cosine", "constant"),
    "train.device": ("auto", "cpu", "cuda"),
    "train.cpu_amp": ("fp32", "bf16", "auto"),
    "train.amp_dtype": ("fp16", "bf16"),
}


def _coerce(value: Any, typ: Any, key: str) -> Any:
    if isinstance(typ, str):  # annotations are strings under `from __future__ import annotations`
        typ = {"bool": bool, "int": int, "float": float, "str": str}.get(typ, typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
        if f != int(f):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(f)
    if typ is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if typ is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return "" if value is None else str(value)
    return value


def _apply(section: Any, values: dict, prefix: str) -> None:
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {values!r}")
    known = {f.name: f for f in fields(section)}
    for k, v in values.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in known:
            hint = did_you_mean(k, list(known))
            raise ConfigError(f"unknown config key {key!r}{hint}; valid keys here: {', '.join(known)}")
        cur = getattr(section, k)
        if dataclasses.is_dataclass(cur):
            _apply(cur, v, key)
        else:
            setattr(section, k, _coerce(v, known[k].type, key))


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=c`` → ("a.b", parsed YAML scalar c)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _nest(key: str, value: Any) -> dict:
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def preset_path(name: str) -> Path | None:
    """A preset shipped in the ``configs`` package (``flickr8k_ltd`` → configs/flickr8k_ltd.yaml)."""
    stem = name[:-5] if name.endswith(".yaml") else name
    res = resources.files("configs") / f"{stem}.yaml"
    return Path(str(res)) if res.is_file() else None


CAPTION_PRESET_PREFIX = "caption_"  # captioner presets (training/captioning/config.py); the rest train dual encoders


def list_presets(kind: str = "train") -> list[str]:
    """Shipped presets: ``train`` (dual encoders) or ``caption`` (captioners)."""
    names = sorted(p.name[:-5] for p in resources.files("configs").iterdir() if p.name.endswith(".yaml"))
    return [n for n in names if n.startswith(CAPTION_PRESET_PREFIX) == (kind == "caption")]


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """" (did you mean X?)" for the closest choice, or ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_into(cfg: Any, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
              base: dict | None = None, kind: str = "train") -> Any:
    """Any dataclass config tree: defaults (``cfg``) ← ``base`` dict ← YAML file (path or preset
    name) ← ``--set`` overrides. Not validated: the caller validates its own config type."""
    if base:
        _apply(cfg, base, "")
    if path:
        p = Path(path)
        if not p.is_file():
            pre = preset_path(str(path))
            if pre is None:
                raise ConfigError(f"config file not found: {path}{did_you_mean(Path(str(path)).stem, list_presets(kind))}; "
                                  f"presets: {', '.join(list_presets(kind))} (`--list-presets`)")
            p = pre
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: invalid YAML: {e}") from None
        _apply(cfg, data, "")
    for ov in overrides:
        key, value = parse_override(ov)
        _apply(cfg, _nest(key, value), "")
    return cfg


def apply_dict(cfg: Any, d: dict) -> Any:
    """Set the keys of a (nested) dict on a dataclass config tree, with type checks."""
    _apply(cfg, d, "")
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: dict | None = None) -> Config:
    """Defaults ← ``base`` dict ← YAML file (path or preset name) ← ``--set`` overrides; validated."""
    cfg = load_into(Config(), path, overrides, base)
    validate(cfg)
    return cfg


def config_from_dict(d: dict) -> Config:
    cfg = Config()
    _apply(cfg, d, "")
    return cfg


def validate(cfg: Config) -> None:
    for key, choices in CHOICES.items():
        sec, name = key.split(".")
        val = str(getattr(getattr(cfg, sec), name))
        if val not in choices:
            raise ConfigError(f"{key}={val!r} is not valid; choose one of: {', '.join(choices)}")
    checks = [
        ("loss.eta", cfg.loss.eta > 0, "must be > 0"),
        ("loss.tau", cfg.loss.tau > 0, "must be > 0"),
        ("loss.beta", cfg.loss.beta >= 0, "must be >= 0"),
        ("loss.margin", cfg.loss.margin >= 0, "must be >= 0"),
        ("loss.lambda_max", cfg.loss.lambda_max > 0, "must be > 0"),
        ("loss.lambda_init", 0 <= cfg.loss.lambda_init <= cfg.loss.lambda_max, "must be in [0, lambda_max]"),
        ("train.batch_size", cfg.train.batch_size >= 2, "must be >= 2 (contrastive losses need negatives)"),
        ("train.epochs", cfg.train.epochs >= 1, "must be >= 1"),
        ("train.log_every", cfg.train.log_every >= 1, "must be >= 1"),
        ("train.checkpoint_every", cfg.train.checkpoint_every >= 0, "must be >= 0"),
        ("optim.lr", cfg.optim.lr > 0, "must be > 0"),
        ("optim.warmup_steps", cfg.optim.warmup_steps >= 0, "must be >= 0"),
        ("optim.grad_clip", cfg.optim.grad_clip >= 0, "must be >= 0 (0 disables clipping)"),
        ("model.embed_dim", cfg.model.embed_dim >= 1, "must be >= 1"),
        ("model.image_size", cfg.model.image_size >= 32, "must be >= 32"),
        ("model.resize", cfg.model.resize == 0 or cfg.model.resize >= cfg.model.image_size, "must be 0 or >= model.image_size"),
        ("model.sbert_train_layers", cfg.model.sbert_train_layers >= -1, "must be -1 (all), 0 (frozen) or a layer count"),
        ("model.token_dropout", 0 <= cfg.model.token_dropout < 1, "must be in [0, 1)"),
        ("model.feature_dropout", 0 <= cfg.model.feature_dropout < 1, "must be in [0, 1)"),
        ("model.decoder_layers", cfg.model.decoder_layers >= 1, "must be >= 1"),
        ("data.max_caption_len", cfg.data.max_caption_len >= 1, "must be >= 1"),
        ("data.min_word_count", cfg.data.min_word_count >= 1, "must be >= 1"),
        ("data.train_fraction", 0 < cfg.data.train_fraction <= 1, "must be in (0, 1]"),
        *((f"loss.{k}", getattr(cfg.loss, k) == default or cfg.loss.decoder == "ltd",
           "needs loss.decoder=ltd (ITD decodes the caption's own tokens from the caption embedding)")
          for k, default in (("ltd_side", "text"), ("ltd_targets", "caption"))),
    ]
    for key, ok, msg in checks:
        if not ok:
            sec, name = key.split(".")
            raise ConfigError(f"{key}={getattr(getattr(cfg, sec), name)!r} {msg}")
    if cfg.loss.mode == "replay" and not cfg.loss.lambda_schedule:
        raise ConfigError("loss.mode=replay needs loss.lambda_schedule (a finished constraint run's folder)")
    if cfg.model.backbone == "precomputed" and not (cfg.model.precomputed_path and cfg.model.freeze_backbone):
        raise ConfigError("model.backbone=precomputed needs model.precomputed_path and model.freeze_backbone=true "
                          "(precomputed features cannot be fine-tuned)")
    if cfg.model.image_features == "fne" and not cfg.model.freeze_backbone:
        raise ConfigError("model.image_features=fne needs a frozen backbone (model.freeze_backbone=true)")
    validate_regions(cfg.model)
    if not ((sc := cfg.data.shortcuts) in ("none", "unique", "image_only", "caption_only") or
            (sc.startswith("bits:") and sc[5:].isdigit() and 1 <= int(sc[5:]) <= 19)):
        raise ConfigError(f"data.shortcuts={sc!r} is not valid; choose none, unique, image_only, "
                          "caption_only or bits:N (1 <= N <= 19)")


def validate_regions(m: ModelConfig) -> None:
    """The region encoders (vsrn, tern) and the settings that only they read."""
    checks = [
        ("model.reasoning_dim", m.reasoning_dim >= 1, "must be >= 1"),
        ("model.reasoning_layers", m.reasoning_layers >= 0, "must be >= 0"),
        ("model.shared_layers", m.shared_layers >= 0, "must be >= 0"),
        ("model.attention_heads", m.attention_heads >= 1 and m.reasoning_dim % m.attention_heads == 0,
         f"must be >= 1 and divide model.reasoning_dim={m.reasoning_dim}"),
        ("model.reasoning_ff", m.reasoning_ff >= 1, "must be >= 1"),
        ("model.reasoning_dropout", 0 <= m.reasoning_dropout < 1, "must be in [0, 1)"),
        ("model.region_dim", m.region_dim >= 0, "must be >= 0 (0 = from the features)")]
    for key, ok, msg in checks:
        if not ok:
            raise ConfigError(f"{key}={getattr(m, key.split('.')[1])!r} {msg}")
    if (m.image_encoder == "tern") != (m.text_encoder == "tern"):
        raise ConfigError(f"model.image_encoder={m.image_encoder!r} with model.text_encoder={m.text_encoder!r}: "
                          "TERN's shared transformer layers need both sides, so set both to tern (or neither)")
    if m.image_encoder == "head":
        if m.image_features == "grid" and m.backbone != "precomputed":
            raise ConfigError("model.image_features=grid gives a set of regions: pick a region encoder "
                              "(model.image_encoder=vsrn or tern)")
        return
    if m.image_features == "fne":
        raise ConfigError(f"model.image_encoder={m.image_encoder} reads regions, not a full-network embedding: "
                          "model.image_features=fne does not apply")
    # precomputed: region features from the file (training/regions.py); else the packaged CNN's grid
    if m.backbone != "precomputed" and (m.backbone != "efficientnet_lite0" or m.image_features != "grid"):
        raise ConfigError(f"model.image_encoder={m.image_encoder} reasons over regions: use the packaged CNN's grid "
                          "cells (model.backbone=efficientnet_lite0, model.image_features=grid) or precomputed region "
                          "features (model.backbone=precomputed, model.precomputed_path=...)")
    if m.crops != 1:
        raise ConfigError(f"model.crops={m.crops}: region encoders read one view (the mean of a grid and its mirror "
                          "image is not a grid of anything); set model.crops=1")


def dump_config(cfg: Any, path: str | Path) -> None:
    """Any dataclass config tree → YAML (atomic)."""
    atomic_write_text(path, yaml.safe_dump(asdict(cfg), sort_keys=False))
