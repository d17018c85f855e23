"""Query texts → embeddings: cleaning, an LRU cache, batching of concurrent queries, optional int8.

Throughput: query texts go through an LRU cache of embeddings (switchable) and, on a miss, through a
per-model ``TextBatcher`` that hands every query waiting at that moment to the encoder in one call.
Everything here is safe to call from many request threads at once.
"""
from __future__ import annotations

import logging
import threading
import unicodedata
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

import numpy as np
import torch

from search.errors import BadRequest, NotReady
from search.registry import ModelEntry
from training.device import to_device
from training.models.text_encoder import SBERTTextEncoder
from training.models.text_runtimes import SentenceRuntime

log = logging.getLogger(__name__)


def clean_query(text: str, max_chars: int) -> str:
    """Drop control characters (NUL, escape, …) and collapse whitespace; refuse empty or over-long queries and text
    that is not valid Unicode."""
    try:
        str(text).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800" (valid JSON, not valid text)
        raise BadRequest("the query contains invalid Unicode (an unpaired surrogate)") from None
    q = " ".join("".join(ch for ch in str(text) if ch.isspace() or unicodedata.category(ch) != "Cc").split())
    if not q:
        raise BadRequest("query is empty (after trimming whitespace)")
    if len(q) > max_chars:
        raise BadRequest(f"query is {len(q)} characters long; the limit is {max_chars}")
    return q


