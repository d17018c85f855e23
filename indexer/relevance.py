"""Extra ground truth for evaluation: ROUGE-L / file relevance matrices, CxC and ECCV Caption positives."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from indexer.index import IndexDir, IndexDirError
from indexer.rouge import rouge_l_matrix
from training.data.coco import eccv_data_dir
from training.data.karpathy import DatasetError
from training.errors import UserFileNotFound
from training.fsio import save_npy_atomic

log = logging.getLogger(__name__)


def rouge_relevance(ix: IndexDir) -> np.ndarray:
    """(n_captions, n_images) ROUGE-L of each query caption against each image's reference captions,
    computed exactly as TERN does (coco-caption's ROUGE-L: best precision and best recall over the
    references, F-beta 1.2), so nDCG is comparable with published numbers; cached in the index."""
    cache = ix.derived_path("relevance_rougeL")
    n_cap, n_img = len(ix.captions.ids), len(ix.images.ids)
    if cache.is_file():
        rel = np.load(cache)
        if rel.shape == (n_cap, n_img):
            return rel
    texts = ix.captions.meta["texts"]
    refs = [[texts[j] for j in caps] for caps in ix.images.meta["captions"]]
    rel = rouge_l_matrix(texts, refs, aggregate="tern").astype(np.float32)
    save_npy_atomic(cache, rel)
    return rel


def file_relevance(path: str | Path, n_captions: int, n_images: int) -> np.ndarray:
    """A TERN-format relevance matrix: float32 (captions × images), as ``.npy`` or raw float32 bytes."""
    path = Path(path)
    if not path.is_file():
        raise UserFileNotFound(f"relevance file not found: {path}")
    if path.suffix == ".npy":
        rel = np.load(path, mmap_mode="r")
    else:
        size = path.stat().st_size
        if size != 4 * n_captions * n_images:
            raise IndexDirError(f"{path}: {size} bytes is not a float32 {n_captions}x{n_images} matrix "
                                f"({4 * n_captions * n_images} bytes)")
        rel = np.memmap(path, dtype=np.float32, mode="r", shape=(n_captions, n_images))
    if rel.shape == (n_images, n_captions) and n_images != n_captions:
        rel = rel.T
    if rel.shape != (n_captions, n_images):
        raise IndexDirError(f"{path}: relevance shape {rel.shape} does not match this split "
                            f"({n_captions} captions x {n_images} images)")
    return np.asarray(rel, dtype=np.float32)


# Extra ground truth on the COCO 5k test split, from the id maps that eccv-caption ships. CxC adds
# positives and keeps every query; ECCV Caption re-annotates a subset of the queries (1,261 images,
# 1,332 captions), so its metrics are computed on those queries only, as the package does.
COCO_GROUND_TRUTH = {"cxc": (False, "Crisscrossed Captions"), "eccv": (True, "ECCV Caption")}


def coco_positives(ix: IndexDir, source: str) -> tuple[list[np.ndarray], list[np.ndarray],
                                                        np.ndarray | None, np.ndarray | None]:
    """Extra positives of ``source`` ("cxc" or "eccv") for an index of the COCO 5k test split.
    Needs COCO image ids (``cocoid``) and caption annotation ids (``annid``) in the index — a Karpathy
    COCO JSON has the former; ``ltd data convert-coco`` writes both. Returns (i2t extra caption
    positions per image, t2i extra image positions per caption, image query mask, caption query mask);
    the masks are None when every query counts."""
    if source not in COCO_GROUND_TRUTH:
        raise IndexDirError(f"unknown ground truth {source!r}; one of {', '.join(COCO_GROUND_TRUTH)}")
    subset, label = COCO_GROUND_TRUTH[source]
    cocoids = ix.images.meta.get("cocoids")
    annids = ix.captions.meta.get("annids")
    if not cocoids or not annids or None in cocoids or None in annids:
        raise IndexDirError(
            f"{label} needs COCO image ids and caption annotation ids in the index; build it from a JSON made by "
            "`ltd data convert-coco --karpathy-test` (which keeps them), on its test split")
    try:
        data = eccv_data_dir()
    except DatasetError as e:
        raise IndexDirError(str(e)) from None
    i2t = json.loads((data / f"{source}_image_to_caption.json").read_text())
    t2i = json.loads((data / f"{source}_caption_to_image.json").read_text())
    img_pos = {int(c): k for k, c in enumerate(cocoids)}
    cap_pos = {int(a): k for k, a in enumerate(annids)}
    covered = sum(1 for c in cocoids if str(c) in i2t)
    if covered == 0:
        raise IndexDirError(f"none of the index's images have {label} annotations (they cover the COCO 5k test split)")
    log.info("%s: %d of %d images have annotations", label, covered, len(cocoids))
    i2t_extra = [np.array(sorted(cap_pos[int(a)] for a in i2t.get(str(c), []) if int(a) in cap_pos), dtype=np.int64)
                 for c in cocoids]
    t2i_extra = [np.array(sorted(img_pos[int(c)] for c in t2i.get(str(a), []) if int(c) in img_pos), dtype=np.int64)
                 for a in annids]
    if not subset:
        return i2t_extra, t2i_extra, None, None
    return (i2t_extra, t2i_extra, np.array([str(c) in i2t for c in cocoids]),
            np.array([str(a) in t2i for a in annids]))
