"""The Gradio UI takes only files uploaded through it, checks them, and keeps its upload cache bounded.

Gradio turns a file value (``{"path": …, "meta": {"_type": "gradio.FileData"}}``) in an event's
payload into a file in its cache before any handler runs; a ``path`` that is an ``http(s)://`` URL is
*downloaded* there (``processing_utils.async_move_files_to_cache``), with no size limit, and served
back by ``/gradio_api/file=``: a public-URL proxy and a way to fill the disk. So, for every request
to the mount (queue/join, call/*, run/*, api/*, component_server, …), before Gradio sees it:

- a JSON body is parsed (in a worker thread when large) and every file value in it, however deeply
  nested, must name an existing file inside the upload folder; a URL or any other path is refused
  (400), and so is a file the cache sweep removed (Gradio's own error would name the folder);
- an upload (``/gradio_api/upload``) must be at most ``MAX_FILES_PER_UPLOAD`` images: after Gradio
  stores the files, each must start with an image type's magic bytes and open as an image (header
  only), or all of them are deleted and the answer is 415;
- the upload folder (``GRADIO_TEMP_DIR``: private, app/api/main.py) is swept after each upload and
  at most once a minute otherwise: files older than ``max_age`` go, then the oldest until it holds at
  most ``max_files`` files and ``max_bytes`` bytes.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import anyio
from PIL import Image
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_body
from app.api.routers.bodies import INLINE_PARSE_BYTES
from search.files import sniff_image_type

log = logging.getLogger(__name__)

UI_PREFIX = "/ui/"
UPLOAD_PATH = "/ui/gradio_api/upload"
MAX_FILES_PER_UPLOAD = 4  # the UI uploads one image at a time
SWEEP_EVERY = 60.0


class ForbiddenFile(ValueError):
    pass


def check_file_values(data: object, upload_dir: Path) -> int:
    """The number of file values in ``data`` (parsed JSON); ForbiddenFile when one names a URL or a
    path outside ``upload_dir``. Iterative: a deeply nested payload cannot exhaust the stack."""
    root, count, stack = os.path.realpath(upload_dir), 0, [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            path = node.get("path")
            if isinstance(path, str):
                count += 1
                if "://" in path or path.startswith(("//", "\\\\")):
                    raise ForbiddenFile("the UI does not fetch URLs: upload the file instead")
                real = os.path.realpath(path)
                if os.path.commonpath([real, root]) != root or real == root:
                    raise ForbiddenFile("the UI accepts only files uploaded through it")
                if not os.path.isfile(real):  # Gradio's own error would echo the server's folder
                    raise ForbiddenFile("the uploaded file is gone (uploads are kept for a while); upload it again")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def is_image_file(path: Path) -> bool:
    """Starts with an image type's magic bytes and opens as an image (the header only, no decode)."""
    try:
        with open(path, "rb") as f:
            if sniff_image_type(f.read(16)) is None:
                return False
            f.seek(0)
            with Image.open(f) as img:
                return img.width > 0 and img.height > 0
    except Exception:  # noqa: BLE001 - PIL raises many kinds for garbage; all mean "not an image"
        return False


