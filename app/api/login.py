"""Browser sessions for a server with a token: the /login page, its cookie, and a limit on wrong tokens.

- **The cookie** is ``NONCE.TIMESTAMP.MAC`` (``itsdangerous.TimestampSigner``): a random nonce, the
  time it was made and an HMAC-SHA256 of both under a key derived from the token. It holds nothing from
  which the token can be computed, it stops working ``max_age`` seconds after it was made (and whenever
  the token changes), and every worker process of the same server checks it without shared state (the
  key comes from the token they all know).
- **Wrong tokens** (a bearer token, a session cookie whose MAC does not match, a wrong /login form)
  are counted per client address; after ``max_failures`` within ``window`` seconds that address is
  *locked*: for the rest of the window it gets one guess every ``window / max_failures`` seconds, the
  others are answered 429 without being looked at. So guessing a token gets ~20 tries a minute per
  address instead of thousands a second, while the right token (or a live session cookie, which cannot
  be guessed) still gets in: a locked-out user who finds the right token is never kept out. The count
  lives in each worker process; with ``--workers N`` each process allows ``max_failures / N`` (rounded
  up), so the server as a whole stays near the limit. The address is the peer's unless a trusted proxy
  forwards it (``--forwarded-allow-ips``).
"""
from __future__ import annotations

import hashlib
import hmac
import html
import secrets
import threading
import time
from collections import OrderedDict, deque
from urllib.parse import parse_qs

from itsdangerous import BadSignature, SignatureExpired, TimestampSigner
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import Receive, Scope

COOKIE = "ltd_token"


def json_error(status: int, error: str, detail: str, headers: dict | None = None) -> JSONResponse:
    """An error answer with this status: ``{"error": error, "detail": detail}`` (and these headers)."""
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


class _Signer(TimestampSigner):
    """A TimestampSigner whose clock a test may set (``now``)."""

    now: float | None = None

    def get_timestamp(self) -> int:
        return int(self.now if self.now is not None else time.time())


class Sessions:
    """Makes and checks the login cookie for one token (see the module doc)."""

    def __init__(self, token: str, max_age: int):
        self.max_age = max_age
        self._signer = _Signer(token, salt="ltd-ui-session-v3", digest_method=hashlib.sha256)

    def make(self, now: float | None = None) -> str:
        """A new cookie value: a random nonce signed with the time ``now`` (epoch seconds; None: the clock)."""
        signer = _Signer(self._signer.secret_keys, salt=self._signer.salt, digest_method=hashlib.sha256)
        signer.now = now
        return signer.sign(secrets.token_hex(16)).decode()

    def check(self, value: str, now: float | None = None) -> bool | None:
        """True: a valid session; False: expired (a real cookie, not a guess); None: forged or malformed."""
        signer = self._signer
        if now is not None:
            signer = _Signer(signer.secret_keys, salt=signer.salt, digest_method=hashlib.sha256)
            signer.now = now
        try:
            signer.unsign(value, max_age=self.max_age)
        except SignatureExpired:
            return False
        except BadSignature:  # BadTimeSignature, a malformed value, another token's cookie
            return None
        return True


class FailureLimiter:
    """Wrong tokens per client address in a sliding window (thread-safe, bounded memory)."""

    def __init__(self, max_failures: int = 20, window: float = 60.0, max_clients: int = 10_000):
        self.max_failures, self.window, self.max_clients = max_failures, window, max_clients
        self._fails: OrderedDict[str, deque] = OrderedDict()
        self._tried: OrderedDict[str, float] = OrderedDict()  # locked clients: when a credential was last looked at
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque:
        q = self._fails.get(client)
        if q is None:
            q = self._fails[client] = deque()
            while len(self._fails) > self.max_clients:
                self._fails.popitem(last=False)
        while q and q[0] <= now - self.window:
            q.popleft()
        return q

    def blocked_for(self, client: str, now: float | None = None) -> float:
        """Seconds until ``client`` may try again (0: it may)."""
        now = now or time.monotonic()
        with self._lock:
            if client not in self._fails:
                return 0.0
            q = self._recent(client, now)
            return q[0] + self.window - now if len(q) >= self.max_failures else 0.0

    def failed(self, client: str, now: float | None = None) -> None:
        """Count one wrong token from ``client`` at ``now`` (monotonic seconds; None: the clock)."""
        now = now or time.monotonic()
        with self._lock:
            self._recent(client, now).append(now)
            self._fails.move_to_end(client)

    def may_try(self, client: str, now: float | None = None) -> bool:
        """For a locked client: whether this request's credential may be looked at (one every
        ``window / max_failures`` seconds); the caller counts it with ``failed`` when it is wrong."""
        now = now or time.monotonic()
        with self._lock:
            last = self._tried.get(client)
            if last is not None and now - last < self.window / self.max_failures:
                return False
            self._tried[client] = now
            while len(self._tried) > self.max_clients:
                self._tried.popitem(last=False)
            return True

    def forgive(self, client: str) -> None:
        """The client showed the right token: its failures are forgotten."""
        with self._lock:
            self._fails.pop(client, None)
            self._tried.pop(client, None)


