"""Embedding corpora with a trained model: captions, cached image features, or image files.

Frozen backbones reuse the training feature cache (same key → same features), so an index built
after training scores exactly what validation scored.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from training.data.decode_pool import ImageTransform, RenumberedTransform
from training.data.gpu_decode import ExtractionSpec, image_batches
from training.data.members import image_sources
from training.device import to_device
from training.losses import similarity_fn
from training.models.dual_encoder import DualEncoder, NoImageBackbone
from training.progress import progress, progress_iter

log = logging.getLogger(__name__)


@torch.no_grad()
def embed_captions(model: DualEncoder, texts: Sequence[str], *, batch_size: int = 512) -> np.ndarray:
    """(n, E) float32 normalised caption embeddings."""
    model.eval()
    if hasattr(model.text, "embed_corpus"):  # a frozen sentence encoder: the whole corpus through the disk cache
        model.text.embed_corpus(texts)
    out = []
    for i in progress_iter(range(0, len(texts), batch_size), desc="caption embeddings", unit="batch",
                           disable=len(texts) <= batch_size):
        batch = to_device(model.text.prepare(list(texts[i : i + batch_size])), model.device)
        out.append(model.encode_text(batch).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.text.out_dim), np.float32)


@torch.no_grad()
def embed_image_features(model: DualEncoder, feats: torch.Tensor, *, batch_size: int = 2048) -> np.ndarray:
    """(n, D) cached backbone features (views already averaged) → (n, E) embeddings."""
    model.eval()
    out = [model.encode_image_features(feats[i : i + batch_size].to(model.device)).float().cpu().numpy()
           for i in range(0, len(feats), batch_size)]
    return np.concatenate(out) if out else np.zeros((0, model.image.embed_dim), np.float32)


@torch.no_grad()
def embed_image_files(model: DualEncoder, paths: Sequence[str | Path], *, batch_size: int = 32,
                      workers: int | None = None, draft: bool = False, transform: ImageTransform | None = None,
                      image_ids: Sequence[int] | None = None) -> tuple[np.ndarray, dict[int, str]]:
    """Encode image files through the backbone, decoding in worker processes while the CNN runs
    (``decode_pool``), or on the GPU when the process computes there, as its models do (``gpu_decode``,
    ``training.device``). Unreadable files are
    skipped and returned as ``{position: reason}``; the embedding array has one row per readable
    file, in order. ``transform`` (synthetic shortcuts)
    draws on every view, keyed by the files' dataset indices ``image_ids``."""
    model.eval()
    enc = model.image
    if enc.backbone is None:
        raise NoImageBackbone("this model was trained on precomputed features and has no image backbone")
    out, failed = [], {}
    v, s = enc.n_crops, enc.backbone.preprocess.size
    paths = image_sources(paths)
    if transform is not None:
        transform = RenumberedTransform(transform, image_ids if image_ids is not None else range(len(paths)))
    with progress(len(paths), desc="image embeddings", unit="img") as bar:
        spec = ExtractionSpec(n_views=v, batch_size=batch_size * v, workers=workers, transform=transform, draft=draft)
        for idx, x, bad in image_batches(paths, range(len(paths)), enc.backbone.preprocess, spec):
            for j, err in bad:
                failed[j] = err
                log.warning("skipped: %s", err)
            if x is not None:
                out.append(enc(to_device(x, model.device).reshape(len(idx), v, 3, s, s)).float().cpu().numpy())
            bar.update(len(idx) + len(bad))
    return (np.concatenate(out) if out else np.zeros((0, enc.embed_dim), np.float32)), failed


def similarity_matrix(model: DualEncoder, img: np.ndarray, txt: np.ndarray) -> np.ndarray:
    """(n_img, n_txt) scores with the model's similarity (dot product of normalised vectors, or the
    order-violation similarity for order-embedding models)."""
    if model.similarity == "cosine":
        return img @ txt.T
    return similarity_fn(model.similarity)(torch.from_numpy(img), torch.from_numpy(txt)).numpy()
