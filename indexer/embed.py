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
from training.progress import progress, progress_iter

from training.data.images import ImageError, load_image
from training.losses import similarity_fn
from training.models.dual_encoder import DualEncoder
from training.models.text_encoder import move_batch

log = logging.getLogger(__name__)


@torch.no_grad()
def embed_captions(model: DualEncoder, texts: Sequence[str], *, batch_size: int = 512,
                   show_progress: bool = False) -> np.ndarray:
    """(n, E) float32 normalised caption embeddings."""
    model.eval()
    out = []
    for i in progress_iter(range(0, len(texts), batch_size), desc="caption embeddings", unit="batch",
                           disable=not show_progress or len(texts) <= batch_size):
        batch = move_batch(model.text.prepare(list(texts[i : i + batch_size])), model.device)
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
                      show_progress: bool = False) -> tuple[np.ndarray, dict[int, str]]:
    """Encode image files through the backbone. Unreadable files are skipped and returned as
    ``{position: reason}``; the embedding array has one row per readable file, in order."""
    model.eval()
    out, failed = [], {}
    bar = progress(len(paths), desc="image embeddings", unit="img", disable=not show_progress)
    for i in range(0, len(paths), batch_size):
        imgs = []
        for j, p in enumerate(paths[i : i + batch_size], start=i):
            try:
                imgs.append(load_image(p))
            except ImageError as e:
                failed[j] = str(e)
                log.warning("skipped: %s", e)
        if imgs:
            out.append(model.image(model.image.prepare(imgs).to(model.device)).float().cpu().numpy())
        bar.update(min(batch_size, len(paths) - i))
    bar.close()
    return (np.concatenate(out) if out else np.zeros((0, model.image.embed_dim), np.float32)), failed


def similarity_matrix(model: DualEncoder, img: np.ndarray, txt: np.ndarray) -> np.ndarray:
    """(n_img, n_txt) scores with the model's similarity (dot product of normalised vectors, or the
    order-violation similarity for order-embedding models)."""
    if model.similarity == "cosine":
        return img @ txt.T
    return similarity_fn(model.similarity)(torch.from_numpy(img), torch.from_numpy(txt)).numpy()
