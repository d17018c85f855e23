"""The search service: one object, shared by the REST routers and the Gradio UI.

It holds a registry of named models (checkpoint + index directory, checked against each other),
encodes queries, searches FAISS and attaches ground truth when a query is a dataset item. Nothing
here knows about HTTP; errors are typed so that routers map them to 4xx answers.

Throughput: every method is safe to call from many threads at once (the server's thread pool).
Query texts go through an LRU cache of embeddings (switchable) and, on a miss, through a per-model
``TextBatcher`` that hands all queries waiting at that moment to the encoder in one call; FAISS
releases the GIL while it searches.
"""
from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from indexer.build import load_model
from indexer.evaluate import load_report
from indexer.index import IndexDir, IndexDirError, load_index_dir, read_manifest, relative_to_index, resolve_checkpoint
from indexer.metrics import query_metrics
from training.data.images import ImageError, load_image
from training.fsio import sha256_file
from training.models.dual_encoder import DualEncoder
from training.models.text_encoder import move_batch

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """A request the service cannot answer; ``status``/``error`` say how, ``extra`` adds fields."""

    status = 400
    error = "bad_request"

    def __init__(self, detail: str, **extra):
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class NotFound(ServiceError):
    status, error = 404, "not_found"


class NotReady(ServiceError):
    status, error = 503, "not_ready"


class Busy(ServiceError):
    status, error = 503, "busy"


class Unsupported(ServiceError):
    status, error = 422, "unsupported"


class UnsupportedMediaType(ServiceError):
    status, error = 415, "unsupported_media_type"


# Magic numbers of the formats load_image accepts; anything else is refused before decoding.
_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
          (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))


def sniff_image_type(data: bytes) -> str | None:
    """The image format named by the first bytes, or None when they are not an accepted image type."""
    for magic, fmt in _MAGIC:
        if data.startswith(magic):
            return fmt
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


class TextBatcher:
    """Groups concurrent encode requests into one encoder call.

    Opportunistic: a lone query is encoded at once (no waiting window); queries that arrive while
    the encoder is busy queue up and go together in the next call. One Python thread drives the
    encoder, so request threads do not fight over the GIL running the same small torch ops.
    """

    def __init__(self, encode: Callable[[list[str]], np.ndarray], *, max_batch: int = 64, name: str = ""):
        self._encode, self.max_batch = encode, max_batch
        self._pending: deque[tuple[str, Future]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self.calls = 0  # encoder calls
        self.items = 0  # queries encoded
        self._thread = threading.Thread(target=self._run, name=f"ltd-text-batcher-{name}", daemon=True)
        self._thread.start()

    def submit(self, text: str) -> Future:
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise NotReady("the service is shutting down")
            self._pending.append((text, fut))
            self._cv.notify()
        return fut

    def encode(self, text: str) -> np.ndarray:
        return self.submit(text).result()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                batch = [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]
            texts = list(dict.fromkeys(t for t, _ in batch))  # duplicates are encoded once
            try:
                vecs = self._encode(texts)
            except Exception as e:  # the callers see the error; the batcher keeps running
                for _, f in batch:
                    f.set_exception(e)
                continue
            row = {t: i for i, t in enumerate(texts)}
            for t, f in batch:
                f.set_result(vecs[row[t]].copy())
            self.calls += 1
            self.items += len(batch)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)


@dataclass
class ModelEntry:
    name: str
    index: IndexDir
    model: DualEncoder
    checkpoint: Path
    sha256: str
    report: dict | None
    run_dir: Path | None
    image_pos: dict[int, int] = field(default_factory=dict)  # image id → row
    caption_pos: dict[int, int] = field(default_factory=dict)  # caption id → row
    batcher: TextBatcher | None = None
    query_encoder: torch.nn.Module | None = None  # encodes query texts: model.text, or its int8 copy
    _relevance: np.ndarray | None = None

    @property
    def has_ground_truth(self) -> bool:
        return self.index.has_ground_truth

    def relevance(self) -> np.ndarray | None:
        """ROUGE-L relevance (captions × images) when the index has it cached (ltd eval computes it)."""
        if self._relevance is None and self.has_ground_truth:
            p = self.index.derived_path("relevance_rougeL")
            if p.is_file():
                self._relevance = np.load(p, mmap_mode="r")
        return self._relevance


