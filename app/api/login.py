"""Browser sessions for a server with a token: the /login page, its cookie, and a limit on wrong tokens.

- **The cookie** is ``EXPIRY.NONCE.MAC``: an expiry time, a random nonce and an HMAC-SHA256 of both
  under a key derived from the token. It holds nothing from which the token can be computed, it
  stops working at its expiry (and whenever the token changes), and every worker process of the
  same server checks it without shared state (the key comes from the token they all know).
- **Wrong tokens** (a bearer token, a session cookie whose MAC does not match, a wrong /login form)
  are counted per client address; after ``max_failures`` within ``window`` seconds that address is
  answered 429 for the rest of the window, whatever it sends: guessing a token gets ~20 tries a
  minute per address instead of thousands a second. The count lives in each worker process.
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

from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import Receive, Scope

COOKIE = "ltd_token"


def json_error(status: int, error: str, detail: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


class Sessions:
    """Makes and checks the login cookie for one token (see the module doc)."""

    def __init__(self, token: str, max_age: int):
        self.max_age = max_age
        self._key = hmac.new(token.encode(), b"ltd-ui-session-v2", hashlib.sha256).digest()

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def make(self, now: float | None = None) -> str:
        payload = f"{int((now or time.time()) + self.max_age)}.{secrets.token_hex(16)}"
        return f"{payload}.{self._mac(payload)}"

    def check(self, value: str, now: float | None = None) -> bool | None:
        """True: a valid session; False: expired (a real cookie, not a guess); None: forged or malformed."""
        payload, _, mac = value.rpartition(".")
        expiry = payload.split(".", 1)[0]
        if not expiry.isdigit() or not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        return int(expiry) > (now or time.time())


class FailureLimiter:
    """Wrong tokens per client address in a sliding window (thread-safe, bounded memory)."""

    def __init__(self, max_failures: int = 20, window: float = 60.0, max_clients: int = 10_000):
        self.max_failures, self.window, self.max_clients = max_failures, window, max_clients
        self._fails: OrderedDict[str, deque] = OrderedDict()
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
        now = now or time.monotonic()
        with self._lock:
            self._recent(client, now).append(now)
            self._fails.move_to_end(client)


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "?"


def too_many(seconds: float) -> JSONResponse:
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
        limiter.failed(client_address(scope))
        page = _FORM.format(error='<p class="err">Wrong token.</p>', next=html.escape(nxt))
        return HTMLResponse(page, status_code=401)
    response = RedirectResponse(nxt, status_code=303)
    secure = scope.get("scheme") == "https"
    response.set_cookie(COOKIE, sessions.make(), max_age=sessions.max_age, httponly=True, samesite="strict",
                        secure=secure, path="/")
    return response
