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

from indexer.vector_index import IndexDirError
from search import analysis
from search.encoding import QueryEncoder, clean_query
from search.errors import BadRequest, NotFound
from search.explainer import Explainer
from search.files import servable_image
from search.media import Thumbnails, UploadDecoder
from search.ranking import Query, compare_results, rank
from search.registry import ModelEntry, ModelRegistry, public_manifest
from search.results import CompareResult, DatasetCaption, ModelInfo, QueryInfo, SearchResult
from training.choices import TextRuntime, VerifyIndex
from training.config_base import Section
from training.packaged_models import saw_caption_corpora

# Largest searched side (vectors × dimensions) that ``search_text_async`` ranks on the event loop: FAISS took
# 0.2 ms for one query against 1,000 × 1,024 (~2^20) on the 2-core Xeon, and its hits another 0.05 ms;
# larger sides, and approximate indexes of any size, pay a worker-thread hand-off but never stall the loop.
RANK_ON_LOOP = 1 << 21


class SearchConfig(Section):
    """Limits and tuning of the service. The REST settings (app/api/settings.py) inherit these fields,
    so each is declared once and can be set from the flags or the ``LTD_*`` environment."""

    device: str = "cpu"
    max_k: int = Field(1000, ge=1)
    max_query_chars: int = Field(1000, ge=1)
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

    @model_validator(mode="after")
    def _quantize_on_cpu(self) -> SearchConfig:
        if self.text_quantize and self.device != "cpu":
            raise ValueError("text_quantize (int8 dynamic quantisation) runs on the CPU only")
        if self.text_quantize and self.text_runtime not in ("auto", "torch"):
            raise ValueError(f"text_quantize is a torch path: it cannot be combined with text_runtime={self.text_runtime}")
        return self


