"""Captioner run configuration: typed sections on the shared config system (``training/config_base.py``),
loaded from YAML with ``--set a.b=c`` overrides. Presets: ``configs/caption_*.yaml``.

A run is two stages in one folder: ``xe.epochs`` of cross-entropy with scheduled sampling, then
``scst.epochs`` of self-critical training with r = cider_weight · CIDEr-D + alpha · r_ret.
``train.init_from`` starts the SCST stage from an earlier run's checkpoint instead (no XE epochs).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from training import choices as C
from training.config_base import (
    ConfigError,
    DropoutRate,
    Fraction,
    Invalid,
    NonNegative,
    NonNegativeInt,
    Positive,
    PositiveInt,
    Section,
    load_layers,
    load_saved,
    must,
)


class CapDataConfig(Section):
    path: str = ""  # Karpathy JSON (or its folder); "" = the embedded synthetic scenes
    images_root: str = ""
    drop_missing: bool = False
    synthetic_images: int = 3000
    synthetic_seed: int = 0
    cache_dir: str = ""  # feature caches; "" = $LTD_CACHE_DIR or ~/.cache/ltd
    # EfficientNet-Lite0 input; the grid is ceil(size / 32)² cells (7×7 at 224)
    image_size: Annotated[int, must(lambda v: v >= 32, "must be >= 32")] = 224
    min_word_count: PositiveInt = 5  # the paper: words seen < 5 times in training captions → <unk>
    max_len: PositiveInt = 16  # captions truncated to 16 words (the paper); also the decoding limit
    labelled_fraction: Fraction = 1.0  # SR-PL: < 1 hides the captions of the other training images (seeded)
    val_split: str = "val"


class CapModelConfig(Section):
    word_dim: int = 512
    hidden: int = 512  # both LSTMs
    att_dim: int = 512  # attention MLP and region embedding
    dropout: DropoutRate = 0.5


class XEConfig(Section):
    epochs: NonNegativeInt = 25  # at most this many (with patience > 0: until val CIDEr-D stops rising)
    batch_size: PositiveInt = 50  # images per step; each brings captions_per_image captions
    captions_per_image: PositiveInt = 5  # per image per epoch (sampled without replacement, seeded)
    lr: Positive = 5e-4
    lr_decay_every: int = 3  # epochs; the self-critical recipe: x0.8 every 3 epochs
    lr_decay: float = 0.8
    ss_every: PositiveInt = 5  # scheduled sampling: feedback probability +ss_step every ss_every epochs …
    ss_step: float = 0.05
    ss_max: Annotated[float, must(lambda v: 0 <= v <= 1, "must be in [0, 1]")] = 0.25  # … up to ss_max
    grad_clip: float = 0.1  # per-element clamp of gradients, as the self-critical code does
    # early stopping: end XE after this many epochs without a new best val CIDEr-D, and start SCST from the
    # best XE epoch; 0 = run every epoch and continue SCST from the last one
    patience: NonNegativeInt = 0


class SCSTConfig(Section):
    epochs: NonNegativeInt = 0
    # labelled images per step (SR-PL adds as many unlabelled ones)
    batch_size: Annotated[int, must(lambda v: v >= 2, "must be >= 2 (the retrieval reward needs other images)")] = 50
    lr: Positive = 5e-5
    cider_weight: float = 1.0
    cider_eos: bool = True  # the CIDEr-D reward counts the end token as a word (self-critical.pytorch's reward);
    # false: the earlier reward without it (RESULTS.md's Flickr8k captioning rows)
    alpha: NonNegative = 0.0  # weight of the retrieval reward r_ret = -L_ret (paper: 1; ablation 0, 1, 4)
    retrieval_loss: C.RetrievalLoss = "vse_max"  # vse_max (VSE++ max of hinges) | vse_sum (VSE0) | softmax (InfoNCE)
    margin: float = 0.2
    tau: Positive = 0.1  # softmax retrieval loss temperature
    negatives: C.Negatives = "moderate"  # SR-PL unlabelled images per labelled caption: moderate | random | hardest;
    # none: the unlabelled images stay out of SCST (the labelled-half controls: CIDEr-only, SR-FL on the half)
    h_min: int = 10  # moderate: sample from retrieval ranks [h_min, h_max] (1-based) of the unlabelled pool
    h_max: int = 100
    temperature: Positive = 1.0  # sampling temperature of the policy's samples
    grad_clip: float = 0.1
    samples: PositiveInt = 1  # sampled captions per image per step (the paper: 1)
    baseline: C.ScstBaseline = "greedy"  # greedy: r(greedy caption), the paper's self-critical baseline;
    # mean: the mean reward of the image's other samples (needs samples >= 2; Luo 2020's variant)
    distractors: NonNegativeInt = 0  # random training images added to the retrieval reward's candidates (no captions)

    @model_validator(mode="after")
    def _consistent(self) -> SCSTConfig:
        if self.baseline == "mean" and self.samples < 2:
            raise Invalid("baseline", self.baseline, "mean needs scst.samples >= 2")
        if not 1 <= self.h_min <= self.h_max:
            raise Invalid("h_min", self.h_min, "must satisfy 1 <= h_min <= h_max")
        return self


class CapTrainConfig(Section):
    name: str = ""
    seed: int = 0
    device: C.Device = "auto"
    num_threads: int = 0
    log_every: PositiveInt = 20
    retrieval: str = ""  # frozen retrieval checkpoint (the self-retrieval judge); --retrieval sets it
    init_from: str = ""  # a caption checkpoint whose weights start the SCST stage (XE is skipped)
    val_max_images: int = 0  # 0 = whole val split
    checkpoint_every: int = 0  # steps; 0 = at epoch ends only


class CaptionConfig(Section):
    data: CapDataConfig = Field(default_factory=CapDataConfig)
    model: CapModelConfig = Field(default_factory=CapModelConfig)
    xe: XEConfig = Field(default_factory=XEConfig)
    scst: SCSTConfig = Field(default_factory=SCSTConfig)
    train: CapTrainConfig = Field(default_factory=CapTrainConfig)

    @property
    def uses_unlabelled(self) -> bool:
        """SR-PL proper: SCST batches take unlabelled images (retrieval reward only) beside the labelled."""
        return self.scst.epochs > 0 and self.data.labelled_fraction < 1 and self.scst.negatives != "none"

    @property
    def needs_judge(self) -> bool:
        return self.scst.epochs > 0 and (self.scst.alpha > 0 or self.uses_unlabelled)

    @model_validator(mode="after")
    def _consistent(self) -> CaptionConfig:
        if self.xe.epochs + self.scst.epochs == 0:
            raise ValueError("xe.epochs and scst.epochs are both 0: nothing to train")
        if self.needs_judge and not self.train.retrieval:
            raise ValueError("the retrieval reward (scst.alpha > 0) and SR-PL (data.labelled_fraction < 1) need a "
                             "frozen retrieval checkpoint: pass --retrieval CHECKPOINT (or train.retrieval=…)")
        if self.uses_unlabelled and self.scst.alpha <= 0:
            raise ValueError("data.labelled_fraction < 1 (SR-PL): unlabelled images get only the retrieval reward, "
                             "so scst.alpha must be > 0; scst.negatives=none keeps them out (CIDEr-only on the "
                             "labelled images)")
        return self


def check_files(cfg: CaptionConfig) -> None:
    """The checkpoints a run starts from exist (checked before training, not when an old run's config
    is read back: its judge may live elsewhere by now)."""
    for key, p in (("train.retrieval", cfg.train.retrieval), ("train.init_from", cfg.train.init_from)):
        if p and not Path(p).is_file():
            raise ConfigError(f"{key}: file not found: {p}")


def load_caption_config(path: str | Path | None = None, overrides: Iterable[str] = (),
                        base: Mapping | None = None) -> CaptionConfig:
    """Defaults ← ``base`` ← YAML (path or ``caption_*`` preset) ← ``--set``; validated, files checked."""
    cfg = load_layers(CaptionConfig, path, overrides, base, kind="caption")
    check_files(cfg)
    return cfg


def caption_config_from_dict(d: Mapping) -> CaptionConfig:
    """A config dict as a caption checkpoint or config.yaml holds it (any age) → CaptionConfig."""
    return load_saved(CaptionConfig, d)

