"""Captioner run configuration: typed sections loaded from YAML with ``--set a.b=c`` overrides
(the machinery of ``training/config.py``), validated here. Presets: ``configs/caption_*.yaml``.

A run is two stages in one folder: ``xe.epochs`` of cross-entropy with scheduled sampling, then
``scst.epochs`` of self-critical training with r = cider_weight · CIDEr-D + alpha · r_ret.
``train.init_from`` starts the SCST stage from an earlier run's checkpoint instead (no XE epochs).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.config import ConfigError, apply_dict, load_into


@dataclass
class CapDataConfig:
    path: str = ""  # Karpathy JSON (or its folder); "" = the embedded synthetic scenes
    images_root: str = ""
    drop_missing: bool = False
    synthetic_images: int = 3000
    synthetic_seed: int = 0
    cache_dir: str = ""  # feature caches; "" = $LTD_CACHE_DIR or ~/.cache/ltd
    image_size: int = 224  # EfficientNet-Lite0 input; the grid is ceil(size / 32)² cells (7×7 at 224)
    min_word_count: int = 5  # the paper: words seen < 5 times in training captions → <unk>
    max_len: int = 16  # captions truncated to 16 words (the paper); also the decoding limit
    labelled_fraction: float = 1.0  # SR-PL: < 1 hides the captions of the other training images (seeded)
    val_split: str = "val"


@dataclass
class CapModelConfig:
    word_dim: int = 512
    hidden: int = 512  # both LSTMs
    att_dim: int = 512  # attention MLP and region embedding
    dropout: float = 0.5


@dataclass
class XEConfig:
    epochs: int = 25
    batch_size: int = 50  # images per step; each brings captions_per_image captions
    captions_per_image: int = 5  # per image per epoch (sampled without replacement, seeded)
    lr: float = 5e-4
    lr_decay_every: int = 3  # epochs; the self-critical recipe: x0.8 every 3 epochs
    lr_decay: float = 0.8
    ss_every: int = 5  # scheduled sampling: feedback probability +ss_step every ss_every epochs …
    ss_step: float = 0.05
    ss_max: float = 0.25  # … up to ss_max
    grad_clip: float = 0.1  # per-element clamp of gradients, as the self-critical code does


@dataclass
class SCSTConfig:
    epochs: int = 0
    batch_size: int = 50  # labelled images per step (SR-PL adds as many unlabelled ones)
    lr: float = 5e-5
    cider_weight: float = 1.0
    alpha: float = 0.0  # weight of the retrieval reward r_ret = -L_ret (paper: 1; ablation 0, 1, 4)
    retrieval_loss: str = "vse_max"  # vse_max (VSE++ max of hinges) | vse_sum (VSE0) | softmax (InfoNCE)
    margin: float = 0.2
    tau: float = 0.1  # softmax retrieval loss temperature
    negatives: str = "moderate"  # SR-PL unlabelled images per labelled caption: moderate | random | hardest;
    # none: the unlabelled images stay out of SCST (the labelled-half controls: CIDEr-only, SR-FL on the half)
    h_min: int = 10  # moderate: sample from retrieval ranks [h_min, h_max] (1-based) of the unlabelled pool
    h_max: int = 100
    temperature: float = 1.0  # sampling temperature of the policy's samples
    grad_clip: float = 0.1
    samples: int = 1  # sampled captions per image per step (the paper: 1)
    baseline: str = "greedy"  # greedy: r(greedy caption), the paper's self-critical baseline;
    # mean: the mean reward of the image's other samples (needs samples >= 2; Luo 2020's variant)
    distractors: int = 0  # random training images added to the retrieval reward's candidates (no captions)


@dataclass
class CapTrainConfig:
    name: str = ""
    seed: int = 0
    device: str = "auto"
    num_threads: int = 0
    log_every: int = 20
    retrieval: str = ""  # frozen retrieval checkpoint (the self-retrieval judge); --retrieval sets it
    init_from: str = ""  # a caption checkpoint whose weights start the SCST stage (XE is skipped)
    val_max_images: int = 0  # 0 = whole val split
    checkpoint_every: int = 0  # steps; 0 = at epoch ends only


@dataclass
class CaptionConfig:
    data: CapDataConfig = field(default_factory=CapDataConfig)
    model: CapModelConfig = field(default_factory=CapModelConfig)
    xe: XEConfig = field(default_factory=XEConfig)
    scst: SCSTConfig = field(default_factory=SCSTConfig)
    train: CapTrainConfig = field(default_factory=CapTrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def uses_unlabelled(self) -> bool:
        """SR-PL proper: SCST batches take unlabelled images (retrieval reward only) beside the labelled."""
        return self.scst.epochs > 0 and self.data.labelled_fraction < 1 and self.scst.negatives != "none"

    @property
    def needs_judge(self) -> bool:
        return self.scst.epochs > 0 and (self.scst.alpha > 0 or self.uses_unlabelled)


CHOICES = {"scst.retrieval_loss": ("vse_max", "vse_sum", "softmax"),
           "scst.negatives": ("moderate", "random", "hardest", "none"),
           "scst.baseline": ("greedy", "mean"), "train.device": ("auto", "cpu", "cuda")}


def validate_caption_config(cfg: CaptionConfig) -> None:
    for key, choices in CHOICES.items():
        sec, name = key.split(".")
        if getattr(getattr(cfg, sec), name) not in choices:
            raise ConfigError(f"{key}={getattr(getattr(cfg, sec), name)!r} is not valid; choose one of: {', '.join(choices)}")
    d, x, s = cfg.data, cfg.xe, cfg.scst
    checks = [
        ("data.min_word_count", d.min_word_count >= 1, "must be >= 1"),
        ("data.max_len", d.max_len >= 1, "must be >= 1"),
        ("data.image_size", d.image_size >= 32, "must be >= 32"),
        ("data.labelled_fraction", 0 < d.labelled_fraction <= 1, "must be in (0, 1]"),
        ("xe.epochs", x.epochs >= 0, "must be >= 0"),
        ("scst.epochs", s.epochs >= 0, "must be >= 0"),
        ("xe.batch_size", x.batch_size >= 1, "must be >= 1"),
        ("xe.captions_per_image", x.captions_per_image >= 1, "must be >= 1"),
        ("scst.batch_size", s.batch_size >= 2, "must be >= 2 (the retrieval reward needs other images)"),
        ("xe.lr", x.lr > 0, "must be > 0"),
        ("scst.lr", s.lr > 0, "must be > 0"),
        ("xe.ss_max", 0 <= x.ss_max <= 1, "must be in [0, 1]"),
        ("xe.ss_every", x.ss_every >= 1, "must be >= 1"),
        ("scst.alpha", s.alpha >= 0, "must be >= 0"),
        ("scst.temperature", s.temperature > 0, "must be > 0"),
        ("scst.samples", s.samples >= 1, "must be >= 1"),
        ("scst.distractors", s.distractors >= 0, "must be >= 0"),
        ("scst.baseline", s.baseline == "greedy" or s.samples >= 2, "mean needs scst.samples >= 2"),
        ("scst.tau", s.tau > 0, "must be > 0"),
        ("scst.h_min", 1 <= s.h_min <= s.h_max, "must satisfy 1 <= h_min <= h_max"),
        ("model.dropout", 0 <= cfg.model.dropout < 1, "must be in [0, 1)"),
        ("train.log_every", cfg.train.log_every >= 1, "must be >= 1"),
    ]
    for key, ok, msg in checks:
        if not ok:
            sec, name = key.split(".")
            raise ConfigError(f"{key}={getattr(getattr(cfg, sec), name)!r} {msg}")
    if x.epochs + s.epochs == 0:
        raise ConfigError("xe.epochs and scst.epochs are both 0: nothing to train")
    if cfg.needs_judge and not cfg.train.retrieval:
        raise ConfigError("the retrieval reward (scst.alpha > 0) and SR-PL (data.labelled_fraction < 1) need a "
                          "frozen retrieval checkpoint: pass --retrieval CHECKPOINT (or train.retrieval=…)")
    if cfg.uses_unlabelled and s.alpha <= 0:
        raise ConfigError("data.labelled_fraction < 1 (SR-PL): unlabelled images get only the retrieval reward, "
                          "so scst.alpha must be > 0; scst.negatives=none keeps them out (CIDEr-only on the "
                          "labelled images)")
    for key, p in (("train.retrieval", cfg.train.retrieval), ("train.init_from", cfg.train.init_from)):
        if p and not Path(p).is_file():
            raise ConfigError(f"{key}: file not found: {p}")


def load_caption_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                        base: dict | None = None) -> CaptionConfig:
    cfg = load_into(CaptionConfig(), path, overrides, base, kind="caption")
    validate_caption_config(cfg)
    return cfg


def caption_config_from_dict(d: dict) -> CaptionConfig:
    return apply_dict(CaptionConfig(), d)
