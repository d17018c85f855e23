"""Slow clients are shed: header and body read deadlines, a connection cap below the descriptor limit.

uvicorn (0.54) has no request-header or body timeout: a connection that never finishes its headers
stays open for ever. Under a 1,024-descriptor limit, 1,100 of them made /api/health stop answering,
and asyncio's accept loop logged ``Too many open files`` ~14,000 times a second (180 MB in 30 s):
on EMFILE it logs and re-arms once per pending connection. ``GuardedHTTPProtocol`` wraps uvicorn's
HTTP protocol (httptools when installed, else h11) and adds, per worker process:

- **Header deadline**: a request's headers must be complete ``header_timeout`` seconds after its
  first byte (after the connection opens, for the first request); else 408 and close.
- **Body deadline**: while the server waits for a body, the client gets ``body_timeout`` seconds plus
  one second per ``min_body_rate`` bytes received so far (Apache's mod_reqtimeout rule); time during
  which the server itself stopped reading (backpressure) does not count. Else 408 and close.
- **Send deadline**: a response the client does not read for ``send_timeout`` seconds is dropped.
- **Connection cap** below the descriptor limit (the soft RLIMIT_NOFILE less what the process holds at
  start and a reserve of max(64, 1/8)): a connection over the cap evicts the oldest that is idle, still
  sending headers, or sending a body behind the minimum rate (more than ``SLOW_GRACE`` seconds behind
  ``min_body_rate``: 700 bodies of one byte every 4 s, to /login with no token, held every slot for the
  whole body deadline); when there is none, the new one gets 503 and is closed. ``accept`` never
  meets EMFILE, and a real client (``/api/health``) always gets a slot. (Long-lived answers, the UI's
  event streams, have caps of their own: app/api/streams.py.)
- Descriptor exhaustion from elsewhere is logged once per ``QUIET_SECONDS``, with a count.

One timer per process checks every connection once a second. uvloop, httptools, several workers:
nothing here depends on the event loop's implementation or on the parser's internals beyond the
``cycle`` and ``flow`` attributes that uvicorn's HTTP protocols share.
"""
from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import time
from dataclasses import dataclass

from uvicorn.protocols.http.auto import AutoHTTPProtocol

log = logging.getLogger(__name__)

