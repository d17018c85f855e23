"""Everything a captioner run reads: dataset, splits, labelled/unlabelled training images, the
caption vocabulary, XE targets, CIDEr-D references and the cached grid features.

Grid features come from the shared content-keyed feature cache (``features="grid"``: one row of
S²·1280 float16 per image, S = 7 at 224 px) and stay memory-mapped; batches are gathered and
reshaped into regions on demand.

CIDEr-D references use every word of the reference captions (not truncated, rare words kept under
ids of their own), so a generated ``<unk>`` never matches anything; document frequencies come from
the labelled training references. The training references end in ``<eos>`` when the reward counts
the end token (``scst.cider_eos``, as the self-critical code does); val's do not (val CIDEr-D is the
COCO metric, which has no end token).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.captioning.cider import CiderD, with_end
from training.captioning.config import CaptionConfig
from training.captioning.vocab import CaptionVocab
from training.config import ConfigError
from training.data.karpathy import Dataset, DatasetError, Split, labelled_mask, load_karpathy, tokenize
from training.features import FeatureStore, extract_features
from training.models.backbones import EfficientNetLite0, grid_regions
from training.prepare import resolve_dataset_path

log = logging.getLogger(__name__)

FEAT_CHANNELS = 1280


def resolve_path(cfg: CaptionConfig) -> Path:
    d = cfg.data
    return resolve_dataset_path(d.path, cache_dir=d.cache_dir, synthetic_images=d.synthetic_images,
                                synthetic_seed=d.synthetic_seed)


def load_caption_dataset(cfg: CaptionConfig) -> Dataset:
    return load_karpathy(resolve_path(cfg), images_root=cfg.data.images_root or None,
                         drop_missing=cfg.data.drop_missing)


def grid_store(ds: Dataset, image_size: int, cache_dir: str = "") -> FeatureStore:
    """Grid features of every image of the dataset (extracted once, on the process's device, then read
    from the cache)."""
    backbone = EfficientNetLite0("grid", image_size=image_size)
    return extract_features(backbone, [im.path for im in ds.images], cache_dir=cache_dir,
                            desc=f"{ds.name} grid features ({backbone.grid_side}²×1280)")


def regions(store: FeatureStore, rows: np.ndarray | list[int]) -> torch.Tensor:
    """(B, S², 1280) float32 regions of dataset images ``rows``."""
    rows = np.asarray(rows, dtype=np.int64)
    arr = np.asarray(store.features[rows, 0], dtype=np.float32)
    return grid_regions(torch.from_numpy(arr), FEAT_CHANNELS)


class WordIds:
    """Every training word → an id: the captioner's vocabulary first (same ids), then the rare words."""

    def __init__(self, vocab: CaptionVocab, captions: list[str]):
        self.index = dict(vocab.vocab.index)
        for c in captions:
            for w in tokenize(c):
                if w not in self.index:
                    self.index[w] = len(self.index)

    def encode(self, caption: str) -> list[int]:
        return [self.index.setdefault(w, len(self.index)) for w in tokenize(caption)]

    @property
    def size(self) -> int:
        return len(self.index)


def split_refs(split: Split, words: WordIds, images: np.ndarray | None = None) -> list[list[list[int]]]:
    """Full-word id references of the split's images (all of them, or the local indices ``images``)."""
    per_image = split.image_to_captions
    chosen = range(len(split.images)) if images is None else images
    return [[words.encode(split.captions[c].raw) for c in per_image[i]] for i in chosen]


@dataclass
class CaptionData:
    dataset: Dataset
    train: Split
    val: Split
    vocab: CaptionVocab
    grid: FeatureStore
    labelled: np.ndarray  # (n_train_images,) bool
    targets: torch.Tensor  # (n_train_captions, max_len + 1) XE targets
    words: WordIds
    train_cider: CiderD  # references of the labelled training images, indexed by labelled position
    labelled_images: np.ndarray  # local train indices of labelled images (train_cider's image order)
    val_cider: CiderD  # val references, document frequencies from val (as the COCO evaluation does)

    @property
    def train_rows(self) -> np.ndarray:
        """Dataset rows (feature-store rows) of the training images, in split order."""
        return np.array([im.index for im in self.train.images], dtype=np.int64)

    @property
    def val_rows(self) -> np.ndarray:
        return np.array([im.index for im in self.val.images], dtype=np.int64)

    @property
    def feature_key(self) -> str:
        return self.grid.key


def prepare_captioning(cfg: CaptionConfig, *, vocab: CaptionVocab | None = None) -> CaptionData:
    ds = load_caption_dataset(cfg)
    try:
        train, val = ds.split("train"), ds.split(cfg.data.val_split)
    except DatasetError as e:
        raise ConfigError(f"data: {e}") from None
    store = grid_store(ds, cfg.data.image_size, cfg.data.cache_dir)
    if store.failed:
        raise ConfigError(f"{len(store.failed)} images could not be read (see {store.path}/failed.json); "
                          "fix or drop them (data.drop_missing) before training a captioner")
    labelled = labelled_mask(len(train.images), cfg.data.labelled_fraction, cfg.train.seed)
    lab_caps = [c.raw for c, img in zip(train.captions, train.caption_to_image) if labelled[img]]
    if vocab is None:
        vocab = CaptionVocab.build(lab_caps, cfg.data.min_word_count, cfg.data.max_len)
    targets = vocab.encode_batch([c.raw for c in train.captions])
    words = WordIds(vocab, [c.raw for c in train.captions])
    lab_images = np.flatnonzero(labelled)
    val_refs = split_refs(val, words)
    # a fixed base covers every id the reward can see (the captioner's vocabulary is a prefix)
    lab_refs = split_refs(train, words, lab_images)
    train_cider = CiderD(with_end(lab_refs, vocab.eos_id) if cfg.scst.cider_eos else lab_refs, base=words.size + 2)
    val_cider = CiderD(val_refs, base=words.size + 2)
    log.info("captioning data: %d train images (%d labelled), %d val, vocabulary %d words (min count %d), grid %s",
             len(train.images), int(labelled.sum()), len(val.images), len(vocab), cfg.data.min_word_count,
             store.features.shape[1:])
    return CaptionData(ds, train, val, vocab, store, labelled, targets, words, train_cider, lab_images, val_cider)