def client_address(scope: Scope) -> str:
    """The client's address (the peer's, or the one a trusted proxy forwarded); ``"?"`` when unknown."""
    client = scope.get("client")
    return str(client[0]) if client else "?"


def too_many(seconds: float) -> JSONResponse:
    """The 429 for a locked address, with ``Retry-After``: ``seconds`` rounded up, at least 1."""
    wait = max(1, int(seconds + 0.999))
    return json_error(429, "too_many_requests", f"too many wrong tokens from this address; try again in {wait} s",
                  headers={"Retry-After": str(wait)})


_FORM = """<!doctype html><meta charset="utf-8"><title>LTD retrieval: log in</title>
<style>body{{font:16px system-ui,sans-serif;max-width:26rem;margin:12vh auto;padding:0 1rem}}
input{{font:inherit;width:100%;padding:.5rem;margin:.5rem 0;box-sizing:border-box}}
button{{font:inherit;padding:.5rem 1rem}}.err{{color:#b42318}}</style>
<h1>LTD retrieval</h1><p>This server needs its access token (the <code>LTD_API_TOKEN</code> it was started with).</p>
{error}<form method="post" action="/login"><input type="hidden" name="next" value="{next}">
<input type="password" name="token" autocomplete="current-password" placeholder="token" autofocus required>
<button type="submit">Log in</button></form>"""


def _safe_next(value: str) -> str:
    """Only local paths: never an open redirect to another site."""
    return value if value.startswith("/") and not value.startswith("//") and "\\" not in value else "/ui"


async def login(scope: Scope, receive: Receive, token: str, sessions: Sessions, limiter: FailureLimiter) -> Response:
    """``/login``: GET shows the form; POST checks its token: right, a session cookie and 303 to ``next`` (a
    local path); wrong, counted and 401 with the form again (429 when locked). Other methods: 405."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if scope.get("method") == "GET":
        nxt = _safe_next(query.get("next", ["/ui"])[0])
        return HTMLResponse(_FORM.format(error="", next=html.escape(nxt)))
    if scope.get("method") != "POST":
        return json_error(405, "method_not_allowed", "GET or POST /login")
    body, more = b"", True
    while more and len(body) <= 8192:  # a token form is tiny; the body limit middleware caps it too
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    form = parse_qs(body[:8192].decode("utf-8", "replace"))
    nxt = _safe_next(form.get("next", ["/ui"])[0])
    given = form.get("token", [""])[0]
    if not hmac.compare_digest(given.encode(), token.encode()):
        locked = limiter.blocked_for(client_address(scope))
        limiter.failed(client_address(scope))
        if locked:
            return too_many(limiter.blocked_for(client_address(scope)))
        page = _FORM.format(error='<p class="err">Wrong token.</p>', next=html.escape(nxt))
        return HTMLResponse(page, status_code=401)
    limiter.forgive(client_address(scope))
    response = RedirectResponse(nxt, status_code=303)
    secure = scope.get("scheme") == "https"
    response.set_cookie(COOKIE, sessions.make(), max_age=sessions.max_age, httponly=True, samesite="strict",
                        secure=secure, path="/")
    return response
