"""Checkpoints: one ``torch.save`` dict of plain types, written to a temp file then renamed.

Keys: ``model optimizer scheduler constraint epoch step config vocab versions rng`` plus what a
model needs to rebuild itself (``target_dim``, ``feat_dim``, ``excluded_prefixes``). Frozen
pretrained parts (a packaged backbone, a frozen sentence encoder) are not stored: they are rebuilt
from their package or folder, listed in ``excluded_prefixes``; fine-tuned ones are stored.
"""
from __future__ import annotations

import hashlib
import os
import platform
import random
from pathlib import Path

import numpy as np
import torch

from training.config import Config, config_from_dict
from training.data.vocab import Vocab
from training.models.dual_encoder import DualEncoder, build_model

BACKBONE_PREFIX = "image.backbone."


def versions() -> dict:
    import faiss  # noqa: F401  (recorded for index compatibility)

    from training import __version__
    return {"ltd": __version__, "torch": str(torch.__version__), "numpy": np.__version__,
            "python": platform.python_version(), "faiss": getattr(faiss, "__version__", "?")}


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def model_state(model: DualEncoder, exclude: list[str]) -> dict:
    """The state dict without the frozen pretrained parts (``exclude`` prefixes) that rebuild from packages."""
    return {k: v for k, v in model.state_dict().items() if not any(k.startswith(p) for p in exclude)}


def save_checkpoint(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _numpy_safe_globals() -> list:
    """The numpy reconstructors that the numpy RNG state in ``rng`` pickles to. Allowing them keeps
    ``weights_only=True`` safe: they rebuild plain arrays, and anything inside goes through the same
    restricted unpickler."""
    core = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64, np.float32, np.int32, np.bool_)]
    # TorchVersion (a str subclass): what versions() stored before it wrote a plain str
    return [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype, *dtypes,
            torch.torch_version.TorchVersion]


def safe_torch_load(path: str | Path) -> object:
    """``torch.load(weights_only=True)``: tensors, plain containers and numpy arrays only, never
    arbitrary objects (checkpoints are user-supplied files)."""
    with torch.serialization.safe_globals(_numpy_safe_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        ckpt = safe_torch_load(path)
    except Exception as e:
        raise ValueError(f"{path} is not a readable checkpoint: {type(e).__name__}: {e}") from None
    for key in ("model", "config", "vocab"):
        if not isinstance(ckpt, dict) or key not in ckpt:
            raise ValueError(f"{path} is not an LTD checkpoint (missing {key!r})")
    return ckpt


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_from_checkpoint(ckpt: dict | str | Path, device: str | torch.device = "cpu") -> tuple[DualEncoder, Vocab, Config]:
    """Rebuild the model a checkpoint was trained as (eval mode)."""
    if not isinstance(ckpt, dict):
        ckpt = load_checkpoint(ckpt)
    cfg = config_from_dict(ckpt["config"])
    vocab = Vocab.from_dict(ckpt["vocab"])
    # Word vectors come from the saved state; no GloVe file is read.
    cfg.model.word_dim = int(ckpt.get("word_dim", cfg.model.word_dim))
    model = build_model(cfg, vocab, feat_dim=ckpt.get("feat_dim"), target_dim=int(ckpt.get("target_dim", 0)))
    missing, unexpected = model.load_state_dict(ckpt["model"], strict=False)
    excluded = ckpt.get("excluded_prefixes", [] if ckpt.get("backbone_in_state") else [BACKBONE_PREFIX])
    bad = [k for k in missing if not any(k.startswith(p) for p in excluded)] + list(unexpected)
    if bad:
        raise ValueError(f"checkpoint does not match the model it describes: {bad[:5]}")
    if ckpt.get("backbone_trained"):
        model.image.frozen = True  # inference uses the fast frozen path with the fine-tuned weights
    return model.to(device).eval(), vocab, cfg
