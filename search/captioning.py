"""Captions in the search service: what each served captioner says about an image, and how well that
caption — or one a person wrote — finds its own image under each served retrieval model.

- ``CaptionerRegistry``: captioner checkpoints by name (``ltd serve --captioner NAME=CKPT``), loaded
  through the project's one safe checkpoint loader; a broken one is reported, the others serve.
- ``image_rank``: the self-retrieval rank of an image for a caption embedding, among the images of a
  retrieval model's index (a dataset image by its own row; an upload as one more candidate).
- ``CorpusCider``: CIDEr-D of a caption against a dataset image's reference captions, with document
  frequencies from all the captions of the served index (the test split's own corpus).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from search.errors import NotFound, NotReady, redact_paths
from search.registry import ModelEntry, warm_up
from training.fsio import sha256_file

log = logging.getLogger(__name__)


@dataclass
class CaptionerEntry:
    name: str
    model: torch.nn.Module
    vocab: object  # training.captioning.vocab.CaptionVocab
    backbone: torch.nn.Module  # EfficientNet-Lite0 grid features at the captioner's input size
    checkpoint: Path
    sha256: str
    info: dict = field(default_factory=dict)

    @torch.inference_mode()
    def caption(self, img: Image.Image, beam: int) -> str:
        from training.captioning.inference import decode_regions
        from training.models.backbones import grid_regions

        x = self.backbone.preprocess(img, 1)[None]
        ids = decode_regions(self.model, grid_regions(self.backbone.extract(x)), self.vocab, beam=beam)
        return self.vocab.decode_batch(ids)[0]


class CaptionerRegistry:
    def __init__(self, specs: dict[str, str | Path] | None = None, device: str = "cpu"):
        self.specs = {n: Path(p) for n, p in (specs or {}).items()}
        self.device = device
        self.entries: dict[str, CaptionerEntry] = {}
        self.failed: dict[str, str] = {}
        self._backbones: dict[int, torch.nn.Module] = {}

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def load(self) -> None:
        for name, path in self.specs.items():
            try:
                self.entries[name] = self._load_one(name, path)
                log.info("captioner %s ready: %s", name, path)
            except Exception as e:  # a broken captioner must not take the retrieval models down
                self.failed[name] = str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
                log.error("captioner %s cannot be served: %s", name, self.failed[name])

    def _load_one(self, name: str, path: Path) -> CaptionerEntry:
        from training.captioning.checkpoint import captioner_from_checkpoint, load_caption_checkpoint
        from training.models.backbones import EfficientNetLite0

        ckpt = load_caption_checkpoint(path)
        model, vocab, cfg = captioner_from_checkpoint(ckpt, self.device)
        size = cfg.data.image_size
        if size not in self._backbones:
            self._backbones[size] = EfficientNetLite0("grid", image_size=size).eval()
            warm_up(self._backbones[size])  # before request threads: see registry.warm_up
        stage = ckpt.get("stage")
        judge = (ckpt.get("judge") or {}).get("sha256") if stage == "scst" else None
        info = {"stage": stage, "alpha": cfg.scst.alpha if stage == "scst" else None,
                "labelled_fraction": cfg.data.labelled_fraction, "judge_sha256": judge,
                "epoch": ckpt.get("epoch"), "val": (ckpt.get("best") or {}).get("value")}
        return CaptionerEntry(name, model, vocab, self._backbones[size], path.resolve(), sha256_file(path), info)

    def get(self, name: str) -> CaptionerEntry:
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


def image_rank(entry: ModelEntry, caption_vec: np.ndarray, *, row: int | None = None,
               image_vec: np.ndarray | None = None) -> tuple[int, int, float]:
    """(rank, out of, score) of an image for a caption among the images of ``entry``'s index: the
    index row ``row``, or an outside image ``image_vec`` ranked as one more candidate. Ties count
    against the image (rank = 1 + images scoring at least as high)."""
    scores = np.asarray(entry.index.images.vectors) @ caption_vec
    if row is not None:
        own = float(scores[row])
        return int((np.delete(scores, row) >= own).sum()) + 1, len(scores), own
    own = float(image_vec @ caption_vec)
    return int((scores >= own).sum()) + 1, len(scores) + 1, own


class CorpusCider:
    """CIDEr-D against one dataset image's references; document frequencies over every image of the index."""

    def __init__(self, entry: ModelEntry):
        from indexer.ptb_tokenize import coco_tokenize
        from training.captioning.cider import CiderD

        self._tok = coco_tokenize
        texts = entry.index.captions.meta["texts"]
        self.words: dict[str, int] = {}
        refs = [[self._ids(texts[j]) for j in caps] for caps in entry.index.images.meta["captions"]]
        self.has_refs = [bool(r) for r in refs]
        # room for the words a caption may bring that no reference has (distinct ids, never matching);
        # n-gram keys are base**4 at most, which must fit an int64
        self.base = len(self.words) + 64
        if self.base ** 4 >= 2 ** 63:
            raise ValueError(f"{len(self.words)} distinct words: too many for CIDEr-D's int64 n-gram keys")
        dummy = [[self.base - 3]]  # CiderD wants a reference per image; images without captions are never scored
        self.cider = CiderD([r if r else dummy for r in refs], base=self.base)

    def _ids(self, text: str) -> list[int]:
        return [self.words.setdefault(w, len(self.words) + 1) for w in self._tok(text).split()]

    def score(self, caption: str, row: int) -> float | None:
        if not self.has_refs[row]:
            return None
        new: dict[str, int] = {}
        ids = []
        for w in self._tok(caption).split()[:48]:
            i = self.words.get(w)
            ids.append(i if i is not None else new.setdefault(w, len(self.words) + 1 + len(new)))
        return float(self.cider.score([ids], [row])[0]) if ids else 0.0
