"""Long-lived streams (the UI's server-sent events) under caps and deadlines of their own.

A UI tab holds two connections open for as long as it lives: Gradio's heartbeat
(``/ui/gradio_api/heartbeat/SESSION``, an event every 15 s) and the queue's event stream. Such a
connection is busy, so the connection shedder (app/api/connections.py) never evicts it, and 700 held
heartbeats filled a 624-connection cap: every new client got 503 while they stayed. Here, per process:

- at most ``max_streams`` streams at once, and at most ``max_streams_per_client`` from one client
  address: a stream over either cap is answered 503 ``too_many_streams`` at once, so streams can never
  hold more than their share of the connections and ordinary requests always find a slot;
- a heartbeat is closed when its session has sent nothing else for ``idle_seconds`` (a tab left open
  and unused, or a heartbeat held by a script that never uses the UI);
- every other stream (an event's results) is closed ``max_seconds`` after it opened.

The address is the peer's, or the one a trusted proxy forwarded (``--forwarded-allow-ips``).
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from urllib.parse import parse_qs

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_body

log = logging.getLogger(__name__)

_HEARTBEAT = re.compile(r"/ui/gradio_api/heartbeat/([A-Za-z0-9_-]{1,100})")
_STREAMS = re.compile(r"/ui/gradio_api/(?:queue/data|upload_progress|call/[A-Za-z0-9_-]+/[A-Za-z0-9_-]+)")
CHECK_EVERY = 1.0
MAX_SESSIONS = 100_000  # activity times kept (oldest forgotten first)


@dataclass(frozen=True)
class StreamLimits:
    max_streams: int = 256
    max_streams_per_client: int = 16
    idle_seconds: float = 900.0
    max_seconds: float = 600.0


class StreamLimitMiddleware:
    """Applies the module doc's caps and deadlines to the UI's streams."""

    def __init__(self, app: ASGIApp, limits: StreamLimits | None = None):
        self.app, self.limits = app, limits or StreamLimits()
        self.open, self.per_client = 0, Counter()
        self.active: OrderedDict[str, float] = OrderedDict()  # session → when it last did something

    def touch(self, session: str) -> None:
        """Marks ``session`` active now (monotonic clock); beyond ``MAX_SESSIONS`` the least recently active
        one is forgotten."""
        self.active[session] = time.monotonic()
        self.active.move_to_end(session)
        while len(self.active) > MAX_SESSIONS:
            self.active.popitem(last=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/ui/gradio_api/"):
            await self.app(scope, receive, send)
            return
        heartbeat = _HEARTBEAT.fullmatch(path)
        session = heartbeat.group(1) if heartbeat else _session_of(scope)
        if session and not heartbeat:
            self.touch(session)
        if scope.get("method") != "GET" or not (heartbeat or _STREAMS.fullmatch(path)):
            await self.app(scope, receive, send)
            return
        client = str((scope.get("client") or ("?",))[0])
        lim = self.limits
        if self.open >= lim.max_streams or self.per_client[client] >= lim.max_streams_per_client:
            await _too_many(send)
            return
        self.open += 1
        self.per_client[client] += 1
        if heartbeat and session not in self.active:
            self.touch(session)  # a new session starts active
        try:
            await self._run(scope, receive, send, session if heartbeat else None)
        finally:
            self.open -= 1
            self.per_client[client] -= 1
            if self.per_client[client] <= 0:
                del self.per_client[client]

    def _expired(self, opened: float, session: str | None) -> bool:
        now = time.monotonic()
        if session is not None:
            return now - self.active.get(session, opened) > self.limits.idle_seconds
        return now - opened > self.limits.max_seconds

    async def _run(self, scope: Scope, receive: Receive, send: Send, session: str | None) -> None:
        opened, started, ended = time.monotonic(), False, False

        async def watched_send(message: Message) -> None:
            nonlocal started, ended
            started = started or message["type"] == "http.response.start"
            ended = ended or (message["type"] == "http.response.body" and not message.get("more_body", False))
            await send(message)

        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                while not self._expired(opened, session):
                    await anyio.sleep(CHECK_EVERY)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await self.app(scope, receive, watched_send)
            tg.cancel_scope.cancel()
        if started and not ended:  # closed by a deadline: end the stream cleanly
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            log.info("closed a UI stream after its deadline (%s)", "idle session" if session else "max_seconds")


def _session_of(scope: Scope) -> str | None:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("session_hash")
    return values[0][:100] if values else None


async def _too_many(send: Send) -> None:
    body = json.dumps(error_body(503, "too many open UI streams from this client or in all; close some tabs and "
                                      "try again", "too_many_streams")).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", b"5")]})
    await send({"type": "http.response.body", "body": body})