class UploadCache:
    """Bounds on the UI's upload folder (see the module doc); ``sweep`` is safe from several threads
    and several worker processes (a file another sweeper removed first is skipped)."""

    def __init__(self, folder: Path, *, max_bytes: int, max_age: float, max_files: int):
        self.folder, self.max_bytes, self.max_age, self.max_files = Path(folder), max_bytes, max_age, max_files
        self._lock = threading.Lock()
        self.last_sweep = 0.0

    def due(self) -> bool:
        return time.monotonic() - self.last_sweep > SWEEP_EVERY

    def sweep(self) -> int:
        """Remove expired files, then the oldest until within bounds, then empty folders; how many files."""
        with self._lock:
            self.last_sweep = time.monotonic()
            files, dirs = [], []
            for dirpath, dirnames, filenames in os.walk(self.folder):
                dirs += [os.path.join(dirpath, d) for d in dirnames]
                for name in filenames:
                    p = os.path.join(dirpath, name)
                    try:
                        st = os.lstat(p)
                    except OSError:
                        continue
                    files.append((st.st_mtime, st.st_size, p))
            files.sort()
            now, total, removed = time.time(), sum(f[1] for f in files), 0
            for k, (mtime, size, p) in enumerate(files):
                left = len(files) - k
                if mtime > now - self.max_age and left <= self.max_files and total <= self.max_bytes:
                    break
                try:
                    os.unlink(p)
                    removed += 1
                except OSError:
                    pass
                total -= size
            for d in sorted(dirs, key=len, reverse=True):  # deepest first
                try:
                    os.rmdir(d)  # only succeeds when empty
                except OSError:
                    pass
            if removed:
                log.info("UI upload cache: removed %d file(s)", removed)
            return removed


def _refuse(status: int, detail: str, error: str | None = None) -> tuple[int, bytes]:
    return status, json.dumps(error_body(status, detail, error)).encode()


class UIGuardMiddleware:
    """Applies the module doc's rules to the requests of the UI mounted at /ui."""

    def __init__(self, app: ASGIApp, *, upload_dir: Path, cache: UploadCache):
        self.app, self.upload_dir, self.cache = app, Path(upload_dir), cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(UI_PREFIX):
            await self.app(scope, receive, send)
            return
        if self.cache.due():
            await anyio.to_thread.run_sync(self.cache.sweep)
        if path == UPLOAD_PATH and scope.get("method") == "POST":
            await self._upload(scope, receive, send)
        elif scope.get("method") in ("POST", "PUT", "PATCH"):
            await self._event(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _event(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body (capped by BodyLimitMiddleware), check its file values, then replay it."""
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody to answer
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        refusal = await self._check_body(body)
        if refusal is not None:
            await _send_json(send, *refusal)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _check_body(self, body: bytes) -> tuple[int, bytes] | None:
        if not body.strip():
            return None
        try:
            data = json.loads(body) if len(body) <= INLINE_PARSE_BYTES else await anyio.to_thread.run_sync(json.loads, body)
        except RecursionError:
            return _refuse(400, "the request body is nested too deeply")
        except ValueError:
            return None  # not JSON: Gradio's routes that read JSON refuse it the same way
        try:
            check_file_values(data, self.upload_dir)
        except ForbiddenFile as e:
            log.warning("UI request refused: %s", e)
            return _refuse(400, str(e), "forbidden_file")
        return None

    async def _upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Let Gradio store the upload, hold its answer, keep the files only if they are all images."""
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        await self.app(scope, receive, hold)
        start = next((m for m in held if m["type"] == "http.response.start"), None)
        body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
        if start is not None and start["status"] == 200:
            refusal = await anyio.to_thread.run_sync(self._check_uploads, body)
            if refusal is not None:
                await _send_json(send, *refusal)
                return
        for message in held:
            await send(message)

    def _check_uploads(self, body: bytes) -> tuple[int, bytes] | None:
        try:
            paths = [Path(p) for p in json.loads(body)]
        except (ValueError, TypeError):
            return None
        ok = len(paths) <= MAX_FILES_PER_UPLOAD and all(
            p.resolve().is_relative_to(self.upload_dir.resolve()) and is_image_file(p) for p in paths)
        if not ok:
            for p in paths:
                if p.resolve().is_relative_to(self.upload_dir.resolve()):
                    p.unlink(missing_ok=True)
            if len(paths) > MAX_FILES_PER_UPLOAD:
                return _refuse(413, f"at most {MAX_FILES_PER_UPLOAD} files per upload")
            return _refuse(415, "the UI accepts image files only (JPEG, PNG, WebP, BMP, GIF, TIFF)")
        self.cache.sweep()
        return None


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
