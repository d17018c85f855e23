"""``SearchService``: the object the REST routers and the UI call for retrieval.

It composes the registry (which models serve), the query encoder, the upload decoder, the
thumbnail cache, the explorer and the explainer, and turns requests into typed results
(search/results.py). Its parts are public and used directly (``service.registry.get(name)``,
``service.registry.ready``, ``service.encoder.info()``, ``service.explainer.explain(...)``): the
service adds what needs several of them, never a forward to one. Captions are a service of their own
(``search.captioning.CaptionService``) built on this one. Every method is safe to call from many
threads at once; errors are ``search.errors`` types, never HTTP.
"""
from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

import anyio
import numpy as np
import torch
from pydantic import Field, model_validator

from indexer.caption_texts import model_texts
from indexer.vector_index import IndexDirError
from search import analysis
from search.encoding import QueryEncoder, clean_query
from search.errors import BadRequest, NotFound, NotReady
from search.explainer import Explainer
from search.files import open_served, servable_image
from search.media import Thumbnails, UploadDecoder
from search.queries import MaskCache, QueryMixin
from search.ranking import Query, RankRequest, compare_results, rank
from search.registry import ModelEntry, ModelRegistry, public_manifest
from search.results import CompareResult, DatasetCaption, ModelInfo, QueryInfo, SearchResult
from search.writes import ItemWrites
from training.choices import TextRuntime, VerifyIndex
from training.config_base import Section
from training.data.members import ImageMember
from training.device import set_device
from training.packaged_models import saw_caption_corpora

# Largest searched side (vectors × dimensions) that ``search_text_async`` ranks on the event loop: FAISS took
# 0.2 ms for one query against 1,000 × 1,024 (~2^20) on the 2-core Xeon, and its hits another 0.05 ms;
# larger sides, and approximate indexes of any size, pay a worker-thread hand-off but never stall the loop.
RANK_ON_LOOP = 1 << 21


class SearchConfig(Section):
    """Limits and tuning of the service. The REST settings (app/api/settings.py) inherit these fields,
    so each is declared once and can be set from the flags or the ``LTD_*`` environment."""

    # The device the models compute on: the service makes it its process's (training.device), so the models,
    # captioners and query batches load and run there.
    device: str = "cpu"
    # The request limits, here once: the REST API validates against them (its OpenAPI document shows
    # them) and the UI enforces them (app/api/schemas.py, ui/context.py).
    max_k: int = Field(1000, ge=1)
    max_query_chars: int = Field(1000, ge=1)
    max_upload_bytes: int = Field(10 * 1024 * 1024, ge=1)  # an uploaded file, before it is decoded
    # Decoded size limit of an uploaded image (width × height). JPEGs decode at reduced scale first
    # (short side ≥ twice the model's input), so this binds PNG/WebP/GIF/BMP/TIFF: 16 MP is 64 MB in memory.
    max_upload_pixels: int = Field(16_000_000, ge=1)
    # Uploads decoded at the same time (each may hold max_upload_pixels × 4 bytes while it runs).
    max_concurrent_decodes: int = Field(2, ge=1)
    thumb_cache: int = Field(2048, ge=0)  # thumbnails kept in memory (LRU)
    # Query-embedding LRU cache entries per service (0 = off). Repeated queries skip the encoder.
    text_cache: int = Field(4096, ge=0)
    # Group text queries that arrive while the encoder is busy into one encoder call.
    text_batching: bool = True
    max_text_batch: int = Field(64, ge=1)
    # Opt-in: encode queries with an int8 dynamically quantised copy of the text encoder (GRU and
    # Linear layers). Approximate: on the Flickr8k demo's frozen MiniLM tower the query embeddings
    # drift to cosine 0.89 (min) and text→image R-sum drops 7.4 points (BENCHMARKS.md, "Query encoder
    # runtimes"); `text_runtime` is the faster exact path there. Index embeddings are unchanged.
    text_quantize: bool = False
    # Engine of a frozen sentence-transformers query tower (training/models/text_runtimes.py): "auto"
    # picks the fastest installed one by measurement; other text encoders always run in torch.
    text_runtime: TextRuntime = "auto"
    # Threads of that engine when it is OpenVINO or ONNX Runtime (0 = one fewer than the cores, at least 1:
    # the request path keeps a core; search.encoding.serving_threads).
    text_runtime_threads: int = Field(0, ge=0)
    # Index check at load: "hash" (sha256 of every data file, default) or "counts" (sizes and counts only,
    # for very large indexes; logged).
    verify_index: VerifyIndex = "hash"
    # Folders image files may be served from (`ltd serve --images-root`, repeatable). Empty: the folders
    # `ltd index` recorded for this user when it built each index (indexer/image_roots.py); an index
    # whose manifest names any other folder serves no image file from it.
    images_roots: list[str] = Field(default_factory=list)
    # The living index (search/writes.py): writes are off unless `ltd serve --writable`; a write adds at
    # most max_items_per_add images; a batch search holds at most max_batch_queries queries; folders the
    # server may add images from (`--ingest-root`, relative names only); how often other processes'
    # changes to the served indexes are looked for (seconds; 0: only on POST …/reload); a writable server
    # compacts a model in the background once this many items were added or removed since its
    # generation (0: only on POST …/compact or `ltd index --compact`).
    writable: bool = False
    compact_after: int = Field(10_000, ge=0)
    # How much lower the CPU priority of what embeds a write's images is (its child process, or the write
    # thread; nice +N, 0: as the searches'; batch-scheduled on Linux whatever N): an add then takes the CPU
    # the searches leave (search/writes.py, search/embed_process.py ``run_in_background``).
    write_nice: int = Field(5, ge=0, le=19)
    # Whether a write's uploads are embedded on a thread of the server (else, the default, by a child process
    # per model: search/embed_process.py, whose decode and model share neither the searches' GIL nor their
    # runtime threads).
    write_in_process: bool = False
    max_items_per_add: int = Field(32, ge=1, le=1000)
    max_batch_queries: int = Field(32, ge=1, le=1000)
    ingest_roots: list[str] = Field(default_factory=list)
    watch_seconds: float = Field(1.0, ge=0)

    @model_validator(mode="after")
    def _quantize_on_cpu(self) -> SearchConfig:
        if self.text_quantize and self.device != "cpu":
            raise ValueError("text_quantize (int8 dynamic quantisation) runs on the CPU only")
        if self.text_quantize and self.text_runtime not in ("auto", "torch"):
            raise ValueError(f"text_quantize is a torch path: it cannot be combined with text_runtime={self.text_runtime}")
        return self