@dataclass
class Hit:
    rank: int
    id: int
    score: float
    text: str | None = None  # captions
    filename: str | None = None  # images
    image_id: int | None = None  # captions: the image it describes (dataset indexes)
    ground_truth: bool | None = None
    relevance: float | None = None


@dataclass
class SearchResult:
    model: str
    query: dict
    hits: list[Hit]
    ground_truth_ids: list[int] | None
    metrics: dict | None  # first_rank, p@k, ndcg@k when ground truth is known
    took_ms: float


class SearchService:
    def __init__(self, models: dict[str, str | Path], *, device: str = "cpu", max_k: int = 1000,
                 thumb_cache: int = 2048, text_cache: int = 4096, text_batching: bool = True,
                 max_text_batch: int = 64, max_query_chars: int = 1000, max_upload_pixels: int = 16_000_000,
                 text_quantize: bool = False, checkpoints: dict[str, str | Path] | None = None,
                 verify_index: str = "hash", max_concurrent_decodes: int = 2):
        if not models:
            raise ValueError("no models given: pass at least one NAME=INDEX_DIR")
        if text_quantize and device != "cpu":
            raise ValueError("text_quantize (int8 dynamic quantisation) runs on the CPU only")
        self.specs = {n: Path(p) for n, p in models.items()}
        self.checkpoints = {n: Path(p) for n, p in (checkpoints or {}).items()}
        self.verify_index = verify_index
        self.device, self.max_k, self.max_query_chars = device, max_k, max_query_chars
        self.max_upload_pixels = max_upload_pixels
        # Decodes at once: each holds up to max_upload_pixels × 4 bytes while it runs.
        self._decode_slots = threading.BoundedSemaphore(max(1, max_concurrent_decodes))
        self.entries: dict[str, ModelEntry] = {}
        self.failed: dict[str, str] = {}  # model name → why it could not be loaded
        self.ready = threading.Event()  # set when loading has finished (every model loaded or failed)
        self.load_error: str | None = None  # set when no model could be loaded
        self._load_lock = threading.Lock()
        self._loader: threading.Thread | None = None
        self._thumbs: OrderedDict[tuple, bytes] = OrderedDict()
        self._thumb_cap = thumb_cache
        self._thumb_lock = threading.Lock()
        self._text_cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._text_cap = text_cache
        self._text_lock = threading.Lock()
        self.text_cache_hits = self.text_cache_misses = 0
        self.text_batching, self.max_text_batch = text_batching, max_text_batch
        self.text_quantize = text_quantize
        self._explorer: dict[tuple, list[dict]] = {}
        self.loaded_at: float | None = None

    @classmethod
    def from_settings(cls, settings) -> SearchService:
        """Build from ``app.settings.Settings`` (kept duck-typed: the service does not import the app)."""
        return cls(settings.models, device=settings.device, max_k=settings.max_k, thumb_cache=settings.thumb_cache,
                   text_cache=settings.text_cache, text_batching=settings.text_batching,
                   max_text_batch=settings.max_text_batch, max_query_chars=settings.max_query_chars,
                   max_upload_pixels=settings.max_upload_pixels, text_quantize=settings.text_quantize,
                   checkpoints=settings.checkpoints, verify_index=settings.verify_index,
                   max_concurrent_decodes=settings.max_concurrent_decodes)

    # ---- loading -------------------------------------------------------------------------------
    def load(self) -> None:
        """Load every model and index once; each index must have been built by its checkpoint.
        A model that fails is reported (``failed``) and the others are served; when none loads,
        ``load_error`` says why and a RuntimeError is raised. Safe to call more than once and from
        several threads (later calls return at once)."""
        with self._load_lock:
            if self.ready.is_set():
                if self.load_error:
                    raise RuntimeError(self.load_error)
                return
            for name, path in self.specs.items():
                if name in self.entries:
                    continue
                try:
                    self.entries[name] = self._load_one(name, path)
                    log.info("model %s ready: %s", name, path)
                except Exception as e:  # one broken model must not take the others down
                    reason = str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
                    self.failed[name] = reason
                    log.error("model %s cannot be served: %s", name, reason)
            if not self.entries:
                self.load_error = "no model could be loaded: " + "; ".join(f"{n}: {r}" for n, r in self.failed.items())
            self.loaded_at = time.time()
            self.ready.set()
            if self.load_error:
                raise RuntimeError(self.load_error)

    def start_loading(self) -> threading.Thread:
        """Load in a background thread (``ready`` is set when done, ``load_error`` when it failed)."""
        if self._loader is None or not (self._loader.is_alive() or self.ready.is_set()):
            self._loader = threading.Thread(target=self._load_quietly, name="ltd-model-loader", daemon=True)
            self._loader.start()
        return self._loader

    def _load_quietly(self) -> None:
        try:
            self.load()
        except Exception:  # kept in load_error and logged by load(); /api/health reports it
            pass

    @property
    def status(self) -> str:
        """``loading``; then ``ok`` (every model serves), ``degraded`` (some failed) or ``error`` (none loaded)."""
        if not self.ready.is_set():
            return "loading"
        if self.load_error is not None:
            return "error"
        return "degraded" if self.failed else "ok"

    def close(self) -> None:
        """Stop the batcher threads (the entries stay usable without batching)."""
        for e in list(self.entries.values()):
            if e.batcher is not None:
                b, e.batcher = e.batcher, None
                b.close()

    def _load_one(self, name: str, path: Path) -> ModelEntry:
        manifest = read_manifest(path)
        ckpt = resolve_checkpoint(path, manifest, self.checkpoints.get(name))
        sha = sha256_file(ckpt)
        if sha != manifest.get("checkpoint_sha256"):  # before the file is even unpickled
            raise IndexDirError(f"{ckpt} is not the checkpoint that built {path} (sha256 {sha[:12]}…, the manifest "
                                f"says {str(manifest.get('checkpoint_sha256'))[:12]}…); rebuild the index with "
                                "`ltd index` or serve it with the checkpoint that built it")
        ix = load_index_dir(path, checkpoint_sha256=sha, verify=self.verify_index)
        lm = load_model(ckpt, self.device)
        lm.model.eval()  # once: encoding calls the submodules directly, from many threads
        run_dir = ckpt.parent if (ckpt.parent / "metrics.jsonl").is_file() else None
        entry = ModelEntry(name=name, index=ix, model=lm.model, checkpoint=ckpt, sha256=lm.sha256,
                           report=load_report(path, ix.generation), run_dir=run_dir,
                           image_pos={int(i): k for k, i in enumerate(ix.images.ids)},
                           caption_pos={int(i): k for k, i in enumerate(ix.captions.ids)})
        entry.query_encoder = self._quantized(lm.model.text) if self.text_quantize else lm.model.text
        if self.text_batching:
            entry.batcher = TextBatcher(lambda texts, e=entry: self._encode_batch(e, texts),
                                        max_batch=self.max_text_batch, name=name)
        return entry

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    @property
    def default_name(self) -> str:
        """The first model that serves (the first one given while loading)."""
        return next((n for n in self.names if n in self.entries), self.names[0])

    @property
    def default_name_with_ground_truth(self) -> str:
        """The first serving model whose index is a dataset split (queries there have ground truth)."""
        return next((n for n, e in self.entries.items() if e.has_ground_truth), self.default_name)

    def get(self, name: str | None) -> ModelEntry:
        if name is None:
            name = self.default_name
        if name not in self.specs:
            raise NotFound(f"unknown model {name!r}; valid models: {', '.join(self.names)}", valid_models=self.names)
        if name in self.failed:
            raise NotReady(f"model {name} is down: {self.failed[name]}")
        if name not in self.entries:
            raise NotReady("models are still loading")
        return self.entries[name]

    def _check_k(self, k: int) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.max_k:
            raise ServiceError(f"k must be an integer in [1, {self.max_k}], got {k!r}")
        return k

    # ---- info ----------------------------------------------------------------------------------
    def model_info(self, name: str) -> dict:
        e = self.get(name)
        mf = public_manifest(e.index.path, e.index.manifest)
        summary = None
        if e.report:
            summary = {k: v for k, v in e.report.items() if k != "meta"}
        return {"name": name, "dataset": (mf.get("dataset") or {}).get("name"),
                "split": (mf.get("dataset") or {}).get("split"), "counts": mf.get("counts"),
                "dim": mf.get("dim"), "factory": mf.get("factory"), "ground_truth": e.has_ground_truth,
                "image_search": e.model.image.backbone is not None, "model": mf.get("model"),
                "eval": summary, "manifest": mf}

    def caption(self, name: str, caption_id: int) -> dict:
        e = self.get(name)
        pos = e.caption_pos.get(int(caption_id))
        if pos is None:
            raise NotFound(f"caption id {caption_id} is not in model {name}'s index")
        meta = e.index.captions.meta
        img = meta["image"][pos]
        return {"id": int(caption_id), "text": meta["texts"][pos],
                "image_id": int(e.index.images.ids[img]) if img is not None and img >= 0 else None}

    def sample_captions(self, name: str, n: int = 20, seed: int = 0) -> list[dict]:
        e = self.get(name)
        ids = e.index.captions.ids
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(ids), size=min(n, len(ids)), replace=False) if ids else []
        return [self.caption(name, ids[int(i)]) for i in pick]

    # ---- encoding ------------------------------------------------------------------------------
    def clean_query(self, text: str) -> str:
        """Drop control characters, collapse whitespace; refuse empty and over-long queries and text
        that is not valid Unicode."""
        try:
            str(text).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate such as "\ud800" (valid JSON, not valid text)
            raise ServiceError("the query contains invalid Unicode (an unpaired surrogate)") from None
        q = " ".join("".join(ch for ch in str(text) if ch.isprintable() or ch.isspace()).split())
        if not q:
            raise ServiceError("query is empty (after trimming whitespace)")
        if len(q) > self.max_query_chars:
            raise ServiceError(f"query is {len(q)} characters long; the limit is {self.max_query_chars}")
        return q

    @staticmethod
    def _quantized(text: torch.nn.Module) -> torch.nn.Module:
        """An int8 dynamically quantised copy of a text encoder (GRU and Linear weights); CPU only."""
        import warnings

        with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(text, {torch.nn.GRU, torch.nn.Linear}, dtype=torch.qint8)

    @staticmethod
    def _encode_batch(e: ModelEntry, texts: list[str]) -> np.ndarray:
        """(n, E) normalised query embeddings; the model is in eval mode since loading."""
        enc = e.query_encoder if e.query_encoder is not None else e.model.text
        with torch.inference_mode():
            batch = move_batch(enc.prepare(texts), e.model.device)
            return enc(batch).float().cpu().numpy()

    def _embed_text(self, name: str, text: str) -> np.ndarray:
        """Embedding of an already cleaned text: cache, then batcher (or a direct encoder call)."""
        key = (name, text)
        if self._text_cap:
            with self._text_lock:
                vec = self._text_cache.get(key)
                if vec is not None:
                    self._text_cache.move_to_end(key)
                    self.text_cache_hits += 1
                    return vec
                self.text_cache_misses += 1
        e = self.entries[name]
        b = e.batcher
        vec = b.encode(text) if b is not None else self._encode_batch(e, [text])[0]
        vec.setflags(write=False)  # shared through the cache
        if self._text_cap:
            with self._text_lock:
                self._text_cache[key] = vec
                while len(self._text_cache) > self._text_cap:
                    self._text_cache.popitem(last=False)
        return vec

    def text_cache_info(self) -> dict:
        b = [e.batcher for e in self.entries.values() if e.batcher is not None]
        return {"capacity": self._text_cap, "size": len(self._text_cache), "hits": self.text_cache_hits,
                "misses": self.text_cache_misses, "batching": self.text_batching,
                "encoder_calls": sum(x.calls for x in b), "encoded_queries": sum(x.items for x in b)}

    def clear_text_cache(self) -> None:
        with self._text_lock:
            self._text_cache.clear()
            self.text_cache_hits = self.text_cache_misses = 0

    def encode_text(self, name: str, text: str) -> np.ndarray:
        self.get(name)
        return self._embed_text(name, self.clean_query(text))

    def encode_image_bytes(self, name: str, data: bytes) -> np.ndarray:
        e = self.get(name)
        if not data:
            raise ServiceError("the uploaded file is empty")
        if sniff_image_type(data) is None:
            raise UnsupportedMediaType("the upload is not an image of an accepted type "
                                       "(JPEG, PNG, WebP, BMP, GIF, TIFF)")
        if e.model.image.backbone is None:
            raise Unsupported(f"model {name} was trained on precomputed features and has no image backbone; "
                              "search with a dataset image id instead")
        min_side = 2 * e.model.image.backbone.preprocess.resize
        if not self._decode_slots.acquire(timeout=30):
            raise Busy("too many image uploads are being decoded at once; try again shortly")
        try:
            # A JPEG decodes at reduced scale (short side ≥ twice the model's input size), any other
            # format within the pixel budget: both bound the memory one request can take.
            img = load_image(data, name="upload", max_pixels=self.max_upload_pixels, min_side=min_side)
            big = img.width * img.height >= 4_000_000
            x = e.model.image.prepare([img])
            del img
        except ImageError as err:
            raise ServiceError(str(err)) from None
        finally:
            self._decode_slots.release()
        if big:
            release_free_memory()
        with torch.inference_mode():
            return e.model.image(x.to(e.model.device)).float().cpu()[0].numpy()

    # ---- search --------------------------------------------------------------------------------
    @staticmethod
    def _gt_metrics(gt: list[int], rel_row: np.ndarray | None, k: int, scores_all: np.ndarray) -> dict:
        """Rank of the first ground-truth item, P@k and nDCG@k at the requested k (and at the report's
        fixed cut-offs P@5 / nDCG@25). nDCG uses the ROUGE-L relevance when the index has it cached,
        binary ground truth otherwise (``ndcg_relevance`` says which)."""
        n = len(scores_all)
        pos = [np.asarray(gt, dtype=np.int64)]
        if rel_row is None:
            rel, kind = np.zeros(n, dtype=np.float32), "binary"
            rel[pos[0]] = 1.0
        else:
            rel, kind = rel_row, "rougeL"
        kk, p5, n25 = min(k, n), min(5, n), min(25, n)

        def run(p_at: int, ndcg_k: int) -> dict:
            return query_metrics(scores_all[None, :], pos, relevance=rel[None, :], p_at=p_at, ndcg_k=ndcg_k)

        m = run(kk, kk)
        out = {"first_gt_rank": int(m["first_rank"][0]), "k": kk, "p@k": float(m[f"p@{kk}"][0]),
               "ndcg@k": float(m[f"ndcg@{kk}"][0]), "ndcg_relevance": kind}
        if (p5, n25) != (kk, kk):
            m = run(p5, n25)
        out[f"p@{p5}"], out[f"ndcg@{n25}"] = float(m[f"p@{p5}"][0]), float(m[f"ndcg@{n25}"][0])
        return out

    def search_text(self, name: str, *, query: str | None = None, caption_id: int | None = None,
                    k: int = 10) -> SearchResult:
        """Text → images. With ``caption_id`` the query is that dataset caption, and ground truth
        (its image) and ROUGE-L relevance are attached."""
        t0 = time.perf_counter()
        e = self.get(name)
        k = self._check_k(k)
        gt, rel_row, qinfo = None, None, {}
        if caption_id is not None:
            c = self.caption(name, caption_id)
            query = c["text"]
            cpos = e.caption_pos[int(caption_id)]
            qinfo = {"caption_id": int(caption_id), "text": query}
            if e.has_ground_truth:
                gimg = e.index.captions.meta["image"][cpos]
                gt = [gimg] if gimg is not None and gimg >= 0 else []
                rel = e.relevance()
                rel_row = None if rel is None else np.asarray(rel[cpos], dtype=np.float32)
            model_text = (e.index.captions.meta.get("model_texts") or e.index.captions.meta["texts"])[cpos]
            vec = self._embed_text(name, model_text)
        elif query is not None:
            query = self.clean_query(query)
            qinfo = {"text": query}
            vec = self._embed_text(name, query)
        else:
            raise ServiceError("give a query text or a caption_id")
        scores, ids = e.index.images.index.search(vec[None, :], k)
        ranked = [int(i) for i in ids[0] if i >= 0]
        meta = e.index.images.meta
        hits = [Hit(rank=r + 1, id=int(meta["ids"][p]), score=float(scores[0][r]), filename=meta["filenames"][p],
                    ground_truth=(p in gt) if gt is not None else None,
                    relevance=None if rel_row is None else float(rel_row[p])) for r, p in enumerate(ranked)]
        metrics = None
        if gt:
            all_scores = np.asarray(e.index.images.vectors) @ vec
            metrics = self._gt_metrics(gt, rel_row, k, all_scores)
        return SearchResult(name, qinfo, hits, [int(meta["ids"][g]) for g in gt] if gt else None, metrics,
                            (time.perf_counter() - t0) * 1000)

    def search_image(self, name: str, *, image_id: int | None = None, image_bytes: bytes | None = None,
                     k: int = 10) -> SearchResult:
        """Image → captions. With ``image_id`` (a dataset image) ground truth and relevance are attached."""
        t0 = time.perf_counter()
        e = self.get(name)
        k = self._check_k(k)
        gt, rel_col, qinfo = None, None, {}
        if image_id is not None:
            ipos = e.image_pos.get(int(image_id))
            if ipos is None:
                raise NotFound(f"image id {image_id} is not in model {name}'s index")
            vec = np.asarray(e.index.images.vectors[ipos])
            qinfo = {"image_id": int(image_id), "filename": e.index.images.meta["filenames"][ipos]}
            if e.has_ground_truth:
                gt = list(e.index.images.meta["captions"][ipos])
                rel = e.relevance()
                rel_col = None if rel is None else np.asarray(rel[:, ipos], dtype=np.float32)
        elif image_bytes is not None:
            vec = self.encode_image_bytes(name, image_bytes)
            qinfo = {"upload": True}
        else:
            raise ServiceError("give an image file or an image_id")
        scores, ids = e.index.captions.index.search(vec[None, :], k)
        ranked = [int(i) for i in ids[0] if i >= 0]
        meta = e.index.captions.meta
        img_ids = e.index.images.ids
        hits = []
        for r, p in enumerate(ranked):
            im = meta["image"][p]
            hits.append(Hit(rank=r + 1, id=int(meta["ids"][p]), score=float(scores[0][r]), text=meta["texts"][p],
                            image_id=int(img_ids[im]) if im is not None and im >= 0 else None,
                            ground_truth=(p in gt) if gt is not None else None,
                            relevance=None if rel_col is None else float(rel_col[p])))
        metrics = None
        if gt:
            all_scores = np.asarray(e.index.captions.vectors) @ vec
            metrics = self._gt_metrics(gt, rel_col, k, all_scores)
        return SearchResult(name, qinfo, hits, [int(meta["ids"][g]) for g in gt] if gt else None, metrics,
                            (time.perf_counter() - t0) * 1000)

    def compare(self, names: list[str], *, query: str | None = None, caption_id: int | None = None,
                image_id: int | None = None, image_bytes: bytes | None = None, k: int = 10) -> dict:
        if len(names) != 2 or names[0] == names[1]:
            raise ServiceError("compare needs two different model names")
        for n in names:
            self.get(n)
        if sum(x is not None for x in (query, caption_id, image_id, image_bytes)) != 1:
            raise ServiceError("give exactly one of: query, caption_id, image_id, image file")
        if query is not None or caption_id is not None:
            res = [self.search_text(n, query=query, caption_id=caption_id, k=k) for n in names]
        else:
            res = [self.search_image(n, image_id=image_id, image_bytes=image_bytes, k=k) for n in names]
        a, b = ({h.id for h in r.hits} for r in res)
        return {"direction": "t2i" if (query is not None or caption_id is not None) else "i2t",
                "results": res, "overlap": len(a & b), "overlap_ids": sorted(a & b), "k": k}

    # ---- images --------------------------------------------------------------------------------
    def image_path(self, image_id: int, model: str | None = None) -> Path:
        """Only files that belong to a loaded index are served (ids, never paths, come in)."""
        entries = [self.get(model)] if model else [self.get(n) for n in self.names]
        for e in entries:
            pos = e.image_pos.get(int(image_id))
            if pos is not None:
                path = Path(e.index.images.meta["paths"][pos])
                if not path.is_file():
                    raise NotFound(f"image {image_id} is in the index, but its file is missing on the server")
                return path
        raise NotFound(f"image id {image_id} is not in any loaded index" + (f" of model {model}" if model else ""))

    def thumbnail(self, image_id: int, size: int = 256, model: str | None = None) -> bytes:
        size = max(32, min(int(size), 1024))
        key = (model, int(image_id), size)
        with self._thumb_lock:
            if key in self._thumbs:
                self._thumbs.move_to_end(key)
                return self._thumbs[key]
        path = self.image_path(image_id, model)
        try:
            img = load_image(path)
        except ImageError as err:
            raise NotFound(f"image {image_id} cannot be read: {err}") from None
        img.thumbnail((size, size))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=85)
        data = buf.getvalue()
        with self._thumb_lock:
            self._thumbs[key] = data
            while len(self._thumbs) > self._thumb_cap:
                self._thumbs.popitem(last=False)
        return data

    # ---- explorer and training curves ------------------------------------------------------------
    def explorer(self, a: str, b: str, *, direction: str = "both", winner: str = "any", limit: int = 200) -> list[dict]:
        """Queries sorted by disagreement between two models (the data of `ltd compare`), cached."""
        from indexer.compare import compare_indexes

        ea, eb = self.get(a), self.get(b)
        if a == b:
            raise ServiceError("the explorer needs two different models")
        key = (a, b)
        if key not in self._explorer:
            rel = ea.relevance() is not None
            self._explorer[key] = compare_indexes(ea.index, eb.index, relevance=rel)
        rows = self._explorer[key]
        if direction in ("t2i", "i2t"):
            rows = [r for r in rows if r["direction"] == direction]
        if winner in ("a", "b", "tie"):
            rows = [r for r in rows if r["winner"] == winner]
        return rows[:limit]

    def training_metrics(self, name: str) -> list[dict]:
        e = self.get(name)
        if e.run_dir is None:
            return []
        path = e.run_dir / "metrics.jsonl"
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc), so a burst of large decodes does not leave
    the server's resident size at its peak."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def public_manifest(index_path: Path, manifest: dict) -> dict:
    """The manifest as the API shows it: no absolute paths of the server's file system (paths are
    given relative to the served index directory)."""
    def rel(v: object) -> object:
        return relative_to_index(index_path, v) if isinstance(v, str) and v.startswith("/") else v

    out = {k: v for k, v in manifest.items() if k not in ("checkpoint", "files")}
    out["checkpoint"] = manifest.get("checkpoint_relative") or rel(manifest.get("checkpoint"))
    out["dataset"] = {k: rel(v) for k, v in (manifest.get("dataset") or {}).items()}
    out["skipped"] = [{**s, "file": rel(s.get("file"))} for s in manifest.get("skipped", [])]
    out["appends"] = [{k: rel(v) for k, v in a.items()} for a in manifest.get("appends", [])]
    return out


def result_to_dict(r: SearchResult) -> dict:
    return {"model": r.model, "query": r.query, "took_ms": round(r.took_ms, 3), "ground_truth_ids": r.ground_truth_ids,
            "metrics": r.metrics, "results": [h.__dict__ for h in r.hits]}


def decode_upload_check(data: bytes, max_bytes: int) -> None:
    if len(data) == 0:
        raise ServiceError("the uploaded file is empty")
    if len(data) > max_bytes:
        raise ServiceError(f"upload of {len(data):,} bytes exceeds the limit of {max_bytes:,} bytes")