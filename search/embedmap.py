"""A 2-D map of one model's embedding space: its index's images and captions projected together.

PCA on the joint set: linear, deterministic and honest about distances, so two models' maps can be
set side by side. Each modality is first centred on its own mean: contrastive models keep images
and captions in two separate cones (the "modality gap", Liang et al. 2022), and without this the
first axis only separates the two clouds (90% of the variance on the synthetic scenes) and says
nothing about content. The gap itself is reported as a number (the distance between the two means,
``gap``). Signs are fixed (each axis's largest loading is positive), so a map does not flip between
runs. Computed once per index generation and cached next to it.

Colourings the UI offers: how much two models disagree on each query (``indexer.disagreement``),
and which captions (and their images) contain a word.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from indexer.index import IndexDir
from search.derived import cached_arrays

MAP_VERSION = 2


def pca_2d(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coordinates (n, 2), explained variance ratio (2,)) of the rows of ``x``."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(axis=0)
    cov = xc.T @ xc / max(1, len(x) - 1)
    vals, vecs = np.linalg.eigh(cov)  # ascending
    comps = vecs[:, ::-1][:, :2]
    signs = np.sign(comps[np.abs(comps).argmax(axis=0), [0, 1]])
    comps = comps * np.where(signs == 0, 1.0, signs)
    total = float(vals.sum()) or 1.0
    return (xc @ comps).astype(np.float32), (vals[::-1][:2] / total).astype(np.float32)


@dataclass(frozen=True)
class EmbeddingMap:
    """A 2-D map of one model's image and caption embeddings (PCA over both, each modality centred
    first), the variance its two axes explain, and the modality gap."""

    model: str
    images: np.ndarray  # (n_images, 2), in the index's image order
    captions: np.ndarray  # (n_captions, 2)
    explained: tuple[float, float]  # variance ratio of the two axes
    gap: float  # distance between the images' and the captions' mean embeddings (the modality gap)
    image_ids: list[int]
    caption_ids: list[int]


def embedding_map(name: str, ix: IndexDir) -> EmbeddingMap:
    """The embedding map of the index ``ix`` served as ``name``: computed once and cached next to the
    index (a versioned file, recomputed when stale). Reads every vector; call it off the event loop."""
    def compute() -> dict[str, np.ndarray]:
        img, cap = (np.asarray(m.vectors, dtype=np.float64) for m in (ix.images, ix.captions))
        mi, mc = img.mean(axis=0), cap.mean(axis=0)
        xy, ratio = pca_2d(np.concatenate([img - mi, cap - mc]))
        n = len(img)
        return {"images": xy[:n], "captions": xy[n:], "explained": ratio, "gap": np.float64(np.linalg.norm(mi - mc))}

    arr = cached_arrays(ix, "embedding_map", MAP_VERSION, compute)
    return EmbeddingMap(name, arr["images"], arr["captions"], (float(arr["explained"][0]), float(arr["explained"][1])),
                        float(arr["gap"]), list(ix.images.ids), list(ix.captions.ids))


def captions_with_word(ix: IndexDir, word: str) -> np.ndarray:
    """Boolean mask over the index's captions: those containing ``word`` as a whole word (any case)."""
    w = word.strip().lower()
    if not w:
        return np.zeros(len(ix.captions.ids), dtype=bool)
    pat = re.compile(rf"(?<!\w){re.escape(w)}(?!\w)")
    return np.array([bool(pat.search(t.lower())) for t in ix.captions.meta["texts"]], dtype=bool)


def images_with_word(ix: IndexDir, caption_mask: np.ndarray) -> np.ndarray:
    """Boolean mask over the index's images: one of its captions contains the word."""
    return np.array([bool(caps) and bool(caption_mask[caps].any()) for caps in ix.images.meta["captions"]], dtype=bool)
