"""The validation callable the training loop receives from `ltd train`: val rsum with our metrics."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from indexer.embed import embed_captions, embed_image_features, embed_image_files, similarity_matrix
from indexer.metrics import retrieval_metrics
from training.data.decode_pool import ImageTransform
from training.data.karpathy import Split
from training.errors import Unavailable
from training.models.dual_encoder import DualEncoder
from training.progress import quiet


def make_validator(split: Split, texts: list[str], image_feats: torch.Tensor | None, max_images: int = 0,
                   transform: ImageTransform | None = None) -> Callable[[DualEncoder], dict]:
    """``image_feats``: (n_images, D) cached features of the split's images (views averaged), used
    while the backbone is frozen; after unfreezing, images are re-encoded from their files, with
    ``transform`` (the run's shortcuts, which the cached features carry) drawn on them."""
    n_img = len(split.images) if not max_images else min(max_images, len(split.images))
    keep = split.caption_to_image < n_img
    c2i = split.caption_to_image[keep]
    texts = [t for t, k in zip(texts, keep) if k]
    paths, ids = [im.path for im in split.images[:n_img]], [im.index for im in split.images[:n_img]]

    def validate(model: DualEncoder) -> dict:
        with quiet():  # between epochs: the epoch's log line reports it
            txt = embed_captions(model, texts)
            if model.image.frozen and image_feats is not None:
                img = embed_image_features(model, image_feats[:n_img])
            else:
                img, failed = embed_image_files(model, paths, transform=transform, image_ids=ids)
                if failed:
                    raise Unavailable(f"validation images unreadable: {list(failed.values())[:3]}")
        m = retrieval_metrics(similarity_matrix(model, img, txt), c2i)
        return {k: float(v) for k, v in m.items() if isinstance(v, (int, float, np.floating, np.integer))}

    return validate
