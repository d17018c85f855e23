"""Captioners by name (``ltd serve --captioner NAME=CKPT``), loaded through the project's one safe
checkpoint loader; a broken one is reported, the others serve. The captioning twin of
search/registry.py; what is done with them is search/captioning.py's ``CaptionService``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from search.errors import NotFound, NotReady, redact_paths
from search.registry import warm_up
from search.results import CaptionerInfo, CaptionersStatus
from training.captioning.checkpoint import captioner_from_checkpoint, load_caption_checkpoint
from training.captioning.inference import decode_regions
from training.fsio import sha256_file
from training.models.backbones import EfficientNetLite0, grid_regions

log = logging.getLogger(__name__)


@dataclass
class CaptionerEntry:
    """A loaded captioner: its model, vocabulary, the grid backbone for its input size, and what the
    checkpoint says about its training. Safe to share between request threads (inference mode only)."""

    name: str
    model: torch.nn.Module
    vocab: object  # training.captioning.vocab.CaptionVocab
    backbone: torch.nn.Module  # EfficientNet-Lite0 grid features at the captioner's input size
    checkpoint: Path
    sha256: str
    info: CaptionerInfo

    @torch.inference_mode()
    def caption(self, img: Image.Image, beam: int) -> str:
        """The caption of ``img`` (a PIL image) by beam search of width ``beam`` (1 = greedy); "" when the
        captioner produces no words."""
        x = self.backbone.preprocess(img, 1)[None]
        ids = decode_regions(self.model, grid_regions(self.backbone.extract(x)), self.vocab, beam=beam)
        return self.vocab.decode_batch(ids)[0]


class CaptionerRegistry:
    """The served captioners by name; a broken one is recorded in ``failed`` with the reason."""

    def __init__(self, specs: dict[str, str | Path] | None = None):
        """``specs``: name → caption checkpoint, loaded on the process's device (``training.device``)."""
        self.specs = {n: Path(p) for n, p in (specs or {}).items()}
        self.entries: dict[str, CaptionerEntry] = {}
        self.failed: dict[str, str] = {}
        self._backbones: dict[int, torch.nn.Module] = {}

    @property
    def names(self) -> list[str]:
        """The configured captioner names, loaded or not, in the order given."""
        return list(self.specs)

    def load(self) -> None:
        """Load every captioner (in the models' loading thread: see ``ModelRegistry.load_with_models``)."""
        for name, path in self.specs.items():
            try:
                self.entries[name] = self._load_one(name, path)
                log.info("captioner %s ready: %s", name, path)
            except Exception as e:  # a broken captioner must not take the retrieval models down
                self.failed[name] = str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
                log.error("captioner %s cannot be served: %s", name, self.failed[name])

    def status(self) -> CaptionersStatus:
        """Ready (name → training summary) and down (name → why, without the server's folders)."""
        return CaptionersStatus(ready={n: e.info for n, e in self.entries.items()},
                                down={n: redact_paths(why) for n, why in self.failed.items()})

    def _load_one(self, name: str, path: Path) -> CaptionerEntry:
        ckpt = load_caption_checkpoint(path)
        model, vocab, cfg = captioner_from_checkpoint(ckpt)
        size = cfg.data.image_size
        if size not in self._backbones:
            self._backbones[size] = EfficientNetLite0("grid", image_size=size).eval()
            warm_up(self._backbones[size])  # before request threads: see registry.warm_up
        stage = ckpt.get("stage")
        judge = (ckpt.get("judge") or {}).get("sha256") if stage == "scst" else None
        info = CaptionerInfo(stage=stage, alpha=cfg.scst.alpha if stage == "scst" else None,
                             labelled_fraction=cfg.data.labelled_fraction, judge_sha256=judge,
                             epoch=ckpt.get("epoch"), val=(ckpt.get("best") or {}).get("value"))
        return CaptionerEntry(name, model, vocab, self._backbones[size], path.resolve(), sha256_file(path), info)

    def get(self, name: str) -> CaptionerEntry:
        """The loaded captioner ``name``. NotFound for a name that is not configured (the message lists
        the served ones), NotReady while loading or for one that failed (with the reason, paths redacted)."""
        if name not in self.specs:
            raise NotFound(f"unknown captioner {name!r}; served captioners: {', '.join(self.names) or 'none'}")
        if name in self.failed:
            raise NotReady(f"captioner {name} is down: {redact_paths(self.failed[name])}")
        if name not in self.entries:
            raise NotReady("captioners are still loading")
        return self.entries[name]

    @property
    def min_side(self) -> int:
        """The largest input side any captioner needs (uploads decode at least at twice that)."""
        return max((e.backbone.preprocess.resize for e in self.entries.values()), default=224)