class SearchService(QueryMixin):
    """Retrieval over the served models, what the REST API and the UI call: search (text → images,
    image → captions, image → images, text → captions, raw vectors, batches — each within a metadata
    filter and pageable: search/queries.py), two models side by side, items and their writes
    (``writes``: search/writes.py), thumbnails, query encoding, explanations.

    Build it with ``models`` (name → index directory), optional ``checkpoints`` (name → checkpoint, for
    an index whose checkpoint moved) and a ``SearchConfig`` (limits and tuning), then ``registry.load()``
    or ``registry.start_loading()``. Errors are ``search.errors`` types (BadRequest, NotFound, NotReady,
    …), each mapped to one HTTP status by the API. Every method is safe to call from many request threads
    at once; ``search_text_async`` is the event loop's way in."""

    def __init__(self, models: dict[str, str | Path], *, checkpoints: dict[str, str | Path] | None = None,
                 config: SearchConfig | None = None):
        self.config = config = config or SearchConfig()
        set_device(config.device)  # where the registries load the models (training.device)
        self.encoder = QueryEncoder(cache_size=config.text_cache, batching=config.text_batching,
                                    max_batch=config.max_text_batch, quantize=config.text_quantize,
                                    runtime=config.text_runtime, runtime_threads=config.text_runtime_threads)
        self.registry = ModelRegistry(models, checkpoints=checkpoints, verify=config.verify_index,
                                      on_loaded=self._loaded,
                                      images_roots=tuple(config.images_roots), writable=config.writable,
                                      ingest_roots=tuple(config.ingest_roots))
        self.masks = MaskCache()
        self.writes = ItemWrites(self, ingest_roots=tuple(config.ingest_roots), compact_after=config.compact_after,
                                   nice=config.write_nice, in_process=config.write_in_process)
        self.uploads = UploadDecoder(max_pixels=config.max_upload_pixels, max_concurrent=config.max_concurrent_decodes)
        self.thumbnails = Thumbnails(config.thumb_cache)
        self.explorer_rows = analysis.Explorer()
        self.explainer = Explainer(self.registry.get, self.encoder, self.encode_image_bytes, self.clean_query)

    def _loaded(self, entry: ModelEntry) -> None:
        """The registry's ``on_loaded``: the model's query encoding, and (writable) its write embedder, started."""
        self.encoder.attach(entry)
        self.writes.warm(entry)

    def close(self) -> None:
        """Stop the query encoder's batching thread and the write thread (after the write it runs)."""
        self.encoder.close()
        self.writes.close()

    # ---- models and dataset items -------------------------------------------------------------
    def models(self) -> list[ModelInfo]:
        """Every model given: the serving ones' info, a down one as ``status="down"`` with the reason
        (its paths redacted). NotReady while the models are still loading."""
        reg = self.registry
        if not reg.ready.is_set():
            raise NotReady("models are still loading")
        down = reg.health().down
        return [ModelInfo(name=n, status="down", detail=down.get(n)) if n not in reg.entries else self.model_info(n)
                for n in reg.names]

    def model_info(self, name: str) -> ModelInfo:
        """What the REST API and the UI show about model ``name``: dataset, split, counts, index factory,
        training summary, eval report and the manifest with the server's folders left out. NotFound /
        NotReady from the registry."""
        e = self.registry.get(name)
        mf = public_manifest(e.index.path, e.index.manifest)
        dataset, model = mf.get("dataset") or {}, mf.get("model") or {}
        return ModelInfo(name=name, dataset=dataset.get("name"), split=dataset.get("split"), counts=mf.get("counts"),
                         dim=mf.get("dim"), factory=mf.get("factory"), ground_truth=e.has_ground_truth,
                         image_search=e.model.image.backbone is not None, model=mf.get("model"),
                         caption_corpora=saw_caption_corpora(model.get("text_encoder"), model.get("loss")),
                         eval={k: v for k, v in e.report.items() if k != "meta"} if e.report else None, manifest=mf)

    def caption(self, name: str, caption_id: int) -> DatasetCaption:
        """Dataset caption ``caption_id`` of model ``name``'s index, with the image it describes. NotFound
        for an unknown id or model; NotReady while loading."""
        e = self.registry.get(name)
        pos = e.caption_row(caption_id)
        meta = e.index.captions.meta
        img = meta["image"][pos]
        return DatasetCaption(id=int(caption_id), text=meta["texts"][pos],
                              image_id=int(e.index.images.ids[img]) if img is not None and img >= 0 else None)

    def sample_captions(self, name: str, n: int = 20, seed: int = 0) -> list[DatasetCaption]:
        """``n`` distinct captions of model ``name``'s index drawn with ``seed`` (the same seed, the same
        captions) among its live ones (removed ones never), as example queries with ground truth."""
        side = self.registry.get(name).index.captions
        ids = side.ids
        dead = getattr(side.index, "dead", None)
        live = np.flatnonzero(~dead[: len(ids)]) if dead is not None else np.arange(len(ids))
        pick = np.random.default_rng(seed).choice(live, size=min(n, len(live)), replace=False) if len(live) else []
        return [self.caption(name, ids[int(i)]) for i in pick]

    # ---- encoding -----------------------------------------------------------------------------
    def clean_query(self, text: str) -> str:
        """``text`` with whitespace collapsed, within the service's query length (BadRequest otherwise)."""
        return clean_query(text, self.config.max_query_chars)

    def encode_text(self, name: str, text: str) -> np.ndarray:
        """Model ``name``'s embedding of ``text`` after cleaning (``clean_query``: BadRequest for an empty or
        over-long query), through the query cache and the batcher. Thread-safe."""
        return self.encoder.encode(self.registry.get(name), self.clean_query(text))

    def encode_image_bytes(self, name: str, data: bytes) -> np.ndarray:
        """Model ``name``'s embedding of an uploaded image's bytes, decoded under the pixel budget and the
        concurrent-decode limit: UnsupportedMediaType for what is not an accepted image, BadRequest for an
        empty or over-budget one, Busy when too many decode at once, Unsupported for a model without an
        image backbone. Thread-safe."""
        e = self.registry.get(name)
        x = self.uploads.tensor(e, data)
        with torch.inference_mode():
            return e.model.image(x.to(e.model.device)).float().cpu()[0].numpy()

    # ---- search -------------------------------------------------------------------------------
    def _check_k(self, k: int) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.config.max_k:
            raise BadRequest(f"k must be an integer in [1, {self.config.max_k}], got {k!r}")
        return k

    def _text_query(self, e: ModelEntry, query: str | None, caption_id: int | None) -> Query:
        if caption_id is not None:
            pos = e.caption_row(caption_id)
            meta = e.index.captions.meta
            model_text = model_texts(meta)[pos]
            q = Query(self.encoder.encode(e, model_text), QueryInfo(text=meta["texts"][pos], caption_id=int(caption_id)))
            if e.has_ground_truth:
                img = meta["image"][pos]
                q.ground_truth = [img] if img is not None and img >= 0 else []
                rel = e.relevance()  # cached by `ltd eval` for the rows of its generation only
                q.relevance = None if rel is None or pos >= rel.shape[0] else np.asarray(rel[pos], dtype=np.float32)
            return q
        if query is None:
            raise BadRequest("give a query text or a caption_id")
        text = self.clean_query(query)
        return Query(self.encoder.encode(e, text), QueryInfo(text=text))

    def _image_query(self, e: ModelEntry, image_id: int | None, image_bytes: bytes | None) -> Query:
        if image_id is not None:
            pos = e.image_row(image_id)
            q = Query(np.asarray(e.index.images.vectors[pos]),
                      QueryInfo(image_id=int(image_id), filename=e.index.images.meta["filenames"][pos]))
            if e.has_ground_truth:
                q.ground_truth = list(e.index.images.meta["captions"][pos])
                rel = e.relevance()
                q.relevance = None if rel is None or pos >= rel.shape[1] else np.asarray(rel[:, pos], dtype=np.float32)
            return q
        if image_bytes is None:
            raise BadRequest("give an image file or an image_id")
        return Query(self.encode_image_bytes(e.name, image_bytes), QueryInfo(upload=True))

    def search_text(self, name: str, *, query: str | None = None, caption_id: int | None = None,
                    k: int = 10, filter: dict | None = None, cursor: str | None = None) -> SearchResult:
        """Text → images. With ``caption_id`` the query is that dataset caption, and its ground truth
        (its image) and ROUGE-L relevance are attached. ``filter``: only images whose metadata match
        (search/filters.py); ``cursor``: the next page of an earlier answer (search/paging.py)."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        q = self._text_query(e, query, caption_id)
        return self._rank_images(name, e, q, RankRequest(k, "t2i", t0, filter, cursor))

    def _rank_images(self, name: str, e: ModelEntry, q: Query, req: RankRequest) -> SearchResult:
        meta = e.index.images.meta
        allowed, _ = self.filter_masks(e, req.filter, captions=False)
        return rank(name, e.index.images, q, lambda p: {"filename": meta["filenames"][p]}, req, allowed=allowed,
                    generation=e.generation)

    async def search_text_async(self, name: str, *, query: str | None = None, caption_id: int | None = None,
                                k: int = 10, filter: dict | None = None, cursor: str | None = None) -> SearchResult:
        """``search_text`` for an event loop, without a worker thread per request: the query is cleaned on
        the loop, encoded by the model's batcher thread (awaited), and ranked on the loop when the searched
        side is small enough to cost well under a millisecond (``RANK_ON_LOOP``), otherwise in a worker
        thread. Under load this drops two thread hand-offs per request and the contention of one request
        thread per query for the GIL (BENCHMARKS.md, "REST API load"). Dataset captions, filtered or paged
        queries, and models served without batching take ``search_text`` in a worker thread."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        fut = None
        if caption_id is None and query is not None and filter is None and cursor is None:
            text = self.clean_query(query)
            fut = self.encoder.submit(e, text)
        if fut is None:
            return await anyio.to_thread.run_sync(partial(self.search_text, name, query=query, caption_id=caption_id,
                                                          k=k, filter=filter, cursor=cursor))
        ranked = partial(self._rank_images, name, e, Query(await asyncio.wrap_future(fut), QueryInfo(text=text)),
                         RankRequest(k, "t2i", t0))
        side = e.index.images.index
        small = side.factory == "Flat" and side.ntotal * side.dim <= RANK_ON_LOOP
        return ranked() if small else await anyio.to_thread.run_sync(ranked)

    def search_image(self, name: str, *, image_id: int | None = None, image_bytes: bytes | None = None,
                     k: int = 10, filter: dict | None = None, cursor: str | None = None) -> SearchResult:
        """Image → captions. With ``image_id`` (a dataset image) ground truth and relevance are attached.
        ``filter`` applies to the metadata of each caption's image (captions of no image never match)."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        q = self._image_query(e, image_id, image_bytes)
        return self._rank_captions(name, e, q, RankRequest(k, "i2t", t0, filter, cursor))

    def _rank_captions(self, name: str, e: ModelEntry, q: Query, req: RankRequest) -> SearchResult:
        meta, img_ids = e.index.captions.meta, e.index.images.ids

        def fields(p: int) -> dict:
            im = meta["image"][p]
            return {"text": meta["texts"][p], "image_id": int(img_ids[im]) if im is not None and im >= 0 else None}

        _, allowed = self.filter_masks(e, req.filter)
        return rank(name, e.index.captions, q, fields, req, allowed=allowed, generation=e.generation)

    def compare(self, names: list[str], *, query: str | None = None, caption_id: int | None = None,
                image_id: int | None = None, image_bytes: bytes | None = None, k: int = 10,
                filter: dict | None = None) -> CompareResult:
        """One query, two models: both rankings (each restricted by ``filter``) and the ids both retrieved."""
        if len(names) != 2 or names[0] == names[1]:
            raise BadRequest("compare needs two different model names")
        for n in names:
            self.registry.get(n)
        if sum(x is not None for x in (query, caption_id, image_id, image_bytes)) != 1:
            raise BadRequest("give exactly one of: query, caption_id, image_id, image file")
        if query is not None or caption_id is not None:
            return compare_results("t2i", k, [self.search_text(n, query=query, caption_id=caption_id, k=k,
                                                               filter=filter) for n in names])
        return compare_results("i2t", k, [self.search_image(n, image_id=image_id, image_bytes=image_bytes, k=k,
                                                            filter=filter) for n in names])

    # ---- images -------------------------------------------------------------------------------
    def image_path(self, image_id: int, model: str | None = None) -> Path | ImageMember:
        """Only files that belong to a loaded index are served (ids, never paths, come in), and of
        those only image files inside the index's images folders (search/files.py); an image inside a
        webdataset shard is its byte range of the shard (``ImageMember``)."""
        entries = [self.registry.get(model)] if model else list(self.registry.entries.values())
        for e in entries:
            pos = e.image_pos.get(int(image_id))
            if pos is not None:
                try:  # resolved, and only inside the index's image folders (IndexDir.image_roots)
                    path = e.index.image_file(pos)
                except IndexDirError:
                    raise NotFound(f"image {image_id} is not served: its file lies outside the index's image "
                                   "folders") from None
                try:  # an image inside a webdataset shard: its recorded byte range of that (confined) shard
                    path = ImageMember.recorded(path, e.index.images.meta.get("members"), pos) or path
                except ValueError:
                    raise NotFound(f"image {image_id} is not served: the index records it malformed") from None
                return servable_image(path, f"image {image_id}")  # an image file, by extension and bytes
        raise NotFound(f"image id {image_id} is not in any loaded index" + (f" of model {model}" if model else ""))

    def open_image(self, path: Path | ImageMember, image_id: int):
        """``image_path``'s file (its shard, for a member) open for reading: only the file checked."""
        return open_served(path, f"image {image_id}")

    def thumbnail(self, image_id: int, size: int = 256, model: str | None = None) -> bytes:
        """JPEG bytes of dataset image ``image_id`` at most ``size`` pixels on a side, from the in-memory LRU.
        NotFound for an image that no served index holds (or ``model``'s, when given)."""
        return self.thumbnails.jpeg((model, int(image_id)), self.image_path(image_id, model), size)

    def thumbnail_file(self, image_id: int, size: int = 160, model: str | None = None) -> Path:
        """The thumbnail as a file in the service's private folder (what the UI's galleries serve), written
        once per image and size. NotFound as for ``thumbnail``."""
        return self.thumbnails.file((model, int(image_id)), self.image_path(image_id, model), size)

    # ---- explorer and training curves -----------------------------------------------------------
    def explorer(self, a: str, b: str, *, direction: str = "both", winner: str = "any", limit: int = 200) -> list[dict]:
        """Queries sorted by disagreement between two models (the data of `ltd compare`), cached."""
        get = self.registry.get
        return self.explorer_rows.rows(get(a), get(b), direction=direction, winner=winner, limit=limit)

    def training_figure(self, names: list[str], smooth: int = 5):
        """(figure or None, names without metrics): the training curves of these models, overlaid."""
        return analysis.training_figure([self.registry.get(n) for n in names], smooth)
