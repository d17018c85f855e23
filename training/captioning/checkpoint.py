"""Caption checkpoints: one ``torch.save`` dict of plain types (tensors, numbers, strings, lists,
dicts), written to a temp file then renamed, and loaded with ``torch.load(weights_only=True)``:
nothing in a checkpoint can run code.

Keys: ``kind model optimizer stage epoch step_in_epoch step config vocab feat_dim feature_key
labelled best judge versions torch_rng``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from training.captioning.config import CaptionConfig, caption_config_from_dict
from training.captioning.model import TopDownCaptioner, build_captioner
from training.captioning.vocab import CaptionVocab
from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.errors import UserValueError

KIND = "ltd-captioner"
REQUIRED = ("kind", "model", "config", "vocab", "feat_dim")


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


def captioner_from_checkpoint(ckpt: dict | str | Path, device: str | torch.device = "cpu"
                              ) -> tuple[TopDownCaptioner, CaptionVocab, CaptionConfig]:
    """Rebuild the captioner a checkpoint holds (eval mode)."""
    if not isinstance(ckpt, dict):
        ckpt = load_caption_checkpoint(ckpt)
    cfg = caption_config_from_dict(ckpt["config"])
    vocab = CaptionVocab.from_dict(ckpt["vocab"])
    model = build_captioner(len(vocab), int(ckpt["feat_dim"]), cfg.model, vocab.pad_id, vocab.bos_id)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UserValueError(f"checkpoint does not match the captioner it describes: {str(e)[:300]}") from None
    return model.to(device).eval(), vocab, cfg
