"""The write path's image embedder, in a process of its own.

Why a process: an add's decode and model run inside the server share the server's GIL and its image
runtime's worker threads (OpenVINO's and ONNX Runtime's pools are the process's, started at full
priority by the warm-up, so a niced writing thread does not lower them). A child process at nice
+``nice`` has its own GIL and its own pools, every thread of it at that priority and under the batch
scheduling policy (``run_in_background``), and a crash of the model's native code costs one write
(503) instead of the server. What it does to the searches' latency
during a bulk add, against the in-process thread: BENCHMARKS.md, "Adding images while serving".

The child is a fresh interpreter (``python -c …`` given the pipe's descriptor: no inherited locks or threads,
and no re-run of the server's main module), loads the same checkpoint after
checking its sha256 against the one the server verified, and answers one request at a time over a
pipe of length-prefixed byte frames — JSON headers, the uploads' raw bytes, the vectors' raw float32
bytes; nothing on the pipe is pickled. It decodes each upload under the same pixel budget as the
server (search/media.py) and answers an undecodable one with the server's own error (4xx). Once every
upload has decoded it also stores them (``embed_and_store``: each file written and fsynced under the
item store's folder while the model runs, its sha256 and file metadata sent back), so that the
server's GIL never waits on those writes: the searches' tail did, when the server wrote them. A child
that dies (killed, out of memory) fails the write it was doing with ``NotReady`` (503) and is started
again by the next one; a child whose parent dies reads the end of its pipe and exits.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from indexer.build import load_model
from search.errors import BadRequest, Busy, NotReady, SearchError, Unsupported, UnsupportedMediaType
from search.media import UploadDecoder
from search.registry import warm_up
from search.write_images import WHY, embed_images, read_image_files, save_upload
from training.device import set_device
from training.fsio import sha256_file

log = logging.getLogger("ltd.writes")

_ERRORS = {c.__name__: c for c in (BadRequest, Busy, Unsupported, UnsupportedMediaType)}
_HEAD = 1 << 16  # bytes: the largest JSON header either side sends
_RECORD = 1 << 13  # bytes: the most one stored upload's record (save_upload) may take in the answer
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ROOT = Path(__file__).resolve().parent.parent  # the folder of the ``search`` package
_CHILD = (
    "import sys; from multiprocessing.connection import Connection; "
    "from search.embed_process import child_main; child_main(Connection(int(sys.argv[1])))"
)


@dataclass(frozen=True)
class EmbedderSpec:
    """What the child needs: the checkpoint (and the sha256 the server verified), its device, the
    decode budget, and its CPU priority (a nice value; ``child_nice``)."""

    checkpoint: str
    sha256: str
    device: str = "cpu"
    max_pixels: int = 16_000_000
    max_upload_bytes: int = 20_000_000
    nice: int = 10


def child_nice(lower_by: int) -> int:
    """The nice value ``lower_by`` above the server's (its main thread's: the searches' priority)."""
    base = os.getpriority(os.PRIO_PROCESS, os.getpid()) if hasattr(os, "getpriority") else 0
    return min(19, base + max(0, lower_by))


def run_in_background(nice: int) -> None:
    """Lower the calling thread's CPU priority, and so that of every thread it starts from then on: its
    nice value raised to ``nice`` (0–19; never lowered), and on Linux the SCHED_BATCH policy — the
    scheduler then treats it as CPU-bound: its wake-ups do not preempt a running search, and its slices
    are longer (fewer switches). No privilege is needed for either; where one is refused or missing, the
    thread keeps what it had. What the policy buys (the same nice, more images a second, the searches'
    tail no longer): BENCHMARKS.md, "Adding images while serving"."""
    tid = threading.get_native_id()
    if hasattr(os, "setpriority"):
        try:
            if nice > os.getpriority(os.PRIO_PROCESS, tid):
                os.setpriority(os.PRIO_PROCESS, tid, min(19, nice))
        except OSError as e:
            log.warning("could not lower the write path's priority: %s", e)
    if hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except OSError as e:
            log.warning("could not give the write path the batch scheduling policy: %s", e)