TICK = 1.0
QUIET_SECONDS = 10.0
SLOW_GRACE = 1.0  # seconds a body may lag behind min_body_rate before it can be evicted under pressure
_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    """The deadlines and the cap (app/api/settings.py has the defaults' reasons)."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    min_body_rate: float = 8192.0
    send_timeout: float = 60.0
    max_connections: int = 0  # 0: from the descriptor limit

    @staticmethod
    def _soft_limit() -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return 1 << 20 if soft == resource.RLIM_INFINITY else soft

    @classmethod
    def backlog(cls) -> int:
        """The listen backlog, which is also how many connections asyncio accepts in one go before any
        of them reaches the cap: 1/8 of the descriptor limit, 64 to 2,048 (uvicorn's default). Measured
        under a 1,024 limit with 1,100 slow clients: 128 kept /api/health under 0.13 s; 2,048 overran
        the descriptors (EMFILE) and health took 1.5 s or failed; 64 dropped SYNs (connects took 12 s)."""
        return max(64, min(2048, cls._soft_limit() // 8))

    def cap(self) -> int:
        """Connections one process may hold: under the soft descriptor limit, less the descriptors held
        at start, two accept batches (one of new connections, one of those they evict, whose sockets
        close on the loop's next turn) and a reserve of max(64, 1/8) for the server's own files."""
        soft = self._soft_limit()
        try:
            held = len(os.listdir("/proc/self/fd"))
        except OSError:
            held = 64
        cap = max(16, soft - held - 2 * self.backlog() - max(64, soft // 8))
        return min(cap, self.max_connections) if self.max_connections > 0 else cap


class _Shedder:
    """Per server (one per worker process): the cap, the once-a-second check, quiet logging."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits):
        self.loop, self.limits = loop, limits
        self.cap = limits.cap()
        self.open: dict = {}  # our connections, least recently active first (a dict keeps insertion order)
        self.closing: set = set()  # closed by us, not yet gone (their descriptors are still open)
        self.timer: asyncio.TimerHandle | None = None
        self.shed = {"header timeout": 0, "body timeout": 0, "send timeout": 0, "evicted": 0, "refused": 0}
        self.last_report = -QUIET_SECONDS  # the first connections shed are reported at once
        quiet_accept_errors(loop)
        log.info("connections: at most %d per process; headers within %gs, bodies at %g B/s after %gs",
                 self.cap, limits.header_timeout, limits.min_body_rate, limits.body_timeout)

    def arm(self) -> None:
        if self.timer is None:
            self.timer = self.loop.call_later(TICK, self.tick)

    def tick(self) -> None:
        self.timer = None
        now = time.monotonic()
        for proto in list(self.open):
            proto.ltd_check(now)
        self.report(now)
        if self.open:
            self.arm()

    def count(self, why: str) -> None:
        self.shed[why] += 1

    def report(self, now: float) -> None:
        if now - self.last_report >= QUIET_SECONDS and any(self.shed.values()):
            shed = ", ".join(f"{n} {why}" for why, n in self.shed.items() if n)
            log.warning("slow or excess connections closed: %s", shed)
            self.shed = dict.fromkeys(self.shed, 0)
            self.last_report = now

    def admit(self, new) -> bool:
        """Track ``new`` and make room for it by closing the oldest connections that are idle or still
        sending headers; False when there are none (every connection is busy: ``new`` is refused)."""
        self.open[new] = None
        excess = len(self.open) - len(self.closing) - self.cap
        for victim in self.open:  # closing one does not change the dict
            if excess <= 0:
                break
            if victim is not new and victim not in self.closing and victim.ltd_evictable():
                victim.ltd_close(_503 if victim._between_requests() else _408, "evicted")
                excess -= 1
        return excess <= 0

    def gone(self, proto) -> None:
        self.open.pop(proto, None)
        self.closing.discard(proto)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log 'out of system resource' (EMFILE on accept) once per QUIET_SECONDS, not once per attempt."""
    previous = loop.get_exception_handler()
    state = {"last": 0.0, "count": 0}

    def handler(lp: asyncio.AbstractEventLoop, context: dict) -> None:
        if "out of system resource" in str(context.get("message", "")):
            state["count"] += 1
            now = time.monotonic()
            if now - state["last"] < QUIET_SECONDS:
                return
            log.error("cannot accept connections: %s (%d times in the last %.0f s; raise the descriptor limit "
                      "or lower max_connections)", context.get("exception"), state["count"], QUIET_SECONDS)
            state.update(last=now, count=0)
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with TCP_NODELAY on every connection and the deadlines and cap of the
    module doc. (asyncio sets TCP_NODELAY only on sockets that report ``proto == IPPROTO_TCP``; those
    that worker processes accept from an inherited socket report 0, and small keep-alive answers then
    waited ~40 ms each: 320 instead of 1,000 requests/s with --workers 2.)"""

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = getattr(config, "ltd_limits", None) or ConnectionLimits()
        shedder = getattr(server_state, "ltd_shedder", None)
        if shedder is None:
            shedder = server_state.ltd_shedder = _Shedder(self.loop, limits)
        self.ltd_shedder, self.ltd_limits = shedder, limits
        self.ltd_since = time.monotonic()  # when the current wait on the client began
        self.ltd_cycle = None  # the request whose body we wait for
        self.ltd_waited = 0.0  # seconds of that wait that count against the client
        self.ltd_received = 0
        self.ltd_last = self.ltd_since
        self.ltd_stalled_since: float | None = None

    # ---- states ------------------------------------------------------------------------------------
    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def ltd_evictable(self) -> bool:
        """Idle between requests, still sending a request's headers (nothing of the app's is lost), or
        sending a body more than SLOW_GRACE seconds behind the minimum rate (its request would time out)."""
        if self.transport.is_closing():
            return False
        if self._between_requests():
            return True
        cycle = self.cycle
        if not cycle.more_body or cycle.disconnected or cycle.response_started:
            return False
        waited = self.ltd_waited + (0.0 if self.flow.read_paused else time.monotonic() - self.ltd_last)
        return waited - self.ltd_received / self.ltd_limits.min_body_rate > SLOW_GRACE

    def ltd_close(self, answer: bytes, why: str) -> None:
        """Write ``answer`` (raw HTTP bytes; ``b""`` for none) and close, counted under ``why`` in the report
        of connections shed; nothing when the connection is already closing."""
        if self.transport.is_closing():
            return
        self.ltd_shedder.count(why)
        self.ltd_shedder.closing.add(self)
        try:
            self.transport.write(answer)
        except (RuntimeError, OSError):
            pass
        self.transport.close()

    # ---- uvicorn's protocol interface ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        """Sets TCP_NODELAY (on TCP sockets), starts the header clock and arms the check; a connection over
        the cap that no other one can make room for is answered 503 and closed."""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # not TCP (a Unix socket)
                pass
        super().connection_made(transport)
        self.ltd_since = time.monotonic()
        if not self.ltd_shedder.admit(self):
            self.ltd_close(_503, "refused")
        self.ltd_shedder.arm()

    def connection_lost(self, exc) -> None:
        """Forgets the connection in the shedder, then lets uvicorn's protocol clean up."""
        self.ltd_shedder.gone(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Passes ``data`` to uvicorn's parser, then starts a new request's body clock (headers complete), the
        header clock (a kept-alive connection's next request), or counts the body bytes received."""
        before = self.cycle  # the hot path: one clock read per request, none per body chunk
        idle = (before is None or before.response_complete) and self.timeout_keep_alive_task is not None
        super().data_received(data)
        cycle = self.cycle
        if cycle is not before:  # headers complete: a new request; its body clock starts
            self.ltd_cycle, self.ltd_waited, self.ltd_received = cycle, 0.0, 0
            self.ltd_last = time.monotonic()
            recent = self.ltd_shedder.open
            recent.pop(self, None)
            recent[self] = None  # the most recently active: evicted last
        elif idle:  # the first bytes of the next request on a kept-alive connection: its header clock starts
            self.ltd_since = time.monotonic()
        elif cycle is not None and cycle is self.ltd_cycle:
            self.ltd_received += len(data)

    # ---- the once-a-second check ---------------------------------------------------------------------
    def ltd_check(self, now: float) -> None:
        """The once-a-second check (``now``: monotonic seconds): 408 and close past the header or body
        deadline; a response the client has not read for ``send_timeout`` seconds is dropped."""
        if self.transport is None or self.transport.is_closing():
            return
        lim, cycle = self.ltd_limits, self.cycle
        if self._between_requests():
            waiting_for_headers = cycle is None or self.timeout_keep_alive_task is None
            if waiting_for_headers and now - self.ltd_since > lim.header_timeout:
                self.ltd_close(_408, "header timeout")
            return
        if cycle.more_body and not cycle.disconnected:  # the app may be waiting for the body
            if not self.flow.read_paused:  # our own backpressure is not the client's slowness
                self.ltd_waited += now - self.ltd_last
            self.ltd_last = now
            if self.ltd_waited > lim.body_timeout + self.ltd_received / lim.min_body_rate:
                self.ltd_close(_408 if not cycle.response_started else b"", "body timeout")
            return
        if self.flow.write_paused:  # the response waits for the client to read
            self.ltd_stalled_since = self.ltd_stalled_since or now
            if now - self.ltd_stalled_since > lim.send_timeout:
                self.ltd_close(b"", "send timeout")
        else:
            self.ltd_stalled_since = None
