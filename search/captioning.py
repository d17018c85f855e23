"""Captions beside retrieval: what each served captioner says about an image, and how well that caption
— or one a person wrote — finds its own image under each served retrieval model.

- ``CaptionService``: the object the REST routers (``/api/caption*``) and the UI's Caption tab call.
  Built on a ``SearchService``: its retrieval models rank the captions, its upload decoder and query
  limits apply; the captioners (search/captioners.py) load in the models' loading thread.
- ``image_rank``: the self-retrieval rank of an image for a caption embedding, among the images of a
  retrieval model's index (a dataset image by its own row; an upload as one more candidate).
- ``CorpusCider``: CIDEr-D of a caption against a dataset image's reference captions, with document
  frequencies from all the captions of the served index (the test split's own corpus).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from indexer.ptb_tokenize import coco_tokenize
from search.captioners import CaptionerRegistry
from search.errors import BadRequest, NotFound, redact_paths
from search.media import load_served
from search.registry import ModelEntry
from search.results import CaptionCheck, CaptionResult, GeneratedCaption, ImageRank
from search.service import SearchService
from training.captioning.cider import CiderD
from training.data.images import ImageError

MAX_BEAM = 20


class CaptionService:
    """Captions of an image beside a ``SearchService``: what each served captioner says, scored by
    CIDEr-D against the image's references and by self-retrieval (the image's rank for the caption under
    each retrieval model). Its captioners load in the search service's loading thread, so ``ready``
    covers them. Every method is safe to call from many request threads at once."""

    def __init__(self, search: SearchService, captioners: dict[str, str | Path] | None = None):
        self.search = search
        self.captioners = CaptionerRegistry(captioners)
        self._ciders: dict[str, CorpusCider] = {}
        if self.captioners.specs:
            search.registry.load_with_models(self.captioners.load)

    def caption_image(self, *, image_id: int | None = None, image_bytes: bytes | None = None,
                      captioners: list[str] | None = None, beam: int = 5) -> CaptionResult:
        """Each captioner's caption of the image, with its CIDEr-D (dataset images) and how well it
        finds the image again under each retrieval model (rank among the index's images)."""
        if not 1 <= beam <= MAX_BEAM:
            raise BadRequest(f"beam must be in [1, {MAX_BEAM}], got {beam}")
        reg = self.captioners
        names = list(dict.fromkeys(captioners or [n for n in reg.names if n in reg.entries]))
        if not names:
            raise NotFound("this server has no captioner: start it with --captioner NAME=CHECKPOINT")
        entries = [reg.get(n) for n in names]
        self.search.registry.get(None)  # retrieval models loaded (503 before)
        img, iid = self._source_image(image_id, image_bytes, 2 * reg.min_side)
        out = []
        for c in entries:
            t0 = time.perf_counter()
            text = c.caption(img, beam)
            ranks = self._ranks(text, img, iid, c.info.judge_sha256) if text.strip() else []  # none for ""
            out.append(GeneratedCaption(captioner=c.name, caption=text, cider=self._cider(text, iid), retrieval=ranks,
                                        info=c.info, took_ms=(time.perf_counter() - t0) * 1000))
        return CaptionResult(image_id=iid, references=self._references(iid), captions=out)

    def check_caption(self, caption: str, *, image_id: int | None = None,
                      image_bytes: bytes | None = None) -> CaptionCheck:
        """How discriminative a caption is: the image's rank for it under each retrieval model."""
        reg = self.search.registry
        reg.get(None)
        caption = self.search.clean_query(caption)
        min_side = max((2 * e.model.image.backbone.preprocess.resize for e in reg.entries.values()
                        if e.model.image.backbone is not None), default=448)
        img, iid = self._source_image(image_id, image_bytes, min_side)
        return CaptionCheck(caption=caption, image_id=iid, cider=self._cider(caption, iid),
                            retrieval=self._ranks(caption, img, iid))

    def _source_image(self, image_id: int | None, image_bytes: bytes | None,
                      min_side: int) -> tuple[Image.Image, int | None]:
        """(PIL image, its dataset id or None) of a caption request."""
        if (image_id is None) == (image_bytes is None):
            raise BadRequest("give exactly one of: image_id, image file")
        if image_bytes is not None:
            return self.search.uploads.decode(image_bytes, min_side), None
        try:
            return load_served(self.search.image_path(image_id), f"image {image_id}"), int(image_id)
        except (ImageError, OSError) as e:
            raise NotFound(f"image {image_id} cannot be read: {redact_paths(str(e))}") from None

    def _ranks(self, caption: str, img: Image.Image, image_id: int | None,
               judge: str | None = None) -> list[ImageRank]:
        """The image's rank for ``caption`` under every serving retrieval model, each flagged ``teacher``
        (it is ``judge``, the sha256 prefix of the model the captioner was trained against) and
        ``referee`` (no served captioner was trained against it: an independent view)."""
        teachers = {c.info.judge_sha256 for c in self.captioners.entries.values()} - {None}
        out = []
        for e in self.search.registry.entries.values():
            vec = self.search.encoder.encode(e, self.search.clean_query(caption))
            row = e.image_pos.get(image_id) if image_id is not None else None
            image_vec = None
            if row is None:
                if e.model.image.backbone is None:
                    continue  # precomputed features: cannot embed an outside image
                with torch.inference_mode():
                    image_vec = e.model.image(e.model.image.prepare([img]).to(e.model.device)).float().cpu()[0].numpy()
            rank, of, score = image_rank(e, vec, row=row, image_vec=image_vec)
            out.append(ImageRank(model=e.name, rank=rank, of=of, score=score, in_index=row is not None,
                                 teacher=bool(judge) and e.sha256.startswith(judge),
                                 referee=not any(e.sha256.startswith(t) for t in teachers)))
        return out

    def _dataset_entry(self, image_id: int | None) -> ModelEntry | None:
        """The first served index that has ``image_id`` with its ground truth (its reference captions)."""
        if image_id is None:
            return None
        return next((e for e in self.search.registry.entries.values()
                     if e.has_ground_truth and image_id in e.image_pos), None)

    def _cider(self, caption: str, image_id: int | None) -> float | None:
        """CIDEr-D against the dataset image's references (the first ground-truth index that has it)."""
        e = self._dataset_entry(image_id)
        if e is None:
            return None
        if e.name not in self._ciders:
            self._ciders[e.name] = CorpusCider(e)
        return self._ciders[e.name].score(caption, e.image_pos[image_id])

    def _references(self, image_id: int | None) -> list[str] | None:
        e = self._dataset_entry(image_id)
        if e is None:
            return None
        meta = e.index.captions.meta
        return [meta["texts"][j] for j in e.index.images.meta["captions"][e.image_pos[image_id]]]


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
        """CIDEr-D of ``caption`` against the references of the image at ``row`` of the index, with
        document frequencies over the whole index; None for an image without references. At most the first
        48 words count."""
        if not self.has_refs[row]:
            return None
        new: dict[str, int] = {}
        ids = []
        for w in self._tok(caption).split()[:48]:
            i = self.words.get(w)
            ids.append(i if i is not None else new.setdefault(w, len(self.words) + 1 + len(new)))
        return float(self.cider.score([ids], [row])[0]) if ids else 0.0
