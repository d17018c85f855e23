"""Checkpoints: one ``torch.save`` dict of plain types, written to a temp file then renamed.

Keys: ``model optimizer scheduler constraint epoch step config vocab versions rng`` plus what a
model needs to rebuild itself (``target_dim``, ``feat_dim``, ``region_dim``, ``excluded_prefixes``) and what a
resumed run continues from (:func:`training_checkpoint` writes them all, :func:`restore_training`
reads them back). ``epoch``/``step_in_epoch`` name the *next* step to run, ``step`` the optimizer
steps taken. Frozen
pretrained parts (a packaged backbone, a frozen sentence encoder) are not stored: they are rebuilt
from their package or folder, listed in ``excluded_prefixes``; fine-tuned ones are stored.

A checkpoint is untrusted input (users load files they were sent): it is read with
``torch.load(weights_only=True)``, whose unpickler builds only tensors and plain containers and
refuses every other class, so a crafted file cannot run code. Everything saved here is plain
(the numpy RNG state is stored as a tensor, versions as ``str``). Checkpoints written before that
change carry a numpy array in their RNG state; for those, and only those, numpy's array
reconstruction is allowed as well (it rebuilds arrays of plain dtypes, nothing callable).
"""
from __future__ import annotations

import logging
import pickle
import platform
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np
import torch
from torch.torch_version import TorchVersion

from training import __version__
from training.config import Config, config_from_dict, load_config
from training.data.vocab import Vocab
from training.device import default_device
from training.errors import UserError, UserFileNotFound
from training.fsio import atomic_path, remove_stale_temps
from training.models.backbones import state_digest
from training.models.dual_encoder import DualEncoder, ModelDims, PretrainedParts, build_model
from training.models.towers import source_from_dir, source_from_spec

if TYPE_CHECKING:
    from training.prepare import TrainingData

BACKBONE_PREFIX = "image.backbone."
log = logging.getLogger(__name__)


def versions() -> dict:
    return {"ltd": __version__, "torch": str(torch.__version__), "numpy": np.__version__,
            "python": platform.python_version(), "faiss": getattr(faiss, "__version__", "?")}


class CheckpointError(UserError, ValueError):
    """A file that is not a loadable LTD checkpoint (or not one that can be loaded safely)."""


def rng_state() -> dict:
    """RNG states as plain types (tensors, ints, floats, tuples): loadable with weights_only=True."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "numpy": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    if isinstance(n, dict):
        np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                             n["cached_gaussian"]))
    else:  # a checkpoint from before the plain-types RNG state: numpy's own tuple
        np.random.set_state(n)
    random.setstate(state["python"])


def _legacy_globals() -> list:
    """What checkpoints written before the plain-types RNG state need beyond tensors: numpy arrays
    of plain dtypes (the RNG keys) and torch's version string."""
    return [np._core.multiarray._reconstruct, np.ndarray, np.dtype, np.dtypes.UInt32DType, TorchVersion]


def model_state(model: DualEncoder, exclude: list[str]) -> dict:
    """The state dict without the frozen pretrained parts (``exclude`` prefixes) that rebuild from packages."""
    return {k: v for k, v in model.state_dict().items() if not any(k.startswith(p) for p in exclude)}


@dataclass
class TrainingProgress:
    """Where a run stands; a checkpoint stores it and a resumed run continues from it."""

    epoch: int = 0  # the epoch of the next step (0-based)
    step_in_epoch: int = 0  # the next step's index inside that epoch
    step: int = 0  # optimizer steps taken so far
    best: dict = field(default_factory=lambda: {"rsum": -1.0, "epoch": -1})  # best val rsum and its epoch (1-based)