class TextBatcher:
    """Groups concurrent encode requests into one encoder call.

    Opportunistic: a lone query is encoded at once on its caller's thread (no waiting window, no
    hand-off: at concurrency 1 that hop was a third of the API's overhead); queries that arrive while
    the encoder is busy queue up and go together in the next call, from the batcher thread. One
    thread at a time drives the encoder, so request threads do not fight over the GIL running the
    same small ops.
    """

    def __init__(self, encode: Callable[[list[str]], np.ndarray], *, max_batch: int = 64, name: str = ""):
        self._encode, self.max_batch = encode, max_batch
        self._pending: deque[tuple[str, Future]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._busy = False  # the encoder is running (on the batcher thread or inline on a caller's)
        self.calls = 0  # encoder calls
        self.items = 0  # queries encoded
        self._thread = threading.Thread(target=self._run, name=f"ltd-text-batcher-{name}", daemon=True)
        self._thread.start()

    def submit(self, text: str) -> Future:
        """Queue ``text`` for the batcher thread; the future resolves to its embedding (or the encoder's
        error). NotReady once the batcher is closed. Thread-safe."""
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise NotReady("the service is shutting down")
            self._pending.append((text, fut))
            self._cv.notify()
        return fut

    def encode(self, text: str) -> np.ndarray:
        """The embedding of ``text``: encoded inline on the calling thread when the encoder is idle, else
        queued and awaited with the next batch. NotReady once the batcher is closed. Thread-safe."""
        with self._cv:
            if self._closed:
                raise NotReady("the service is shutting down")
            inline = not self._busy and not self._pending
            self._busy = self._busy or inline
        if not inline:
            return self.submit(text).result()
        try:
            vec = self._encode([text])[0].copy()
        finally:
            self._done(1)
        return vec

    def _done(self, n: int) -> None:
        with self._cv:
            self._busy = False
            self.calls += 1
            self.items += n
            self._cv.notify()  # queries that queued meanwhile go next

    def _run(self) -> None:
        while True:
            with self._cv:
                while (not self._pending or self._busy) and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                batch = [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]
                self._busy = True
            texts = list(dict.fromkeys(t for t, _ in batch))  # duplicates are encoded once
            try:
                vecs = self._encode(texts)
            except Exception as e:  # the callers see the error; the batcher keeps running
                for _, f in batch:
                    f.set_exception(e)
                vecs = None
            finally:
                self._done(len(batch))
            if vecs is not None:
                row = {t: i for i, t in enumerate(texts)}
                for t, f in batch:
                    f.set_result(vecs[row[t]].copy())

    def close(self) -> None:
        """Refuse new texts, wake the batcher thread and wait (up to 5 s) for it to finish the batch in
        hand. Idempotent."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)


def quantized(text: torch.nn.Module) -> torch.nn.Module:
    """An int8 dynamically quantised copy of a text encoder (GRU and Linear weights); CPU only."""
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(text, {torch.nn.GRU, torch.nn.Linear}, dtype=torch.qint8)


class FrozenTowerQueries:
    """A model's frozen sentence-transformers tower run by a :class:`SentenceRuntime`, then the model's own
    trained head: ``prepare``/``__call__`` as a text encoder. Queries are not remembered by the model
    (``SBERTTextEncoder.prepare`` would keep every one): the service's LRU is the only query cache."""

    def __init__(self, text: torch.nn.Module, runtime: SentenceRuntime):
        self.text, self.runtime = text, runtime

    def prepare(self, texts: list[str]) -> dict:
        """The text encoder's input for ``texts``: the frozen tower's sentence embeddings, computed by the
        runtime (ONNX Runtime, OpenVINO or torch) instead of the torch tower."""
        return {"sentence_embedding": self.runtime(texts)}

    def __call__(self, batch: dict) -> torch.Tensor:
        return self.text(batch)


def serving_threads(asked: int = 0) -> int:
    """Threads of a query engine (OpenVINO, ONNX Runtime) in a server: ``asked``, else one fewer than torch's
    (at least 1). The request path (event loop, ranking, the encoder's own Python) needs a core of its own:
    on the 2-core Xeon OpenVINO with 2 threads costs more CPU a query than with 1 (it spins: 1.18× at a
    batch of 16, `bench/text_runtimes.py --threads 1,2`), and the API served as much or more with 1
    (BENCHMARKS.md, "REST API load: where the time goes")."""
    return asked or max(1, torch.get_num_threads() - 1)


def query_encoder(text: torch.nn.Module, runtime: str, quantize: bool, threads: int = 0) -> tuple[object, dict[str, str]]:
    """(encoder for queries, what runs it: runtime, precision, threads, why) for a model's text encoder;
    ``threads`` as for :func:`serving_threads`."""
    if quantize:
        text = quantized(text)
    if isinstance(text, SBERTTextEncoder) and text.frozen:
        rt = (SentenceRuntime(text.st, "torch", bf16=False) if quantize
              else SentenceRuntime(text.st, runtime, threads=serving_threads(threads)))
        info = {"runtime": rt.name, "precision": "int8" if quantize else rt.precision,
                "threads": str(rt.threads or torch.get_num_threads()), "why": rt.why}
        return FrozenTowerQueries(text, rt), info
    return text, {"runtime": "torch", "precision": "int8" if quantize else "model's",
                  "threads": str(torch.get_num_threads()), "why": "only a frozen sentence-transformers tower runs elsewhere"}


class QueryEncoder:
    """Embeds cleaned query texts for every served model: cache first, then the model's batcher (or a
    direct encoder call). ``attach(entry)`` prepares a model once it is loaded."""

    def __init__(self, *, cache_size: int = 4096, batching: bool = True, max_batch: int = 64, quantize: bool = False,
                 runtime: str = "auto", runtime_threads: int = 0):
        self.cache_size, self.batching, self.max_batch, self.quantize = cache_size, batching, max_batch, quantize
        self.runtime, self.runtime_threads = runtime, runtime_threads
        self.runtimes: dict[str, dict[str, str]] = {}  # model → what encodes its queries (/metrics, the logs)
        self._encoders: dict[str, object] = {}
        self._batchers: dict[str, TextBatcher] = {}
        self._cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def attach(self, entry: ModelEntry) -> None:
        """Set up the query encoding of a model that just loaded: its fastest text runtime (logged and
        kept in ``runtimes``) and, with batching, its ``TextBatcher``. Called once per model by the registry's
        loading thread, before requests reach the model."""
        self._encoders[entry.name], self.runtimes[entry.name] = query_encoder(entry.model.text, self.runtime, self.quantize,
                                                                              self.runtime_threads)
        r = self.runtimes[entry.name]
        log.info("model %s: queries encoded by %s (%s, threads %s; %s)", entry.name, r["runtime"], r["precision"],
                 r["threads"], r["why"])
        if self.batching:
            self._batchers[entry.name] = TextBatcher(lambda texts, e=entry: self.encode_batch(e, texts),
                                                     max_batch=self.max_batch, name=entry.name)

    def uses_model_encoder(self, entry: ModelEntry) -> bool:
        """Whether queries of ``entry`` go through the model's own text encoder (not an int8 copy)."""
        return self._encoders.get(entry.name, entry.model.text) is entry.model.text

    def encode_batch(self, entry: ModelEntry, texts: list[str]) -> np.ndarray:
        """(n, E) normalised embeddings of ``texts`` (no cache, no batcher)."""
        enc = self._encoders.get(entry.name, entry.model.text)
        with torch.inference_mode():
            batch = to_device(enc.prepare(texts), entry.model.device)
            return enc(batch).float().cpu().numpy()

    def encode(self, entry: ModelEntry, text: str) -> np.ndarray:
        """The embedding of an already cleaned text (read-only: it may be shared through the cache)."""
        key = (entry.name, text)
        vec = self._cached(key)
        if vec is not None:
            return vec
        b = self._batchers.get(entry.name)
        return self._store(key, b.encode(text) if b is not None else self.encode_batch(entry, [text])[0])

    def submit(self, entry: ModelEntry, text: str) -> Future | None:
        """``encode`` for a caller that must not block (an event loop): the embedding as a Future, resolved
        at once from the cache, otherwise by the model's batcher thread (never on the caller's thread).
        None without a batcher: the caller encodes on a worker thread instead."""
        key = (entry.name, text)
        vec = self._cached(key)
        if vec is not None:
            done: Future = Future()
            done.set_result(vec)
            return done
        b = self._batchers.get(entry.name)
        if b is None:
            return None
        fut = b.submit(text)
        out: Future = Future()

        def stored(f: Future) -> None:  # on the batcher thread, after each encoder call
            try:
                if f.exception() is not None:
                    out.set_exception(f.exception())
                else:
                    out.set_result(self._store(key, f.result()))
            except InvalidStateError:  # the caller stopped waiting (its client went away): nothing to deliver
                pass

        fut.add_done_callback(stored)
        return out

    def _cached(self, key: tuple[str, str]) -> np.ndarray | None:
        if not self.cache_size:
            return None
        with self._lock:
            vec = self._cache.get(key)
            if vec is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return vec
            self.misses += 1
        return None

    def _store(self, key: tuple[str, str], vec: np.ndarray) -> np.ndarray:
        vec.setflags(write=False)
        if self.cache_size:
            with self._lock:
                self._cache[key] = vec
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return vec

    def info(self) -> dict:
        """Counters for /metrics and the health page: cache capacity, size, hits and misses, batching,
        each model's text runtime, and the batchers' encoder calls and queries."""
        b = list(self._batchers.values())
        return {"capacity": self.cache_size, "size": len(self._cache), "hits": self.hits, "misses": self.misses,
                "batching": self.batching, "runtimes": {k: dict(v) for k, v in self.runtimes.items()},
                "encoder_calls": sum(x.calls for x in b), "encoded_queries": sum(x.items for x in b)}

    def clear(self) -> None:
        """Empty the query-embedding cache and reset its hit and miss counters (thread-safe)."""
        with self._lock:
            self._cache.clear()
            self.hits = self.misses = 0

    def close(self) -> None:
        """Stop the batcher threads (encoding goes on without batching)."""
        batchers, self._batchers = self._batchers, {}
        for b in batchers.values():
            b.close()
