"""Request body limits: 413 for a body over the limit of its path and type, without keeping more than
the limit.

- a multipart/form-data body on an upload endpoint (``/api/search/image``, ``/api/compare``,
  ``/api/caption``, ``/api/caption/check``, ``/api/explain``, the UI's ``/ui/gradio_api/upload``):
  the upload limit plus room for the multipart framing;
- the rest of the UI (Gradio's queue and API calls carry component values, never files): a few
  hundred KB;
- every other body, JSON on the upload endpoints included: 64 KB. (A 10 MB JSON body used to be
  read and parsed there: 4 of them stalled the event loop for seconds.)
"""
from __future__ import annotations

import re
from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_body
from app.api.settings import Settings

UPLOAD_PATHS = frozenset({"/api/search/image", "/api/compare", "/api/caption", "/api/caption/check",
                          "/api/explain", "/ui/gradio_api/upload"})  # exact paths
MULTIPART_OVERHEAD = 64 * 1024  # boundaries, part headers and the small form fields next to the file
DRAIN_BYTES = 1 << 20  # a refused body up to this size is read and dropped before the 413 is sent


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop what is left of a refused body, at most ``budget`` bytes (nothing is kept).

    Closing a connection whose request data is still unread makes the kernel send a reset instead of
    a normal close; a client, or a reverse proxy in front (nginx answers 502), then never sees the 413.
    Bodies beyond the budget are not drained: those connections are cut, as before. The connection's
    body deadline (app/api/connections.py) bounds the time a slow sender can hold the drain."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for request bodies over the limit of their path, without keeping more than the limit.

    A Content-Length over the limit is refused without passing the body on (one up to
    ``DRAIN_BYTES`` is read and dropped first, so that the 413 arrives); a body that streams past
    the limit (chunked, or a lying Content-Length) stops the read with an exception, and whatever
    the app was about to answer is replaced by the 413. ``limit_for(path, content_type)`` returns None
    for no limit.
    """

    def __init__(self, app: ASGIApp, limit_for: Callable[[str, bytes], int | None]):
        self.app, self.limit_for = app, limit_for

    @staticmethod
    async def _send_413(send: Send, limit: int) -> None:
        body = JSONResponse(error_body(413, f"the request body exceeds the limit of {limit:,} bytes"),
                            status_code=413, headers={"Connection": "close"})
        await send({"type": "http.response.start", "status": 413, "headers": body.raw_headers})
        await send({"type": "http.response.body", "body": body.body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = None
        if scope["type"] == "http":
            ctype = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
            limit = self.limit_for(scope["path"], ctype)
        if limit is None:
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        if length.isdigit() and int(length) > limit:
            if int(length) <= DRAIN_BYTES:
                await _drain(receive, DRAIN_BYTES)
            await self._send_413(send, limit)
            return
        total, exceeded, started = 0, False, False

        async def limited_receive() -> Message:
            nonlocal total, exceeded
            if exceeded:
                raise _BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:  # the app answered after the read failed (e.g. FastAPI's 400): answer 413 instead
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await self._send_413(send, limit)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            if not started:
                await _drain(receive, DRAIN_BYTES - total)
                await self._send_413(send, limit)


def is_multipart(content_type: bytes) -> bool:
    """Whether a Content-Type header value is ``multipart/form-data`` (its parameters, the boundary, ignored)."""
    return content_type.split(b";", 1)[0].strip().lower() == b"multipart/form-data"


ADD_PATH = re.compile(r"/api/models/[^/]+/items")  # a multipart add of several images


def body_limits(settings: Settings) -> Callable[[str, bytes], int | None]:
    """The ``limit_for(path, content_type)`` of ``BodyLimitMiddleware``, in bytes (module doc): multipart
    uploads and adds get their file limit plus ``MULTIPART_OVERHEAD``, the UI its JSON limit, the rest
    ``max_json_bytes``; never None."""
    upload = settings.max_upload_bytes + MULTIPART_OVERHEAD
    add = settings.max_add_bytes + MULTIPART_OVERHEAD

    def limit_for(path: str, content_type: bytes = b"") -> int | None:
        if path in UPLOAD_PATHS and is_multipart(content_type):
            return upload  # Gradio's upload route also checks each file against max_file_size
        if ADD_PATH.fullmatch(path) and is_multipart(content_type):
            return add
        if path == "/ui" or path.startswith("/ui/"):
            return settings.max_ui_json_bytes  # the UI's queue and API calls: component values, no files
        return settings.max_json_bytes

    return limit_for
