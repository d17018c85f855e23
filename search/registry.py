"""Named models: each an index directory and the checkpoint that built it, loaded and checked once.

Loading a model: read the manifest, find the checkpoint (an override, else the path stored relative
to the index, else the absolute one), check its sha256 against the manifest *before* reading it,
verify the index files (sizes and counts, sha256 by default), then rebuild the model. A model that
fails is recorded in ``failed`` with the reason and the others are served; when none loads,
``load_error`` says why. Loading can run in a background thread (``start_loading``) so a server
answers health checks meanwhile.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from indexer.build import load_model
from indexer.evaluate import load_report
from indexer.index import (
    IndexDir,
    IndexDirError,
    load_index_dir,
    read_manifest,
    relative_to_index,
    resolve_checkpoint,
)
from search.errors import NotFound, NotReady, redact_paths
from search.results import ServiceHealth
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
    image_pos: dict[int, int] = field(default_factory=dict)  # image id → row
    caption_pos: dict[int, int] = field(default_factory=dict)  # caption id → row
    _relevance: np.ndarray | None = None

    @property
    def has_ground_truth(self) -> bool:
        return self.index.has_ground_truth

    def relevance(self) -> np.ndarray | None:
        """ROUGE-L relevance (captions × images) when the index has it cached (`ltd eval` computes it)."""
        if self._relevance is None and self.has_ground_truth:
            p = self.index.derived_path("relevance_rougeL")
            if p.is_file():
                self._relevance = np.load(p, mmap_mode="r")
        return self._relevance

    def caption_row(self, caption_id: int) -> int:
        pos = self.caption_pos.get(int(caption_id))
        if pos is None:
            raise NotFound(f"caption id {caption_id} is not in model {self.name}'s index")
        return pos

    def image_row(self, image_id: int) -> int:
        pos = self.image_pos.get(int(image_id))
        if pos is None:
            raise NotFound(f"image id {image_id} is not in model {self.name}'s index")
        return pos


def warm_up(backbone, device: str | torch.device = "cpu") -> None:
    """Run the image backbone once, before any request thread does. Its runtime is built on the first
    call (an OpenVINO compile: seconds) and, with OpenVINO, the first calls from several threads at
    once can deadlock inside its bindings with the GIL held (pybind11's one-time numpy set-up): 8
    concurrent uploads to a fresh server hung it for good, /api/health included (measured)."""
    size = backbone.preprocess.size
    with torch.no_grad():
        backbone.extract(torch.zeros(1, 3, size, size, device=device))


def load_entry(name: str, path: Path, *, checkpoint: Path | None = None, device: str = "cpu",
               verify: str = "hash") -> ModelEntry:
    manifest = read_manifest(path)
    ckpt = resolve_checkpoint(path, manifest, checkpoint)
    sha = sha256_file(ckpt)
    if sha != manifest.get("checkpoint_sha256"):  # before the file is even unpickled
        raise IndexDirError(f"{ckpt} is not the checkpoint that built {path} (sha256 {sha[:12]}…, the manifest "
                            f"says {str(manifest.get('checkpoint_sha256'))[:12]}…); rebuild the index with "
                            "`ltd index` or serve it with the checkpoint that built it")
    ix = load_index_dir(path, checkpoint_sha256=sha, verify=verify, mmap=True)  # IVF lists mapped, not read
    lm = load_model(ckpt, device)
    lm.model.eval()  # once: encoding calls the submodules directly, from many threads
    if lm.model.image.backbone is not None:
        warm_up(lm.model.image.backbone, device)
    run_dir = ckpt.parent if (ckpt.parent / "metrics.jsonl").is_file() else None
    return ModelEntry(name=name, index=ix, model=lm.model, checkpoint=ckpt, sha256=sha,
                      report=load_report(path, ix.generation), run_dir=run_dir,
                      image_pos={int(i): k for k, i in enumerate(ix.images.ids)},
                      caption_pos={int(i): k for k, i in enumerate(ix.captions.ids)})


class ModelRegistry:
    """The served models by name; ``on_loaded(entry)`` runs once per model after it loads."""

    def __init__(self, models: dict[str, str | Path], *, checkpoints: dict[str, str | Path] | None = None,
                 device: str = "cpu", verify: str = "hash", on_loaded: Callable[[ModelEntry], None] | None = None):
        if not models:
            raise UserValueError("no models given: pass at least one NAME=INDEX_DIR")
        self.specs = {n: Path(p) for n, p in models.items()}
        self.checkpoints = {n: Path(p) for n, p in (checkpoints or {}).items()}
        self.device, self.verify, self.on_loaded = device, verify, on_loaded
        self._first: list[Callable[[], None]] = []  # see load_with_models
        self.entries: dict[str, ModelEntry] = {}
        self.failed: dict[str, str] = {}  # name → why it could not be loaded
        self.ready = threading.Event()  # set when loading has finished (every model loaded or failed)
        self.load_error: str | None = None  # set when no model could be loaded
        self.loaded_at: float | None = None
        self._lock = threading.Lock()
        self._loader: threading.Thread | None = None

    @property
    def names(self) -> list[str]:
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
                entry = load_entry(name, path, checkpoint=self.checkpoints.get(name), device=self.device,
                                   verify=self.verify)
                if self.on_loaded is not None:
                    self.on_loaded(entry)
                self.entries[name] = entry
                log.info("model %s ready: %s", name, path)
            except Exception as e:  # one broken model must not take the others down
                self.failed[name] = str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
                log.error("model %s cannot be served: %s", name, self.failed[name])
        if not self.entries:
            self.load_error = "no model could be loaded: " + "; ".join(f"{n}: {r}" for n, r in self.failed.items())
        self.loaded_at = time.time()
        self.ready.set()

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
        return "degraded" if self.failed else "ok"

    @property
    def default_name(self) -> str:
        """The first model that serves (the first one given while loading)."""
        return next((n for n in self.names if n in self.entries), self.names[0])

    @property
    def default_name_with_ground_truth(self) -> str:
        """The first serving model whose index is a dataset split (queries there have ground truth)."""
        return next((n for n, e in self.entries.items() if e.has_ground_truth), self.default_name)

    def health(self) -> ServiceHealth:
        """The loading state as clients see it: the reasons name files, never the server's folders."""
        return ServiceHealth(status=self.status, models=self.names, loaded=[n for n in self.names if n in self.entries],
                             down={n: redact_paths(why) for n, why in self.failed.items()},
                             detail=self.load_error and redact_paths(self.load_error), loaded_at=self.loaded_at)

    def get(self, name: str | None) -> ModelEntry:
        if name is None:
            name = self.default_name
        if name not in self.specs:
            raise NotFound(f"unknown model {name!r}; valid models: {', '.join(self.names)}", valid_models=self.names)
        if name in self.failed:
            raise NotReady(f"model {name} is down: {redact_paths(self.failed[name])}")
        if name not in self.entries:
            raise NotReady("models are still loading")
        return self.entries[name]


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