class SearchService:
    def __init__(self, models: dict[str, str | Path], *, checkpoints: dict[str, str | Path] | None = None,
                 config: SearchConfig | None = None):
        self.config = config = config or SearchConfig()
        self.encoder = QueryEncoder(cache_size=config.text_cache, batching=config.text_batching,
                                    max_batch=config.max_text_batch, quantize=config.text_quantize,
                                    runtime=config.text_runtime, runtime_threads=config.text_runtime_threads)
        self.registry = ModelRegistry(models, checkpoints=checkpoints, device=config.device,
                                      verify=config.verify_index, on_loaded=self.encoder.attach)
        self.uploads = UploadDecoder(max_pixels=config.max_upload_pixels, max_concurrent=config.max_concurrent_decodes)
        self.thumbnails = Thumbnails(config.thumb_cache)
        self.explorer_rows = analysis.Explorer()
        self.explainer = Explainer(self.registry.get, self.encoder, self.encode_image_bytes, self.clean_query)

    def close(self) -> None:
        """Stop the query encoder's batching thread."""
        self.encoder.close()

    # ---- models and dataset items -------------------------------------------------------------
    def model_info(self, name: str) -> ModelInfo:
        e = self.registry.get(name)
        mf = public_manifest(e.index.path, e.index.manifest)
        dataset, model = mf.get("dataset") or {}, mf.get("model") or {}
        return ModelInfo(name=name, dataset=dataset.get("name"), split=dataset.get("split"), counts=mf.get("counts"),
                         dim=mf.get("dim"), factory=mf.get("factory"), ground_truth=e.has_ground_truth,
                         image_search=e.model.image.backbone is not None, model=mf.get("model"),
                         caption_corpora=saw_caption_corpora(model.get("text_encoder"), model.get("loss")),
                         eval={k: v for k, v in e.report.items() if k != "meta"} if e.report else None, manifest=mf)

    def caption(self, name: str, caption_id: int) -> DatasetCaption:
        e = self.registry.get(name)
        pos = e.caption_row(caption_id)
        meta = e.index.captions.meta
        img = meta["image"][pos]
        return DatasetCaption(id=int(caption_id), text=meta["texts"][pos],
                              image_id=int(e.index.images.ids[img]) if img is not None and img >= 0 else None)

    def sample_captions(self, name: str, n: int = 20, seed: int = 0) -> list[DatasetCaption]:
        ids = self.registry.get(name).index.captions.ids
        pick = np.random.default_rng(seed).choice(len(ids), size=min(n, len(ids)), replace=False) if ids else []
        return [self.caption(name, ids[int(i)]) for i in pick]

    # ---- encoding -----------------------------------------------------------------------------
    def clean_query(self, text: str) -> str:
        """``text`` with whitespace collapsed, within the service's query length (BadRequest otherwise)."""
        return clean_query(text, self.config.max_query_chars)

    def encode_text(self, name: str, text: str) -> np.ndarray:
        return self.encoder.encode(self.registry.get(name), self.clean_query(text))

    def encode_image_bytes(self, name: str, data: bytes) -> np.ndarray:
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
            model_text = (meta.get("model_texts") or meta["texts"])[pos]
            q = Query(self.encoder.encode(e, model_text), QueryInfo(text=meta["texts"][pos], caption_id=int(caption_id)))
            if e.has_ground_truth:
                img = meta["image"][pos]
                q.ground_truth = [img] if img is not None and img >= 0 else []
                rel = e.relevance()
                q.relevance = None if rel is None else np.asarray(rel[pos], dtype=np.float32)
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
                q.relevance = None if rel is None else np.asarray(rel[:, pos], dtype=np.float32)
            return q
        if image_bytes is None:
            raise BadRequest("give an image file or an image_id")
        return Query(self.encode_image_bytes(e.name, image_bytes), QueryInfo(upload=True))

    def search_text(self, name: str, *, query: str | None = None, caption_id: int | None = None,
                    k: int = 10) -> SearchResult:
        """Text → images. With ``caption_id`` the query is that dataset caption, and its ground truth
        (its image) and ROUGE-L relevance are attached."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        return self._rank_images(name, e, self._text_query(e, query, caption_id), k, t0)

    def _rank_images(self, name: str, e: ModelEntry, q: Query, k: int, t0: float) -> SearchResult:
        meta = e.index.images.meta
        return rank(name, e.index.images, q, k, lambda p: {"filename": meta["filenames"][p]}, direction="t2i", t0=t0)

    async def search_text_async(self, name: str, *, query: str | None = None, caption_id: int | None = None,
                                k: int = 10) -> SearchResult:
        """``search_text`` for an event loop, without a worker thread per request: the query is cleaned on
        the loop, encoded by the model's batcher thread (awaited), and ranked on the loop when the searched
        side is small enough to cost well under a millisecond (``RANK_ON_LOOP``), otherwise in a worker
        thread. Under load this drops two thread hand-offs per request and the contention of one request
        thread per query for the GIL (BENCHMARKS.md, "REST API load"). Dataset captions, and models
        served without batching, take ``search_text`` in a worker thread."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        fut = None
        if caption_id is None and query is not None:
            text = self.clean_query(query)
            fut = self.encoder.submit(e, text)
        if fut is None:
            return await anyio.to_thread.run_sync(partial(self.search_text, name, query=query, caption_id=caption_id, k=k))
        ranked = partial(self._rank_images, name, e, Query(await asyncio.wrap_future(fut), QueryInfo(text=text)), k, t0)
        side = e.index.images.index
        small = side.factory == "Flat" and side.ntotal * side.dim <= RANK_ON_LOOP
        return ranked() if small else await anyio.to_thread.run_sync(ranked)

    def search_image(self, name: str, *, image_id: int | None = None, image_bytes: bytes | None = None,
                     k: int = 10) -> SearchResult:
        """Image → captions. With ``image_id`` (a dataset image) ground truth and relevance are attached."""
        t0 = time.perf_counter()
        e, k = self.registry.get(name), self._check_k(k)
        meta, img_ids = e.index.captions.meta, e.index.images.ids

        def fields(p: int) -> dict:
            im = meta["image"][p]
            return {"text": meta["texts"][p], "image_id": int(img_ids[im]) if im is not None and im >= 0 else None}

        return rank(name, e.index.captions, self._image_query(e, image_id, image_bytes), k, fields,
                    direction="i2t", t0=t0)

    def compare(self, names: list[str], *, query: str | None = None, caption_id: int | None = None,
                image_id: int | None = None, image_bytes: bytes | None = None, k: int = 10) -> CompareResult:
        """One query, two models: both rankings and the ids both retrieved."""
        if len(names) != 2 or names[0] == names[1]:
            raise BadRequest("compare needs two different model names")
        for n in names:
            self.registry.get(n)
        if sum(x is not None for x in (query, caption_id, image_id, image_bytes)) != 1:
            raise BadRequest("give exactly one of: query, caption_id, image_id, image file")
        if query is not None or caption_id is not None:
            return compare_results("t2i", k, [self.search_text(n, query=query, caption_id=caption_id, k=k)
                                              for n in names])
        return compare_results("i2t", k, [self.search_image(n, image_id=image_id, image_bytes=image_bytes, k=k)
                                          for n in names])

    # ---- images -------------------------------------------------------------------------------
    def image_path(self, image_id: int, model: str | None = None) -> Path:
        """Only files that belong to a loaded index are served (ids, never paths, come in), and of
        those only image files inside the index's images folders (search/files.py)."""
        entries = [self.registry.get(model)] if model else list(self.registry.entries.values())
        for e in entries:
            pos = e.image_pos.get(int(image_id))
            if pos is not None:
                try:  # resolved, and only inside the index's image folders (IndexDir.image_roots)
                    path = e.index.image_file(pos)
                except IndexDirError:
                    raise NotFound(f"image {image_id} is not served: its file lies outside the index's image "
                                   "folders") from None
                return servable_image(path, f"image {image_id}")  # an image file, by extension and bytes
        raise NotFound(f"image id {image_id} is not in any loaded index" + (f" of model {model}" if model else ""))

    def thumbnail(self, image_id: int, size: int = 256, model: str | None = None) -> bytes:
        return self.thumbnails.jpeg((model, int(image_id)), self.image_path(image_id, model), size)

    def thumbnail_file(self, image_id: int, size: int = 160, model: str | None = None) -> Path:
        return self.thumbnails.file((model, int(image_id)), self.image_path(image_id, model), size)

    # ---- explorer and training curves -----------------------------------------------------------
    def explorer(self, a: str, b: str, *, direction: str = "both", winner: str = "any", limit: int = 200) -> list[dict]:
        """Queries sorted by disagreement between two models (the data of `ltd compare`), cached."""
        get = self.registry.get
        return self.explorer_rows.rows(get(a), get(b), direction=direction, winner=winner, limit=limit)

    def training_figure(self, names: list[str], smooth: int = 5):
        """(figure or None, names without metrics): the training curves of these models, overlaid."""
        return analysis.training_figure([self.registry.get(n) for n in names], smooth)
