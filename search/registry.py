"""Named models: each an index directory and the checkpoint that built it, loaded and checked once,
then kept current while they serve.

Loading a model: read the manifest, find the checkpoint (an override, else the path stored relative
to the index, else the absolute one), check its sha256 against the manifest *before* reading it,
verify the index files (sizes and counts, sha256 by default), then rebuild the model. A model that
fails is recorded in ``failed`` with the reason and the others are served; when none loads,
``load_error`` says why. Loading can run in a background thread (``start_loading``) so a server
answers health checks meanwhile.

Every index is served as a living index (search/live.py): ``get`` hands out the model bound to the
index's current snapshot, which a request uses to the end. ``refresh`` (a watcher thread calls it
every second, a write route and ``POST …/reload`` call it at once) applies what another process wrote
to the item store, and loads a new generation (a compaction, ``ltd index --append``, a rebuild) in the
background and swaps it in whole, reusing the loaded model when the checkpoint is the same.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from indexer.build import load_model
from indexer.evaluate import load_report
from indexer.image_roots import allowed_roots
from indexer.index import IndexDir, IndexDirError, load_index_dir, read_manifest, relative_to_index, resolve_checkpoint
from indexer.shards_index import is_sharded
from search.errors import NotFound, NotReady, redact_paths
from search.filters import MetadataTable
from search.live import LiveIndex
from search.results import ServiceHealth
from search.sharded import LocalShards, load_sharded, shard_engine_of
from training.errors import Unavailable, UserValueError
from training.fsio import sha256_file
from training.models.dual_encoder import DualEncoder

log = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    """One loaded model: its index, its encoder, and lookups from dataset ids to index rows."""

    name: str
    index: IndexDir
    model: DualEncoder
    checkpoint: Path
    sha256: str
    report: dict | None
    run_dir: Path | None  # the training run's folder, when its metrics.jsonl sits next to the checkpoint
    image_pos: Mapping[int, int] = field(default_factory=dict)  # image id → row (removed ids absent)
    caption_pos: Mapping[int, int] = field(default_factory=dict)  # caption id → row
    _relevance: np.ndarray | None = None
    live: LiveIndex | None = None  # the index kept current (None only for an entry built by hand)
    table: MetadataTable | None = None  # metadata of every image row of ``index`` (filters)
    caption_image: np.ndarray | None = None  # caption row → image row (−1: none)
    seq: int = 0  # the last item-store write ``index`` holds

    @property
    def generation(self) -> int:
        """The index generation this entry serves (it changes when a compaction commits a new one)."""
        return self.index.generation

    @property
    def has_ground_truth(self) -> bool:
        """The index is a dataset split with caption ↔ image links (queries on its items have ground truth)."""
        return self.index.has_ground_truth

    def relevance(self) -> np.ndarray | None:
        """ROUGE-L relevance (captions × images) when the index has it cached (`ltd eval` computes it)."""
        if self._relevance is None and self.has_ground_truth:
            p = self.index.derived_path("relevance_rougeL")
            if p.is_file():
                self._relevance = np.load(p, mmap_mode="r")
        return self._relevance

    def caption_row(self, caption_id: int) -> int:
        """The row of dataset caption ``caption_id`` in this model's index; NotFound when it has none."""
        pos = self.caption_pos.get(int(caption_id))
        if pos is None:
            raise NotFound(f"caption id {caption_id} is not in model {self.name}'s index")
        return pos

    def image_row(self, image_id: int) -> int:
        """The row of dataset image ``image_id`` in this model's index; NotFound when it has none."""
        pos = self.image_pos.get(int(image_id))
        if pos is None:
            raise NotFound(f"image id {image_id} is not in model {self.name}'s index")
        return pos


def warm_up(backbone) -> None:
    """Run the image backbone once, where it is, before any request thread does. Its runtime is built on the first
    call (an OpenVINO compile: seconds) and, with OpenVINO, the first calls from several threads at
    once can deadlock inside its bindings with the GIL held (pybind11's one-time numpy set-up): 8
    concurrent uploads to a fresh server hung it for good, /api/health included (measured)."""
    size = backbone.preprocess.size
    with torch.no_grad():
        backbone.extract(torch.zeros(1, 3, size, size, device=backbone.device))


