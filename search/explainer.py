"""``Explainer``: what the service answers about *why* models rank as they do.

- ``explain``: one query, one image, several models → word attributions (search/attribution.py);
- ``word_usage``: two models over their whole split → the words one uses and the other ignores
  (search/word_usage.py), computed once per index (cached next to it);
- ``embedding_map``: one model's images and captions in 2-D (search/embedmap.py), cached likewise.

It holds no model of its own: the service hands it the registry's ``get``, the query encoder and
the upload encoder, so limits, verification and thread-safety stay where they are.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from indexer.caption_texts import model_texts
from indexer.index import IndexDirError
from search import occlusion_gru
from search.attribution import MAX_WORDS, Explanation, ModelAttribution, attribute
from search.embedmap import EmbeddingMap, embedding_map
from search.encoding import QueryEncoder
from search.errors import BadRequest
from search.registry import ModelEntry
from search.word_usage import UsageOptions, VariantEncoder, WordUsage, compare_usage, occlusion_table, text_variants

MAX_MODELS = 4


class Explainer:
    """Why models rank as they do: word attributions of one query (``explain``), the words each model
    uses over a whole split (``word_usage``) and embedding maps. The split tables and maps are computed
    once per model, under a per-model lock, and cached next to the index; every method is safe to call
    from many request threads at once."""

    def __init__(self, get: Callable[[str | None], ModelEntry], encoder: QueryEncoder,
                 encode_upload: Callable[[str, bytes], np.ndarray], clean: Callable[[str], str], *,
                 max_words: int = MAX_WORDS):
        self._get, self._encoder, self._encode_upload, self._clean = get, encoder, encode_upload, clean
        self.max_words = max_words
        self._tables: dict[str, dict] = {}
        self._maps: dict[str, EmbeddingMap] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def clear(self) -> None:
        """Forget the split tables and maps held in memory (the files next to the indexes stay)."""
        with self._guard:
            self._tables.clear()
            self._maps.clear()

    def encode(self, e: ModelEntry) -> Callable[[list[str]], np.ndarray]:
        """A batch text encoder for model ``e`` (every text in one call; no cache, no batcher)."""
        return lambda texts: self._encoder.encode_batch(e, texts)

    def encode_variants(self, e: ModelEntry) -> VariantEncoder:
        """Model ``e``'s encoder of one-word-removed variants: sharing the GRU's states where that is exact
        (and the served encoder is the model's own, not an int8 copy), else every variant as a text."""
        text = e.model.text
        if occlusion_gru.supports(text) and self._encoder.uses_model_encoder(e):
            return occlusion_gru.GRUOcclusion(text, self.encode(e))
        return text_variants(self.encode(e))

    # ---- one query ------------------------------------------------------------------------------
    def explain(self, names: list[str], *, query: str | None = None, caption_id: int | None = None,
                image_id: int | None = None, image_bytes: bytes | None = None) -> Explanation:
        """Word attributions of a query (free text, or a dataset caption) for an image (a dataset image id,
        or an upload; a caption's own image when neither is given) under each of ``names``."""
        if not names or len(names) > MAX_MODELS or len(set(names)) != len(names):
            raise BadRequest(f"give 1 to {MAX_MODELS} different model names")
        entries = [self._get(n) for n in names]
        if (query is None) == (caption_id is None):
            raise BadRequest("give exactly one of: query, caption_id")
        if image_id is not None and image_bytes is not None:
            raise BadRequest("give at most one of: image_id, image file")
        shown = self._clean(query) if query is not None else None
        if caption_id is not None:
            e0 = entries[0]
            pos = e0.caption_row(caption_id)
            shown = e0.index.captions.meta["texts"][pos]
            if image_id is None and image_bytes is None:
                img = e0.index.captions.meta["image"][pos]
                if img is None or img < 0:
                    raise BadRequest(f"caption {caption_id} has no image in the index; give an image_id")
                image_id = int(e0.index.images.ids[img])
        elif image_id is None and image_bytes is None:
            raise BadRequest("give the image to explain: an image_id or an image file")
        out = [self._one(e, shown, caption_id, image_id, image_bytes) for e in entries]
        return Explanation(shown or "", caption_id, image_id, image_bytes is not None, out)

    def _one(self, e: ModelEntry, text: str | None, caption_id: int | None, image_id: int | None,
             image_bytes: bytes | None) -> ModelAttribution:
        if caption_id is not None:
            meta = e.index.captions.meta
            text = model_texts(meta)[e.caption_row(caption_id)]
        row = e.image_row(image_id) if image_id is not None else None
        vec = self._encode_upload(e.name, image_bytes) if image_bytes is not None else None
        return attribute(e.name, text or "", self.encode(e), e.index.images.vectors, row=row, image_vec=vec,
                         max_words=self.max_words)

    # ---- whole split ----------------------------------------------------------------------------
    def occlusion(self, name: str) -> dict:
        """Model ``name``'s split-wide occlusion table (search/word_usage.py), once per process and index."""
        e = self._get(name)
        base = base_index(e)
        with self._lock("occ:" + name):
            if self._tables.get(name, (None,))[0] is not base:  # first call, or a compaction's new generation
                self._tables[name] = (base, occlusion_table(base, self.encode_variants(e)))
            return self._tables[name][1]

    def word_usage(self, a: str, b: str, *, min_count: int = 5) -> WordUsage:
        """The words ``b`` uses and ``a`` ignores (and the reverse) over the split both index, from each
        model's occlusion table (computed once per index generation, cached next to the index: minutes on
        a CPU for a large split). After writes: the occurrences of captions both models still serve, with
        ranks as the generation's table measured them (items added since are not in it; a removed image
        stays a candidate there until a compaction, never a query or an example). BadRequest for one
        model twice, a corpus index, or indexes of different splits; NotFound / NotReady from the
        registry."""
        if a == b:
            raise BadRequest("word usage compares two different models")
        ea, eb = self._get(a), self._get(b)
        ta, tb = self.occlusion(a), self.occlusion(b)
        try:
            options = UsageOptions(names=(a, b), min_count=max(1, int(min_count)))
            return compare_usage(base_index(ea), base_index(eb), ta, tb, options, keep=served_base_captions(ea, eb))
        except IndexDirError as err:
            raise BadRequest(str(err)) from None

    def embedding_map(self, name: str) -> EmbeddingMap:
        """Model ``name``'s embedding map, computed once per model (NotFound / NotReady from the registry)."""
        e = self._get(name)
        with self._lock("map:" + name):
            if name not in self._maps:
                self._maps[name] = embedding_map(name, e.index)
            return self._maps[name]


def base_index(e: ModelEntry):
    """The index generation ``e`` serves, without the writes since (what split-wide tables are made of)."""
    return e.live.base if e.live is not None else e.index


def served_base_captions(a: ModelEntry, b: ModelEntry) -> np.ndarray | None:
    """Per caption row of ``a``'s generation: both models still serve it and its image (None: neither
    model is living)."""
    if a.live is None and b.live is None:
        return None
    base = base_index(a)
    c2i = base.captions.meta["image"]
    img_ids, cap_ids = base.images.ids, base.captions.ids

    def served(c: int) -> bool:
        j = c2i[c]
        return j is not None and j >= 0 and all(
            e.caption_pos.get(int(cap_ids[c])) is not None and e.image_pos.get(int(img_ids[j])) is not None
            for e in (a, b) if e.live is not None)
    return np.array([served(c) for c in range(len(cap_ids))], bool)