class ProcessEmbedder:
    """One child process embedding uploads for one model (see the module doc). Thread-safe: one request
    at a time."""

    def __init__(self, spec: EmbedderSpec, *, start_timeout: float = 300.0, timeout: float = 600.0):
        self.spec, self.start_timeout, self.timeout = spec, start_timeout, timeout
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self.dim: int | None = None

    # ---- the child's lifetime -------------------------------------------------------------------
    def start(self) -> None:
        """Start the child and wait until its model is loaded (idempotent)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._stop()
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(_ROOT), os.environ.get("PYTHONPATH"))))}
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=_ROOT,
            )
        self._conn = Connection(ours.detach())
        try:
            self._conn.send_bytes(json.dumps(asdict(self.spec)).encode())
        except OSError:
            self._died()
        ready = self._reply(self.start_timeout)
        self.dim = int(ready["dim"])
        log.info("write embedder started (pid %d, nice %d)", self._proc.pid, self.spec.nice)

    def close(self) -> None:
        """Stop the child (it exits when its pipe closes; killed after 5 s)."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the child reads the end of its pipe and exits
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        self._proc = self._conn = None

    @property
    def pid(self) -> int | None:
        """The child's process id (None while none runs)."""
        return self._proc.pid if self._proc is not None else None

    # ---- requests -------------------------------------------------------------------------------
    def embed(self, uploads: list[bytes], min_side: int, on_decoded: Callable[[], None] | None = None) -> np.ndarray:
        """The model's vectors of ``uploads`` (n × dim float32). ``on_decoded`` runs once every upload has
        decoded, while the model runs. An upload that is not a decodable image: the server's error for it."""
        return self._request(uploads, min_side, None, on_decoded)[0]

    def embed_and_store(self, uploads: list[bytes], min_side: int, folder: Path,
                        on_decoded: Callable[[], None] | None = None) -> tuple[np.ndarray, list[dict]]:
        """``embed``, and every upload stored under ``folder`` (an item store's files folder) by the child
        once all have decoded: the vectors, and ``save_upload``'s record of each upload, in order."""
        return self._request(uploads, min_side, Path(folder), on_decoded)

    def embed_files(self, paths: list[Path], min_side: int, root: Path) -> tuple[np.ndarray, list[dict], dict[int, str]]:
        """A server-side folder's image files (paths the server checked: inside an ingest root), read and
        decoded by the child under the uploads' budgets: (vectors of the readable ones, in order; their
        records ``{"sha256", "path", "metadata"}``, each path under ``root``; {position: why skipped})."""
        with self._lock:
            self._ensure()
            try:
                self._conn.send_bytes(json.dumps({"n": 0, "min_side": int(min_side), "root": str(root),
                                                  "paths": [str(p) for p in paths]}).encode())
            except OSError:
                self._died()
            head = self._reply(self.timeout, want="decoded")
            try:
                skipped = {int(k): str(v)[:WHY] for k, v in head.get("skipped", {}).items()}
            except (AttributeError, TypeError, ValueError):
                skipped = None
            if skipped is None or not set(skipped) <= set(range(len(paths))):
                self._died("answered skipped files that are not its paths")
            vectors = self._vectors(len(paths) - len(skipped))
            return vectors, self._records(len(vectors), "files'", lambda r: Path(r["path"]).is_relative_to(root)), skipped

    def _request(self, uploads, min_side, folder, on_decoded) -> tuple[np.ndarray, list[dict]]:
        with self._lock:
            self._ensure()
            try:
                self._conn.send_bytes(json.dumps({"n": len(uploads), "min_side": int(min_side),
                                                  "folder": None if folder is None else str(folder)}).encode())
                for data in uploads:
                    self._conn.send_bytes(data)
            except OSError:
                self._died()
            self._reply(self.timeout, want="decoded")
            failed = None
            try:
                if on_decoded is not None:
                    on_decoded()
            except Exception as e:  # noqa: BLE001 - raised once the child's answer is read off the pipe
                failed = e
            vectors = self._vectors(len(uploads))
            stored = [] if folder is None else self._records(len(uploads), "stored uploads", lambda r: (
                Path(r["path"]).parent == folder / r["sha256"][:2] and Path(r["path"]).stem == r["sha256"]))
            if failed is not None:
                raise failed
            return vectors, stored

    def _vectors(self, n: int) -> np.ndarray:
        """The child's "shape" header and the float32 frame after it, which must hold ``n`` vectors."""
        shape = self._reply(self.timeout, want="shape")["shape"]
        if not (isinstance(shape, list) and len(shape) == 2 and shape[0] == n
                and all(isinstance(d, int) and d >= 0 for d in shape)):
            self._died(f"answered the shape {shape!r} for {n} images")
        raw = self._recv(self.timeout, limit=4 * shape[0] * shape[1] + 1)
        if len(raw) != 4 * shape[0] * shape[1]:
            self._died("answered a torn frame")
        return np.frombuffer(raw, np.float32).reshape(shape).copy()

    def _records(self, n: int, what: str, path_ok: Callable[[dict], bool] | None = None) -> list[dict]:
        """The child's JSON list of ``n`` records, each ``{"sha256", "metadata", ...}`` that ``path_ok``
        accepts (when given): a wrong one means the child is not answering this request."""
        try:
            records = json.loads(self._recv(self.timeout, limit=_HEAD + n * _RECORD))
            ok = isinstance(records, list) and len(records) == n and all(
                isinstance(r.get("metadata"), dict) and _SHA256.fullmatch(r["sha256"])
                and (path_ok is None or path_ok(r)) for r in records)
        except (ValueError, TypeError, KeyError, AttributeError):
            ok = False
        if not ok:
            self._died(f"answered records that are not its {what}")
        return records

    def _recv(self, timeout: float, limit: int = _HEAD) -> bytes:
        try:
            if not self._conn.poll(timeout):
                self._died(f"did not answer in {timeout:.0f} s")
            return self._conn.recv_bytes(limit)
        except (EOFError, OSError):
            self._died()

    def _reply(self, timeout: float, want: str | None = None) -> dict:
        """The child's next JSON header; its error raised as the server's (a child's bug: RuntimeError)."""
        head = json.loads(self._recv(timeout))
        if "error" in head:
            cls = _ERRORS.get(head["error"])
            if cls is None:
                raise RuntimeError(f"the write embedder failed: {head.get('detail', '')}")
            raise cls(head.get("detail", ""))
        if want is not None and want not in head:
            self._died(f"answered {sorted(head)} instead of {want}")
        return head

    def _died(self, why: str = "stopped") -> None:
        code = self._proc.poll() if self._proc is not None else None
        log.error("write embedder %s (exit code %s); it is started again by the next write", why, code)
        if self._proc is not None:
            self._proc.kill()
        self._stop()
        raise NotReady("the image embedder of the write path stopped; try the write again")