@dataclass(frozen=True)
class Optimizers:
    """What a resumable checkpoint saves beside the weights (:func:`training_checkpoint`): the
    ``optimizer``, its learning-rate ``scheduler`` and the AMP gradient ``scaler``."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def training_checkpoint(cfg: Config, data: TrainingData, weights: DualEncoder, at: TrainingProgress,
                        objective_state: dict, *, optimizers: Optimizers | None = None) -> dict:
    """The payload of ``checkpoint.pt`` (resumable: pass the run's ``optimizers``) or ``best.pt`` (weights
    only: ``optimizers`` is None). ``objective_state`` is
    :meth:`TrainingObjective.checkpoint_state` (λ with its optimizer and trace, the curriculum)."""
    m = cfg.model
    trained = not m.freeze_backbone or 0 <= m.unfreeze_after_epoch < at.epoch  # backbone weights changed
    o = optimizers
    state = {"optimizer": None, "scheduler": None} if o is None else {
        "optimizer": o.optimizer.state_dict(), "scheduler": o.scheduler.state_dict(), "scaler": o.scaler.state_dict()}
    excluded = weights.frozen_prefixes(backbone_trained=trained)
    embed = getattr(weights.text, "embed", None)
    return {"model": model_state(weights, excluded), "excluded_prefixes": excluded, **state,
            "constraint": objective_state["constraint"], "epoch": at.epoch, "step_in_epoch": at.step_in_epoch,
            "step": at.step, "config": cfg.to_dict(), "vocab": data.vocab.to_dict(), "versions": versions(),
            "rng": rng_state(), "best": at.best, "stale_epochs": objective_state["stale_epochs"],
            "contrastive": objective_state["contrastive"],
            "target_dim": int(data.targets.shape[1]) if data.targets is not None else 0,
            "feat_dim": data.feat_dim, "region_dim": data.region_dim,
            "word_dim": int(embed.weight.shape[1]) if embed is not None else m.word_dim,
            "backbone_in_state": trained, "backbone_trained": trained, "feature_key": data.feature_key,
            "dataset": {"name": data.dataset.name, "json": str(data.dataset.json_path)},
            "clip": data.clip.spec if data.clip is not None else None}


def restore_training(ckpt: dict, model: DualEncoder, optimizer: torch.optim.Optimizer, scheduler,
                     scaler=None) -> TrainingProgress:
    """Load a resumable checkpoint's model, optimizer, scheduler (and AMP scaler, when given and
    saved) state; returns where the run stands. The objective's state is the objective's to load."""
    model.load_state_dict(ckpt["model"], strict=False)
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if scaler is not None and "scaler" in ckpt:
        scaler.load_state_dict(ckpt["scaler"])
    return TrainingProgress(epoch=ckpt["epoch"], step_in_epoch=ckpt["step_in_epoch"], step=ckpt["step"],
                            best=ckpt["best"])


def save_checkpoint(path: str | Path, payload: dict) -> Path:
    """Write atomically; temporaries that killed runs left beside it are removed first."""
    path = Path(path)
    remove_stale_temps(path.parent)
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


def load_checkpoint(path: str | Path, *, required: tuple[str, ...] = ("model", "config", "vocab")) -> dict:
    """Load without executing anything the file contains (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise UserFileNotFound(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals(_legacy_globals()):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln or "Unsupported" in ln]
        what = (lines[0] if lines else "an object the safe loader does not build").rstrip(".")
        raise CheckpointError(f"{path} was refused: it contains objects other than tensors and plain data "
                              f"({what[:160]}); checkpoints are never loaded in a way that could run code") from None
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint: {type(e).__name__}: {str(e)[:200]}") from None
    for key in required:
        if not isinstance(ckpt, dict) or key not in ckpt:
            raise CheckpointError(f"{path} is not an LTD checkpoint (missing {key!r})")
    return ckpt


def init_from_checkpoint(model: DualEncoder, path: str | Path) -> list[str]:
    """Start a run from another run's weights (``train.init_from``: fine-tuning a pretrained model, the
    shortcut paper's setting; not a resume — optimiser, schedule and λ start afresh). Every tensor the
    source holds must exist here with the same shape, so a wrong source fails instead of silently
    training from scratch; the one exception is a decoder the new run has no use for. What the source
    lacks keeps its initialisation: a new LTD decoder (frozen parts the source left out are rebuilt from
    their package, as the source's were). Returns the names of the tensors left at initialisation."""
    src = load_checkpoint(path)
    state, packaged = src["model"], tuple(src.get("excluded_prefixes", []))
    own = model.state_dict()
    unused = [k for k in state if k not in own and k.startswith("decoder.")]
    bad = [k for k in state if k not in unused and (k not in own or own[k].shape != state[k].shape)]
    if bad:
        what = ", ".join(f"{k} {tuple(state[k].shape)}" + (f" vs {tuple(own[k].shape)}" if k in own else " (absent here)")
                         for k in bad[:3])
        raise CheckpointError(f"train.init_from={path}: its weights do not fit this model ({len(bad)} tensors, e.g. {what})")
    model.load_state_dict({k: v for k, v in state.items() if k not in unused}, strict=False)
    fresh = [k for k in own if k not in state and not k.startswith(packaged)]  # frozen packaged parts are the same
    log.info("initialised from %s (%d tensors; %d left at initialisation%s)", path, len(state) - len(unused), len(fresh),
             f", {len(unused)} decoder tensors unused" if unused else "")
    return fresh


def zero_shot_checkpoint(clip_path: str | Path, text_path: str | Path | None = None) -> dict:
    """The checkpoint of an untrained CLIP or other pretrained tower pair (``towers.py``; both towers, the
    pretrained logit scale): what `ltd index` writes for a tower folder, so the zero-shot score is one
    command and serves like any trained model. ``text_path``: a text tower that replaces the folder's.
    The folders' config, tokenizer and preprocessing go in as plain data (see ``training_checkpoint``)."""
    cfg = load_config(base={"model": {"backbone": "clip", "text_encoder": "clip", "clip_path": str(clip_path),
                                      "clip_text_path": str(text_path or "")},
                            "train": {"name": "clip_zero_shot"}})
    clip, vocab = source_from_dir(clip_path, text_path), Vocab.build([])
    model = build_model(cfg, vocab, parts=PretrainedParts(clip=clip))
    return {"model": model.state_dict(), "excluded_prefixes": [], "config": cfg.to_dict(), "vocab": vocab.to_dict(),
            "versions": versions(), "epoch": 0, "step": 0, "best": {"rsum": None, "epoch": 0}, "target_dim": 0,
            "feat_dim": clip.embed_dim, "region_dim": 0, "word_dim": cfg.model.word_dim, "backbone_in_state": True,
            "backbone_trained": False, "clip": clip.spec, "zero_shot": True}


def model_from_checkpoint(ckpt: dict | str | Path) -> tuple[DualEncoder, Vocab, Config]:
    """Rebuild the model a checkpoint was trained as (eval mode), on the process's device (``training.device``)."""
    if not isinstance(ckpt, dict):
        ckpt = load_checkpoint(ckpt)
    cfg = config_from_dict(ckpt["config"])
    vocab = Vocab.from_dict(ckpt["vocab"])
    # Word vectors come from the saved state; no GloVe file is read.
    cfg.model.word_dim = int(ckpt.get("word_dim", cfg.model.word_dim))
    clip = None
    if ckpt.get("clip"):  # the CLIP's config, tokenizer and preprocessing travel in the checkpoint
        clip = source_from_spec(ckpt["clip"])
    dims = ModelDims(ckpt.get("feat_dim"), int(ckpt.get("region_dim", 0)), int(ckpt.get("target_dim", 0)))
    model = build_model(cfg, vocab, dims=dims, parts=PretrainedParts(clip=clip))
    missing, unexpected = model.load_state_dict(ckpt["model"], strict=False)
    excluded = ckpt.get("excluded_prefixes", [] if ckpt.get("backbone_in_state") else [BACKBONE_PREFIX])
    bad = [k for k in missing if not any(k.startswith(p) for p in excluded)] + list(unexpected)
    if bad:
        raise CheckpointError(f"checkpoint does not match the model it describes: {bad[:5]}")
    if ckpt.get("backbone_trained"):
        model.image.frozen = True  # inference uses the fast frozen path with the fine-tuned weights
        # ... and the feature cache must not answer with the pretrained weights' features
        model.image.backbone.weights_id = f"trained:{state_digest(model.image.backbone)[:16]}"
    return model.to(default_device()).eval(), vocab, cfg
