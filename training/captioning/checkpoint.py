"""Caption checkpoints: one ``torch.save`` dict of plain types (tensors, numbers, strings, lists,
dicts), written to a temp file then renamed, and loaded with ``torch.load(weights_only=True)``:
nothing in a checkpoint can run code.

Keys: ``kind model optimizer stage epoch step_in_epoch step config vocab feat_dim feature_key
labelled best judge versions torch_rng dataset``. Where a run stands is the retrieval loop's
:class:`~training.checkpoint.TrainingProgress` (``epoch``/``step_in_epoch`` name the *next* step,
``step`` the optimiser steps taken) plus the ``stage`` (xe | scst) it is in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from training.captioning.config import CaptionConfig, caption_config_from_dict
from training.captioning.data import CaptionData
from training.captioning.model import TopDownCaptioner, build_captioner
from training.captioning.vocab import CaptionVocab
from training.checkpoint import (
    CheckpointError,
    TrainingProgress,
    load_checkpoint,
    save_checkpoint,
    versions,
)
from training.config import ConfigError
from training.device import default_device
from training.errors import UserValueError
from training.fsio import sha256_file

KIND = "ltd-captioner"
REQUIRED = ("kind", "model", "config", "vocab", "feat_dim")


@dataclass
class CaptionProgress(TrainingProgress):
    """Where a captioner run stands: the retrieval loop's position, in a stage, with the best val CIDEr-D."""

    best: dict = field(default_factory=lambda: {"cider": -1.0, "epoch": -1})  # and its "stage" once there is one
    stage: str = "xe"  # the stage of the next step


def caption_checkpoint(cfg: CaptionConfig, data: CaptionData, model: TopDownCaptioner, at: CaptionProgress,
                       optimizer: torch.optim.Optimizer | None = None) -> dict:
    """The payload of ``checkpoint.pt`` (resumable: pass the optimizer) or ``best.pt`` (weights only)."""
    judge = {"path": cfg.train.retrieval, "sha256": sha256_file(cfg.train.retrieval)[:16]} \
        if cfg.train.retrieval else None
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "stage": at.stage, "epoch": at.epoch, "step_in_epoch": at.step_in_epoch, "step": at.step,
            "config": cfg.to_dict(), "vocab": data.vocab.to_dict(), "feat_dim": 1280,
            "feature_key": data.feature_key, "labelled": np.flatnonzero(data.labelled).tolist(), "best": dict(at.best),
            "judge": judge, "versions": versions(), "torch_rng": torch.get_rng_state(),
            "dataset": {"name": data.dataset.name, "json": str(data.dataset.json_path)}}


def restore_caption_training(ckpt: dict, model: TopDownCaptioner) -> CaptionProgress:
    """Load a resumable checkpoint's weights; returns where the run stands (the optimiser is the stage's:
    build it for ``stage``, then load ``ckpt["optimizer"]``)."""
    model.load_state_dict(ckpt["model"])
    return CaptionProgress(epoch=ckpt["epoch"], step_in_epoch=ckpt["step_in_epoch"], step=ckpt["step"],
                           best=ckpt["best"], stage=ckpt["stage"])


def check_same_labelled(ckpt: dict | None, data: CaptionData) -> None:
    """A run continues (or SCST starts from) a checkpoint only on the labelled subset it was trained on."""
    if ckpt is not None and ckpt.get("labelled") != np.flatnonzero(data.labelled).tolist():
        raise ConfigError("the checkpoint was trained on another labelled subset (data.labelled_fraction or "
                          "train.seed differ)")


def save_caption_checkpoint(path: str | Path, payload: dict) -> Path:
    return save_checkpoint(path, {"kind": KIND, **payload})


def load_caption_checkpoint(path: str | Path) -> dict:
    """Through the project's one safe loader (``training.checkpoint.load_checkpoint``)."""
    try:
        ckpt = load_checkpoint(path, required=REQUIRED)
    except CheckpointError as e:
        raise CheckpointError(f"{e} (a caption checkpoint was expected; a retrieval checkpoint goes to --retrieval)") \
            from None
    if ckpt.get("kind") != KIND:
        raise CheckpointError(f"{path} is not an LTD caption checkpoint (a retrieval checkpoint goes to --retrieval)")
    return ckpt


def captioner_from_checkpoint(ckpt: dict | str | Path) -> tuple[TopDownCaptioner, CaptionVocab, CaptionConfig]:
    """Rebuild the captioner a checkpoint holds (eval mode), on the process's device (``training.device``)."""
    if not isinstance(ckpt, dict):
        ckpt = load_caption_checkpoint(ckpt)
    cfg = caption_config_from_dict(ckpt["config"])
    vocab = CaptionVocab.from_dict(ckpt["vocab"])
    model = build_captioner(len(vocab), int(ckpt["feat_dim"]), cfg.model, vocab.pad_id, vocab.bos_id)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UserValueError(f"checkpoint does not match the captioner it describes: {str(e)[:300]}") from None
    return model.to(default_device()).eval(), vocab, cfg
