"""The mounted Gradio UI: only its own routes, only files uploaded through it, no server paths out.

Every request to the mount (``/ui``) passes through ``UIGuardMiddleware`` before Gradio sees it:

- its method and path must be one the UI uses (app/api/ui_routes.py: an allow-list; else 404);
- a JSON body is parsed (in a worker thread when large) and every file value in it, and every call
  of an event, must pass app/api/ui_values.py (file values name uploads, no URLs, no data URLs; events
  exist and get their inputs): else 400 ``forbidden_file``, or 404/422 for a call;
- an upload (``/gradio_api/upload``) must be at most ``max_files`` images (``MAX_FILES_PER_UPLOAD``; a
  server whose page adds photos takes up to ``max_items_per_add``, one add's worth): after Gradio
  stores the files, each must start with an image type's magic bytes and open as an image (header
  only), or all of them are deleted and the answer is 415;
- what the UI answers names no private folder (app/api/ui_paths.py: aliases out, folders back in) and
  carries no CORS grant (the UI is same-origin; Gradio's own middleware grants any localhost origin);
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
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import anyio
from PIL import Image
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api import ui_routes
from app.api.errors import error_body
from app.api.routers.bodies import INLINE_PARSE_BYTES
from app.api.ui_paths import PathAliases
from app.api.ui_values import BadCall, ForbiddenFile, UICalls, check_file_values
from search.files import sniff_image_type

log = logging.getLogger(__name__)

UI_MOUNT = "/ui"
UI_PREFIX = UI_MOUNT + "/"
UPLOAD_PATH = "/ui/gradio_api/upload"
FILE_ROUTE = "/gradio_api/file="
JOIN_ROUTE = "/gradio_api/queue/join"
MAX_FILES_PER_UPLOAD = 4  # the UI's searches upload one image at a time
SWEEP_EVERY = 60.0


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
        """Whether the last ``sweep`` is more than ``SWEEP_EVERY`` seconds ago (monotonic clock)."""
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
    """Applies the module doc's rules to the requests of the UI mounted at /ui. ``calls`` gives the
    mounted Blocks' events once they are built (None before: calls are then not checked)."""

    def __init__(self, app: ASGIApp, *, upload_dir: Path, cache: UploadCache, aliases: PathAliases,
                 calls: Callable[[], UICalls | None] = lambda: None, max_files: int = MAX_FILES_PER_UPLOAD):
        self.app, self.upload_dir, self.cache = app, Path(upload_dir), cache
        self.aliases, self.calls, self.max_files = aliases, calls, max_files

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == UI_MOUNT or path.startswith(UI_PREFIX)):
            await self.app(scope, receive, send)
            return
        method, rel = scope.get("method", "GET"), path[len(UI_MOUNT):]
        if not ui_routes.allowed(method, rel):
            await _send_json(send, *_refuse(404, "not a route of the UI"))
            return
        if self.cache.due():
            await anyio.to_thread.run_sync(self.cache.sweep)
        if rel.startswith(FILE_ROUTE):
            shown = self.aliases.reveal_path(path)
            scope = {**scope, "path": shown, "raw_path": quote(shown, safe="/=@:+,;~").encode()}
        send = _hiding(send, self.aliases)
        if path == UPLOAD_PATH:
            await self._upload(scope, receive, send)
        elif method == "POST":
            await self._event(scope, receive, send, ui_routes.called_api(rel), rel == JOIN_ROUTE)
        else:
            await self.app(scope, receive, send)

    async def _event(self, scope: Scope, receive: Receive, send: Send, api: str | None, join: bool) -> None:
        """Read the body (capped by BodyLimitMiddleware), check it, then replay it with folders restored."""
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect  # ClientGoneMiddleware: a 499, nobody to answer
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = self.aliases.reveal(b"".join(chunks))
        refusal = await self._check_body(body, api, join)
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

    async def _check_body(self, body: bytes, api: str | None, join: bool) -> tuple[int, bytes] | None:
        if not body.strip():
            return _refuse(422, "a JSON body is required") if api or join else None
        try:
            data = json.loads(body) if len(body) <= INLINE_PARSE_BYTES else await anyio.to_thread.run_sync(json.loads, body)
        except RecursionError:
            return _refuse(400, "the request body is nested too deeply")
        except ValueError:
            return _refuse(400, "the request body is not JSON")
        try:
            check_file_values(data, self.upload_dir)
            calls = self.calls()
            if calls is not None and api is not None:
                calls.check_api_call(api, data)
            elif calls is not None and join:
                calls.check_join(data)
        except ForbiddenFile as e:
            log.warning("UI request refused: %s", e)
            return _refuse(400, str(e), "forbidden_file")
        except BadCall as e:
            log.info("UI call refused: %s", e)
            return _refuse(e.status, str(e))
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
        ok = len(paths) <= self.max_files and all(
            p.resolve().is_relative_to(self.upload_dir.resolve()) and is_image_file(p) for p in paths)
        if not ok:
            for p in paths:
                if p.resolve().is_relative_to(self.upload_dir.resolve()):
                    p.unlink(missing_ok=True)
            if len(paths) > self.max_files:
                return _refuse(413, f"at most {self.max_files} files per upload")
            return _refuse(415, "the UI accepts image files only (JPEG, PNG, WebP, BMP, GIF, TIFF)")
        self.cache.sweep()
        return None


_TEXT_TYPES = (b"text/", b"application/json", b"application/javascript")
MAX_REWRITTEN_BODY = 32 << 20  # a buffered answer larger than this is passed on as it is (none is near it)


def _hiding(send: Send, aliases: PathAliases) -> Send:
    """``send`` with private folders hidden in text answers and CORS grants dropped (see the module doc).
    An answer with a Content-Length is rewritten whole (and its length corrected); a streamed one
    chunk by chunk."""
    state: dict = {"start": None, "chunks": [], "size": 0, "stream": None}

    async def hiding_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if not k.lower().startswith(b"access-control-")]
            ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"").lower()
            message = {**message, "headers": headers}
            if not ctype.startswith(_TEXT_TYPES):
                state["stream"] = False
            elif any(k.lower() == b"content-length" for k, _ in headers):
                state["start"] = message  # held until the body is whole
                return
            else:
                state["stream"] = aliases.streaming()
            await send(message)
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        more = message.get("more_body", False)
        if state["start"] is not None:  # buffered
            state["chunks"].append(message.get("body", b""))
            state["size"] += len(state["chunks"][-1])
            if more and state["size"] <= MAX_REWRITTEN_BODY:
                return
            body = b"".join(state["chunks"])
            body = aliases.hide(body) if state["size"] <= MAX_REWRITTEN_BODY else body
            start, state["start"], state["chunks"] = state["start"], None, []
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body, "more_body": more})
            state["stream"] = False
            return
        hider = state["stream"]
        if hider:
            data = hider.feed(message.get("body", b""))
            if not more:
                data += hider.flush()
            message = {**message, "body": data}
        await send(message)

    return hiding_send


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
