"""The embedded default dataset: procedurally generated captioned scenes (no download needed).

Each image shows 1-4 flat shapes (shape, colour, size, optional stripes/dots) on a textured,
coloured background, each in its own cell of a 3x3 grid so position words are unambiguous. Each
image gets 5 captions that are always true but mention *different subsets* of the scene (another
focus object, other attributes, a relation, a count, the background), so every caption carries
shared and caption-specific information. That is what makes contrastive feature suppression
visible: a purely contrastive model can match image and caption on the most salient object alone;
a model that must also reconstruct the caption's sentence embedding (LTD) has to keep the rest.

Output is the Karpathy split layout served by ``training/data/karpathy.py``: ``OUT/images/NNNNNN.jpg``
and ``OUT/dataset_synthetic.json``. Each image record also carries its ground truth (``objects``,
``background``, ``texture_seed``), which is exactly the scene spec: ``render_scene(record, size)``
re-renders it. Everything is a pure function of (seed, image index), so the output is
byte-identical for any number of worker processes.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import re
import time
from functools import partial
from pathlib import Path

import numpy as np

from training.data.synthetic_render import render_scene
from training.data.synthetic_scenes import _TOKEN_RE, captions_for, scene_spec
from training.errors import UserValueError
from training.fsio import atomic_write_text, exclusive
from training.progress import progress

log = logging.getLogger(__name__)

SYNTHETIC_JSON_NAME = "dataset_synthetic.json"
GENERATOR_VERSION = 1  # bump whenever output changes for the same arguments (invalidates reuse)
JPEG_QUALITY = 90
_IMAGE_NAME_RE = re.compile(r"^\d{6,}\.jpg$")


# ---------------------------------------------------------------------------------------------
# Dataset generation.
# ---------------------------------------------------------------------------------------------
def _image_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, 0, index])  # stream 0: images; stream 1: the split


def _split_names(n_images: int, seed: int, val_fraction: float, test_fraction: float) -> list[str]:
    n_val, n_test = _split_sizes(n_images, val_fraction, test_fraction)
    names = np.array(["train"] * n_images, dtype=object)
    order = np.random.default_rng([seed, 1]).permutation(n_images)
    names[order[:n_val]] = "val"
    names[order[n_val : n_val + n_test]] = "test"
    return names.tolist()


def _split_sizes(n_images: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    return max(1, round(n_images * val_fraction)), max(1, round(n_images * test_fraction))


def _make_image(index: int, *, seed: int, image_size: int, image_dir: str) -> dict:
    """Generate, render and save image `index`; returns its record (without split and sentids)."""
    rng = _image_rng(seed, index)
    spec = scene_spec(rng)
    captions = captions_for(spec, rng)
    filename = f"{index:06d}.jpg"
    render_scene(spec, image_size).save(
        os.path.join(image_dir, filename), "JPEG", quality=JPEG_QUALITY, subsampling=2, optimize=False
    )
    return {"filename": filename, "captions": captions, **spec}


def _validate(n_images, seed, image_size, val_fraction, test_fraction, workers) -> None:
    def is_int(v) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if not is_int(n_images) or n_images < 10:
        raise UserValueError(
            f"n_images must be an integer >= 10 (so train, val and test are all non-empty), got {n_images!r}"
        )
    if not is_int(seed) or seed < 0:
        raise UserValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not is_int(image_size) or not 32 <= image_size <= 1024:
        raise UserValueError(f"image_size must be an integer in [32, 1024], got {image_size!r}")
    for name, v in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise UserValueError(f"{name} must be a number in (0, 1), got {v!r}")
    if val_fraction + test_fraction >= 1:
        raise UserValueError(f"val_fraction + test_fraction must be < 1 (train needs images), got "
                         f"{val_fraction} + {test_fraction}")
    n_val, n_test = _split_sizes(n_images, val_fraction, test_fraction)
    if n_images - n_val - n_test < 1:
        raise UserValueError(f"no training images left: {n_images} images, {n_val} val, {n_test} test")
    if workers is not None and (not is_int(workers) or workers < 1):
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")


def _reusable(json_path: Path, params: dict) -> bool:
    """True when `json_path` was written with the same parameters and all its images exist."""
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if any(data.get(k) != v for k, v in params.items()):
        return False
    images = data.get("images", [])
    return len(images) == params["n_images"] and all(
        (json_path.parent / im["filepath"] / im["filename"]).is_file() for im in images
    )


def generate_synthetic(
    out_dir: str | Path,
    n_images: int = 5000,
    seed: int = 0,
    image_size: int = 224,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    workers: int | None = None,
) -> Path:
    """Write the synthetic scenes dataset under `out_dir` and return its JSON path.

    Images go to ``out_dir/images``, then the JSON is written to a temp file and renamed. When
    ``out_dir`` already holds a complete dataset made with the same arguments and generator
    version, it is reused as is. `workers` processes render in parallel (default: all cores);
    the output does not depend on it.
    """
    _validate(n_images, seed, image_size, val_fraction, test_fraction, workers)
    out_dir = Path(out_dir)
    json_path = out_dir / SYNTHETIC_JSON_NAME
    params = {"dataset": "synthetic", "generator_version": GENERATOR_VERSION, "n_images": int(n_images),
              "seed": int(seed), "image_size": int(image_size), "val_fraction": float(val_fraction),
              "test_fraction": float(test_fraction)}
    if json_path.is_file() and _reusable(json_path, params):
        log.info("reusing synthetic dataset %s (%d images, seed %d, %d px)", json_path, n_images, seed, image_size)
        return json_path
    out_dir.mkdir(parents=True, exist_ok=True)
    # one process generates (several training processes start together); the others wait and reuse it
    with exclusive(out_dir / ".lock", f"the synthetic scenes in {out_dir}"):
        if json_path.is_file():
            if _reusable(json_path, params):
                return json_path
            log.warning("%s was written with other parameters or is incomplete: regenerating", json_path)
            json_path.unlink()  # first, so a crash below never leaves a JSON pointing at new images
        return _generate(out_dir, json_path, params, workers)


def _generate(out_dir: Path, json_path: Path, params: dict, workers: int | None) -> Path:
    n_images, seed, image_size = params["n_images"], params["seed"], params["image_size"]
    val_fraction, test_fraction = params["val_fraction"], params["test_fraction"]
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    wanted = {f"{i:06d}.jpg" for i in range(n_images)}
    for stale in image_dir.iterdir():  # left over from a bigger earlier run
        if _IMAGE_NAME_RE.match(stale.name) and stale.name not in wanted:
            stale.unlink()

    workers = min(workers or os.cpu_count() or 1, n_images)
    make = partial(_make_image, seed=int(seed), image_size=int(image_size), image_dir=str(image_dir))
    start = time.perf_counter()
    bar = progress(n_images, desc="synthetic scenes", unit="img")
    if workers == 1:
        results = []
        for i in range(n_images):
            results.append(make(i))
            bar.update()
    else:
        # fork where available: no __main__ guard needed in callers, and workers start instantly.
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(workers) as pool:
            results = []
            for rec in pool.imap(make, range(n_images), chunksize=max(1, min(64, n_images // (8 * workers)))):
                results.append(rec)
                bar.update()
    bar.close()

    splits = _split_names(n_images, seed, val_fraction, test_fraction)
    images, sentid = [], 0
    for i, rec in enumerate(results):
        captions = rec.pop("captions")
        sentids = list(range(sentid, sentid + len(captions)))
        sentences = [{"raw": c, "tokens": _TOKEN_RE.findall(c.lower()), "imgid": i, "sentid": s}
                     for c, s in zip(captions, sentids)]
        images.append({**rec, "filepath": "images", "imgid": i, "split": splits[i],
                       "sentids": sentids, "sentences": sentences})
        sentid += len(captions)
    text = json.dumps({**params, "images": images}, sort_keys=True, separators=(",", ":"))
    atomic_write_text(json_path, text)
    log.info("wrote %d synthetic images (%d px, seed %d) to %s in %.1f s",
             n_images, image_size, seed, out_dir, time.perf_counter() - start)
    return json_path
