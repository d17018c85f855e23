"""The queries a photo library needs beyond text → images and image → captions, and filters for all.

Mixed into ``SearchService`` (search/service.py), whose registry, encoder and upload decoder they use:

- ``similar_images``: image → images ("more like this"), by a served image's id or an upload;
- ``similar_captions``: text → captions ("captions like this one"), by a text or a caption's id;
- ``search_vector``: a raw embedding (the model's space, length ``dim``) against either side;
- ``batch``: many queries in one call, each as one of the above (at most ``max_batch_queries``);
- ``filter_masks``: a filter (search/filters.py) as masks over a snapshot's image and caption rows;
- ``metadata_fields``: the fields of a model's live items and their values (search/facets.py), what
  the UI builds its filter chips from.

Every ranking takes ``filter`` and ``cursor`` (search/paging.py) and ranks exactly within the filter
(search/live_views.py), so k matches are returned whenever k items match.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

import numpy as np

from search.errors import BadRequest
from search.facets import FieldValues, field_values
from search.filters import parse_filter
from search.ranking import Query, RankRequest
from search.registry import ModelEntry
from search.results import QueryInfo, SearchResult

BATCH_KINDS = ("text", "image", "similar_images", "similar_captions", "vector")
MASK_CACHE = 16  # masks kept per service (an image and a caption mask of 1 M rows: ~6 MB)


class MaskCache:
    """The last ``MASK_CACHE`` filter masks, by (model, generation, write seq, table, filter); thread-safe.
    A snapshot's metadata never changes, so a mask of it is valid until the snapshot is replaced."""

    def __init__(self, size: int = MASK_CACHE):
        self.size, self._lock, self._items = size, threading.Lock(), OrderedDict()

    def get(self, key: tuple, build) -> np.ndarray:
        """The mask under ``key``, built by ``build()`` when it is not kept (two threads may both build it
        once; either result is the same)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        mask = np.asarray(build(), dtype=bool)
        mask.flags.writeable = False  # shared between requests: callers combine it, never change it
        with self._lock:
            self._items[key] = mask
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return mask
_FACETS_LOCK = threading.Lock()


class QueryMixin:
    """See the module doc. Thread-safe like the service, which gives it ``masks`` (a ``MaskCache``)."""

    masks: MaskCache

    def filter_masks(self, e: ModelEntry, filter: dict | None, *, captions: bool = True
                     ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(mask over image rows, mask over caption rows: those of a matching image) of ``filter`` on
        ``e``'s snapshot; (None, None) without a filter; the caption mask only when ``captions``. BadRequest
        for a filter that is not one. The masks are read-only and cached per snapshot (a UI applies one
        filter to many queries; building a mask over a million rows costs tens of milliseconds)."""
        if filter is None:
            return None, None
        f = parse_filter(filter)
        key = (e.name, e.generation, e.seq, id(e.table), json.dumps(f.to_json(), sort_keys=True))
        images = self._cached_mask(key, lambda: f.mask(e.table)[: len(e.index.images.meta["ids"])])
        if not captions:
            return images, None

        def caption_rows() -> np.ndarray:
            links = e.caption_image[: len(e.index.captions.meta["ids"])]
            out = np.zeros(len(links), bool)
            linked = links >= 0
            out[linked] = images[links[linked]]
            return out

        return images, self._cached_mask((*key, "captions"), caption_rows)

    def _cached_mask(self, key: tuple, build) -> np.ndarray:
        return self.masks.get(key, build)

    def metadata_fields(self, name: str, *, max_values: int = 50) -> list[FieldValues]:
        """The metadata fields of model ``name``'s live items, each with its kinds of values, its most
        frequent strings (with item counts) and its number and date ranges (search/facets.py): what the
        UI offers as filter chips. Removed items are never counted. Cached per snapshot (generation and
        last write), so it is recomputed only after a change."""
        e = self.registry.get(name)
        if e.table is None:
            return []
        key = (name, e.generation, e.seq, max_values)
        with _FACETS_LOCK:
            cache = self.__dict__.setdefault("_facets_cache", {})
            if key in cache:
                return cache[key]
        n = len(e.index.images.meta["ids"])
        dead = getattr(e.index.images.index, "dead", None)
        alive = ~np.asarray(dead[:n], bool) if dead is not None else np.ones(n, bool)
        out = field_values(e.table, alive, max_values=max_values)
        with _FACETS_LOCK:
            cache = {k: v for k, v in cache.items() if k[0] != name}  # only the newest snapshot per model
            cache[key] = out
            self.__dict__["_facets_cache"] = cache
        return out

    def similar_images(self, name: str, *, image_id: int | None = None, image_bytes: bytes | None = None,
                       k: int = 10, filter: dict | None = None, cursor: str | None = None) -> SearchResult:
        """Image → images: the served image ``image_id`` (it ranks first: itself) or an upload."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        q = self._image_query(e, image_id, image_bytes)
        q.ground_truth = q.relevance = None  # image ↔ image has no dataset ground truth
        return self._rank_images(name, e, q, RankRequest(k, "i2i", t0, filter, cursor))

    def similar_captions(self, name: str, *, query: str | None = None, caption_id: int | None = None,
                         k: int = 10, filter: dict | None = None, cursor: str | None = None) -> SearchResult:
        """Text → captions: a text, or a served caption ``caption_id`` (which ranks first)."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        q = self._text_query(e, query, caption_id)
        q.ground_truth = q.relevance = None
        return self._rank_captions(name, e, q, RankRequest(k, "t2t", t0, filter, cursor))

    def search_vector(self, name: str, vector: list[float], *, side: str = "images", k: int = 10,
                      filter: dict | None = None, cursor: str | None = None) -> SearchResult:
        """A raw embedding as the query: ``side`` "images" or "captions". It must have the model's
        dimension and finite values; it is L2-normalised (the index holds unit vectors)."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        dim = int(e.index.images.vectors.shape[1])
        if not isinstance(vector, (list, tuple)) or len(vector) != dim:
            raise BadRequest(f"vector must be a list of {dim} numbers (model {name}'s embedding size)")
        v = np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(v))
        if not np.isfinite(v).all() or norm == 0.0:
            raise BadRequest("vector must be finite and not all zeros")
        q = Query(v / norm, QueryInfo(vector=True))
        if side == "images":
            return self._rank_images(name, e, q, RankRequest(k, "v2i", t0, filter, cursor))
        if side == "captions":
            return self._rank_captions(name, e, q, RankRequest(k, "v2t", t0, filter, cursor))
        raise BadRequest("side must be 'images' or 'captions'")

    def batch(self, name: str, queries: list[dict], *, k: int = 10, filter: dict | None = None) -> list[SearchResult]:
        """Several queries in one call: each ``{"kind": …}`` with that query's fields (``text``, ``caption_id``,
        ``image_id``, ``vector``, ``side``, ``k``, ``filter``, ``cursor``); ``k`` and ``filter`` are the
        defaults of those that do not say. Answers in order; the first bad query fails the call."""
        if not isinstance(queries, list) or not 1 <= len(queries) <= self.config.max_batch_queries:
            raise BadRequest(f"queries must be a list of 1 to {self.config.max_batch_queries} queries")
        out = []
        for n, q in enumerate(queries):
            if not isinstance(q, dict) or q.get("kind") not in BATCH_KINDS:
                raise BadRequest(f"queries[{n}]: kind must be one of {', '.join(BATCH_KINDS)}")
            common = {"k": q.get("k", k), "filter": q.get("filter", filter), "cursor": q.get("cursor")}
            kind = q["kind"]
            try:
                if kind == "text":
                    out.append(self.search_text(name, query=q.get("text"), caption_id=q.get("caption_id"), **common))
                elif kind == "image":
                    out.append(self.search_image(name, image_id=q.get("image_id"), **common))
                elif kind == "similar_images":
                    out.append(self.similar_images(name, image_id=q.get("image_id"), **common))
                elif kind == "similar_captions":
                    out.append(self.similar_captions(name, query=q.get("text"), caption_id=q.get("caption_id"),
                                                     **common))
                else:
                    out.append(self.search_vector(name, q.get("vector"), side=q.get("side", "images"), **common))
            except BadRequest as err:
                raise BadRequest(f"queries[{n}]: {err.detail}") from None
        return out