# ---- the child ------------------------------------------------------------------------------------
def child_main(conn) -> None:
    """The child process: read its spec, lower its priority before any thread starts, load the model,
    then answer requests until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the server, which closes the pipe
    try:
        spec = EmbedderSpec(**json.loads(conn.recv_bytes(_HEAD)))
    except (EOFError, OSError):
        return
    run_in_background(spec.nice)
    try:
        model, decoder = _load(spec)
    except Exception as e:  # noqa: BLE001 - said to the parent, which fails the write
        _send(conn, {"error": "internal", "detail": f"{type(e).__name__}: {e}"})
        return
    _send(conn, {"dim": int(model.image.embed_dim)})
    files = ThreadPoolExecutor(max_workers=8, thread_name_prefix="store")  # each fsync waits on the disk
    while True:
        try:
            head = json.loads(conn.recv_bytes(_HEAD))
            uploads = [conn.recv_bytes(spec.max_upload_bytes + 1) for _ in range(int(head["n"]))]
        except (EOFError, OSError):
            return  # the server closed the pipe, or died
        folder, min_side = head.get("folder"), int(head["min_side"])
        if "paths" in head:
            _answer_files(conn, model, decoder, head["paths"], min_side, Path(head["root"]), spec.max_upload_bytes)
        else:
            _answer(conn, model, decoder, uploads, min_side, Path(folder) if folder else None, files)


def _load(spec: EmbedderSpec):
    set_device(spec.device)
    if sha256_file(spec.checkpoint) != spec.sha256:
        raise RuntimeError("the checkpoint changed on disk since the server verified it")
    model = load_model(spec.checkpoint).model
    model.eval()
    if model.image.backbone is None:
        raise RuntimeError("the model has no image backbone")
    warm_up(model.image.backbone)
    return model, UploadDecoder(max_pixels=spec.max_pixels, max_concurrent=1)


def _answer(conn, model, decoder, uploads: list[bytes], min_side: int, folder: Path | None,
            files: ThreadPoolExecutor) -> None:
    try:
        images = [decoder.decode(data, min_side) for data in uploads]
    except SearchError as e:
        _send(conn, {"error": type(e).__name__, "detail": e.detail})
        return
    _send(conn, {"decoded": len(images)})
    stored = [files.submit(save_upload, folder, data) for data in uploads] if folder is not None else []
    try:
        vectors = embed_images(model, images)
        records = [f.result() for f in stored]
    except Exception as e:  # noqa: BLE001 - said to the parent; the child keeps serving
        for f in stored:  # no write of this request still running when the next one comes
            f.exception()
        _send(conn, {"error": "internal", "detail": f"{type(e).__name__}: {e}"})
        return
    _send(conn, {"shape": list(vectors.shape)})
    conn.send_bytes(vectors.tobytes())
    if folder is not None:
        conn.send_bytes(json.dumps(records).encode())


def _answer_files(conn, model, decoder, paths: list[str], min_side: int, root: Path, max_bytes: int) -> None:
    images, records, skipped = read_image_files(decoder, paths, min_side, root, max_bytes)
    _send(conn, {"decoded": len(images), "skipped": skipped})
    try:
        vectors = embed_images(model, images)
    except Exception as e:  # noqa: BLE001 - said to the parent; the child keeps serving
        _send(conn, {"error": "internal", "detail": f"{type(e).__name__}: {e}"})
        return
    _send(conn, {"shape": list(vectors.shape)})
    conn.send_bytes(vectors.tobytes())
    conn.send_bytes(json.dumps(records).encode())


def _send(conn, head: dict) -> None:
    try:
        conn.send_bytes(json.dumps(head).encode())
    except OSError:
        pass