@dataclass(frozen=True)
class EntryOptions:
    """How :func:`load_entry` finds, checks and serves a model's files: the ``checkpoint`` (None: the manifest's;
    given when it moved), ``verify`` (``hash`` or ``counts``: how the index files are checked against the manifest),
    the ``images_roots`` image files may be served from (none: the record ``ltd index`` made), ``writable`` (the item
    store is created, writes allowed; images are served from its ``ingest_roots`` too), the engine ``shards`` of a
    sharded index (search/sharded.py; None: local)."""

    checkpoint: Path | None = None
    verify: str = "hash"
    images_roots: tuple[str, ...] = ()
    writable: bool = False
    ingest_roots: tuple[str, ...] = ()
    shards: Callable | None = None


def load_entry(name: str, path: Path, options: EntryOptions | None = None, *,
               model: DualEncoder | None = None) -> ModelEntry:
    """Load one model as ``options`` says (:class:`EntryOptions`; None: its defaults): the index directory ``path``,
    verified against its manifest, then the checkpoint that built it, checked by sha256 before it is unpickled
    (``weights_only``), in eval mode on the process's device (``training.device``) — or ``model``, the loaded model of
    this checkpoint (a reload of the same index). Image files are served only from the manifest's folders the options
    allow; the index is served living (search/live.py). IndexDirError for an index or checkpoint that does not match;
    the checkpoint loader's errors otherwise. Seconds: call it off the event loop (the registry's loader does)."""
    o = options or EntryOptions()
    manifest = read_manifest(path)
    ckpt = resolve_checkpoint(path, manifest, o.checkpoint)
    sha = sha256_file(ckpt)
    if sha != manifest.get("checkpoint_sha256"):  # before the file is even unpickled
        raise IndexDirError(f"{ckpt} is not the checkpoint that built {path} (sha256 {sha[:12]}…, the manifest "
                            f"says {str(manifest.get('checkpoint_sha256'))[:12]}…); rebuild the index with "
                            "`ltd index` or serve it with the checkpoint that built it")
    if is_sharded(manifest):
        ix = load_sharded(path, engine=o.shards or LocalShards, checkpoint_sha256=sha, verify=o.verify)
    else:
        ix = load_index_dir(path, checkpoint_sha256=sha, verify=o.verify, mmap=True)  # IVF lists mapped, not read
    ingested = tuple(Path(r).resolve() for r in o.ingest_roots if o.writable)  # where folder adds' files are
    ix.confine(allowed_roots(path, ix.image_roots, o.images_roots) + ingested)  # not wider than the operator allowed
    if model is None:
        lm = load_model(ckpt)
        model = lm.model
        model.eval()  # once: encoding calls the submodules directly, from many threads
        if model.image.backbone is not None:
            warm_up(model.image.backbone)
    run_dir = ckpt.parent if (ckpt.parent / "metrics.jsonl").is_file() else None
    live = LiveIndex.open(ix, writable=o.writable)
    return bind(ModelEntry(name=name, index=ix, model=model, checkpoint=ckpt, sha256=sha,
                           report=load_report(path, ix.generation), run_dir=run_dir, live=live))


def bind(entry: ModelEntry) -> ModelEntry:
    """``entry`` bound to its living index's current snapshot (made once per snapshot)."""
    live = entry.live
    if live is None:
        return entry
    snap = live.current
    cached = getattr(live, "bound", None)
    if cached is not None and cached[0] is snap:
        return cached[1]
    bound = replace(entry, index=snap.index, image_pos=snap.image_pos, caption_pos=snap.caption_pos,
                    table=snap.table, caption_image=snap.caption_image, seq=snap.seq)
    live.bound = (snap, bound)
    return bound


def _manifest_stamp(path: Path) -> tuple:
    try:
        st = (Path(path) / "manifest.json").stat()
        return st.st_ino, st.st_mtime_ns, st.st_size
    except OSError:
        return ()


class ModelRegistry:
    """The served models by name; ``on_loaded(entry)`` runs once per model after it loads."""

    def __init__(self, models: dict[str, str | Path], *, checkpoints: dict[str, str | Path] | None = None,
                 verify: str = "hash", on_loaded: Callable[[ModelEntry], None] | None = None,
                 images_roots: tuple[str, ...] = (), writable: bool = False, ingest_roots: tuple[str, ...] = ()):
        if not models:
            raise UserValueError("no models given: pass at least one NAME=INDEX_DIR")
        self.specs = {n: Path(p) for n, p in models.items()}
        self.checkpoints = {n: Path(p) for n, p in (checkpoints or {}).items()}
        self.verify, self.on_loaded = verify, on_loaded
        self.images_roots = tuple(images_roots)  # the operator's --images-root folders (none: the record)
        self.writable = writable  # item stores are created, and writes allowed (`ltd serve --writable`)
        self.ingest_roots = tuple(ingest_roots)  # the folders writes may add (`--ingest-root`): served too
        self.shard_engine = None  # what searches sharded indexes' shards (None: this process; `--engine ray`)
        self._first: list[Callable[[], None]] = []  # see load_with_models
        self._entries: dict[str, ModelEntry] = {}  # as loaded; ``entries`` binds them to their snapshots
        self._stamps: dict[str, tuple] = {}  # name → the manifest file's (inode, mtime, size) when loaded
        self._reloading: set[str] = set()
        self.failed: dict[str, str] = {}  # name → why it could not be loaded
        self.ready = threading.Event()  # set when loading has finished (every model loaded or failed)
        self.load_error: str | None = None  # set when no model could be loaded
        self.loaded_at: float | None = None
        self._lock = threading.Lock()
        self._loader: threading.Thread | None = None

    @property
    def names(self) -> list[str]:
        """The configured model names, loaded or not, in the order given."""
        return list(self.specs)

    def load(self) -> None:
        """Load every model once; RuntimeError when none loads. Safe to call from several threads."""
        with self._lock:
            if not self.ready.is_set():
                self._load_all()
        if self.load_error:
            raise Unavailable(self.load_error)

    def load_with_models(self, load: Callable[[], None]) -> None:
        """Run ``load`` in the loading thread, before the models: what serves beside them (the
        captioners) is then loaded, and its backbones warmed up, before any request thread runs, and
        ``ready`` covers it. When the models have already loaded, ``load`` runs now (after a load in
        progress has finished)."""
        with self._lock:  # load() holds it while loading
            if not self.ready.is_set():
                self._first.append(load)
                return
        load()

    def _load_all(self) -> None:
        for load in self._first:
            load()
        for name, path in self.specs.items():
            try:
                stamp = _manifest_stamp(path)
                entry = self._load_one(name)
                if self.on_loaded is not None:
                    self.on_loaded(entry)
                self._entries[name], self._stamps[name] = entry, stamp
                log.info("model %s ready: %s", name, path)
            except Exception as e:  # one broken model must not take the others down
                self.failed[name] = str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
                log.error("model %s cannot be served: %s", name, self.failed[name])
        if not self._entries:
            self.load_error = "no model could be loaded: " + "; ".join(f"{n}: {r}" for n, r in self.failed.items())
        self.loaded_at = time.time()
        self.ready.set()

    def _load_one(self, name: str, model: DualEncoder | None = None) -> ModelEntry:
        options = EntryOptions(checkpoint=self.checkpoints.get(name), verify=self.verify,
                               images_roots=self.images_roots, writable=self.writable,
                               ingest_roots=self.ingest_roots, shards=self.shard_engine)
        return load_entry(name, self.specs[name], options, model=model)

    @property
    def entries(self) -> dict[str, ModelEntry]:
        """The loaded models, each bound to its index's current snapshot."""
        return {n: bind(e) for n, e in list(self._entries.items())}

    # ---- keeping the indexes current -------------------------------------------------------------
    def refresh(self, name: str, *, wait: bool = True) -> bool:
        """Apply another process's writes to ``name``'s item store, and load a new generation of its
        index when its manifest changed (in this thread when ``wait``, else in the background); True
        when something changed. A generation that cannot be loaded keeps the old one serving (logged)."""
        entry = self._entries.get(name)
        if entry is None:
            return False
        changed = entry.live.refresh() if entry.live is not None else False
        if _manifest_stamp(self.specs[name]) == self._stamps.get(name) or name in self._reloading:
            return changed
        if not wait:
            threading.Thread(target=self._reload, args=(name,), name=f"ltd-reload-{name}", daemon=True).start()
            return changed
        return self._reload(name) or changed

    def _reload(self, name: str) -> bool:
        with self._lock:
            if name in self._reloading:
                return False
            self._reloading.add(name)
        try:
            old, stamp = self._entries[name], _manifest_stamp(self.specs[name])
            if old.live is not None and read_manifest(self.specs[name]).get("generation") == old.generation:
                self._stamps[name] = stamp  # touched, not changed
                return False
            same = read_manifest(self.specs[name]).get("checkpoint_sha256") == old.sha256
            new = self._load_one(name, model=old.model if same else None)
            if not same and self.on_loaded is not None:
                self.on_loaded(new)
            self._entries[name], self._stamps[name] = new, stamp  # one assignment: requests see old or new
            log.info("model %s: generation %d swapped in", name, new.generation)
            return True
        except Exception as e:  # noqa: BLE001 - a half-written or broken rebuild must not take the model down
            log.error("model %s: the index changed but cannot be loaded (still serving the old one): %s", name,
                      redact_paths(str(e)))
            return False
        finally:
            self._reloading.discard(name)

    def watch(self, interval: float = 1.0) -> threading.Thread:
        """A daemon thread that refreshes every model every ``interval`` seconds (new generations load in
        the background)."""
        def loop() -> None:
            self.ready.wait()
            while True:
                time.sleep(interval)
                for name in list(self._entries):
                    try:
                        self.refresh(name, wait=False)
                    except Exception as e:  # noqa: BLE001 - never let the watcher die
                        log.warning("model %s: refresh failed: %s", name, redact_paths(str(e)))

        thread = threading.Thread(target=loop, name="ltd-index-watcher", daemon=True)
        thread.start()
        return thread

    def start_loading(self) -> threading.Thread:
        """Load in a background thread; ``ready`` is set when it is done."""
        if self._loader is None:
            self._loader = threading.Thread(target=self._load_quietly, name="ltd-model-loader", daemon=True)
            self._loader.start()
        return self._loader

    def _load_quietly(self) -> None:
        try:
            self.load()
        except RuntimeError:  # kept in load_error and logged; /api/health reports it
            pass

    @property
    def status(self) -> str:
        """``loading``; then ``ok`` (every model serves), ``degraded`` (some failed) or ``error`` (none)."""
        if not self.ready.is_set():
            return "loading"
        if self.load_error is not None:
            return "error"
        return "degraded" if self.failed or self.shards_down() else "ok"

    def shards_down(self) -> dict[str, list[int]]:
        """Each sharded model's shards that have no live replica now (none for the others)."""
        out = {}
        for name, entry in list(self._entries.items()):
            engine = shard_engine_of(entry.index)
            down = engine.down() if engine is not None else []
            if down:
                out[name] = sorted(down)
        return out

    @property
    def default_name(self) -> str:
        """The first model that serves (the first one given while loading)."""
        return next((n for n in self.names if n in self._entries), self.names[0])

    @property
    def default_name_with_ground_truth(self) -> str:
        """The first serving model whose index is a dataset split (queries there have ground truth)."""
        return next((n for n, e in self.entries.items() if e.has_ground_truth), self.default_name)

    def health(self) -> ServiceHealth:
        """The loading state as clients see it: the reasons name files, never the server's folders."""
        return ServiceHealth(status=self.status, models=self.names, loaded=[n for n in self.names if n in self._entries],
                             down={n: redact_paths(why) for n, why in self.failed.items()},
                             detail=self.load_error and redact_paths(self.load_error), loaded_at=self.loaded_at,
                             shards_down=self.shards_down())

    def get(self, name: str | None) -> ModelEntry:
        """The loaded model ``name`` (None: the default model). NotFound for a name that is not configured
        (with the valid names), NotReady while loading or for a model that failed (with the reason, paths
        redacted). Thread-safe."""
        if name is None:
            name = self.default_name
        if name not in self.specs:
            raise NotFound(f"unknown model {name!r}; valid models: {', '.join(self.names)}", valid_models=self.names)
        if name in self.failed:
            raise NotReady(f"model {name} is down: {redact_paths(self.failed[name])}")
        entry = self._entries.get(name)
        if entry is None:
            raise NotReady("models are still loading")
        if entry.live is not None and entry.live.store is not None:
            entry.live.refresh()  # another process's (another worker's) writes: read-your-writes everywhere
        return bind(entry)


def public_manifest(index_path: Path, manifest: dict) -> dict:
    """The manifest as clients see it: no absolute paths of the server's file system (paths are given
    relative to the served index directory) and no file table."""
    def rel(v: object) -> object:
        return relative_to_index(index_path, v) if isinstance(v, str) and v.startswith("/") else v

    out = {k: v for k, v in manifest.items() if k not in ("checkpoint", "files")}
    out["checkpoint"] = manifest.get("checkpoint_relative") or rel(manifest.get("checkpoint"))
    out["dataset"] = {k: rel(v) for k, v in (manifest.get("dataset") or {}).items()}
    out["skipped"] = [{**s, "file": rel(s.get("file"))} for s in manifest.get("skipped", [])]
    out["appends"] = [{k: rel(v) for k, v in a.items()} for a in manifest.get("appends", [])]
    if "image_roots" in manifest:
        out["image_roots"] = [rel(r) for r in manifest["image_roots"]]
    return out
