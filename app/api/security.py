"""Who may talk to the server: Host-header check, optional bearer token, and Gradio routes turned off.

- **Host check** (DNS rebinding): a web page on another site can make a browser send requests to
  ``127.0.0.1`` under its own host name, and read the answers, unless the server refuses Host
  headers it does not serve. `ltd serve` on a loopback address answers only ``localhost``,
  ``127.0.0.1`` and ``[::1]`` (plus ``--allowed-host``).
- **Token**: with ``LTD_API_TOKEN`` set, every route except exactly ``/api/health`` and ``/login``
  needs ``Authorization: Bearer TOKEN`` or the session cookie that ``/login`` sets after the token is
  typed into its form (browsers cannot add headers to page loads and ``<img>`` requests). The
  cookie is signed and expires (app/api/login.py); comparisons are constant-time; an address that
  sends too many wrong tokens is locked: it gets one guess every few seconds, the rest are answered
  429 unread, and the right token still gets in.
- **Gradio's URL routes**: ``/ui/gradio_api/file=http…`` fetches a URL on the server's behalf and
  ``/ui/gradio_api/proxy=…`` relays to another Gradio app; both answer 403 here, before the token
  check (the UI guard, app/api/ui_guard.py, allows only the UI's own routes, so these and every other
  Gradio route the UI does not use are refused there too; URLs inside event payloads as well).
"""
from __future__ import annotations

import hmac
from urllib.parse import quote

from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.login import COOKIE, FailureLimiter, Sessions, client_address, json_error, login, too_many

OPEN_PATHS = frozenset({"/api/health", "/login"})  # exact paths: /api/healthz or /loginx need the token
_BLOCKED_UI = ("/ui/gradio_api/file=http", "/ui/gradio_api/proxy=", "/ui/gradio_api/file=//", "/ui/gradio_api/file/")


def _host(scope: Scope) -> str:
    raw = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1").strip().lower()
    if raw.startswith("["):  # [::1]:8000
        return raw[1:].split("]", 1)[0]
    return raw.rsplit(":", 1)[0] if raw.count(":") == 1 else raw


class AccessMiddleware:
    """Host allow-list, bearer token, and the Gradio routes this app does not use (see the module doc)."""

    def __init__(self, app: ASGIApp, *, token: str | None, allowed_hosts: list[str] | None,
                 session_seconds: int = 12 * 3600, limiter: FailureLimiter | None = None,
                 write_token: str | None = None):
        self.app = app
        self.token = token or None
        self.write_token = write_token or None  # also reads (its routes check it themselves for writes)
        self.hosts = None if allowed_hosts is None or "*" in allowed_hosts else {h.lower() for h in allowed_hosts}
        self.sessions = Sessions(self.token, session_seconds) if self.token else None
        self.limiter = limiter or FailureLimiter()

    def _session(self, headers: dict) -> bool | None:
        """True: a live session cookie; False: none, or an expired one; None: a forged one (a guess)."""
        forged = False
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                valid = self.sessions.check(value)
                if valid:
                    return True
                forged = forged or valid is None  # an expired cookie is not a guess
        return None if forged else False

    def _authorised(self, scope: Scope, locked: bool) -> bool:
        """True for the token or a live session cookie; a wrong token or a forged cookie is counted.
        ``locked``: the address is locked out and this request's bearer token may be looked at."""
        headers = dict(scope["headers"])
        session = self._session(headers)
        if session:
            return True
        auth = headers.get(b"authorization", b"").decode("latin-1")
        guessed = session is None
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip().encode()
            if hmac.compare_digest(given, self.token.encode()) or (
                    self.write_token is not None and hmac.compare_digest(given, self.write_token.encode())):
                if locked:
                    self.limiter.forgive(client_address(scope))
                return True
            guessed = True
        if guessed:
            self.limiter.failed(client_address(scope))
        return False

    def _locked_out(self, scope: Scope, path: str) -> Response | None:
        """The 429 for a locked address, unless this request may be looked at: a live session cookie
        always is (it cannot be guessed), a token or a login form once every few seconds."""
        address = client_address(scope)
        wait = self.limiter.blocked_for(address)
        if not wait or (path != "/login" and self._session(dict(scope["headers"]))):
            return None
        return None if self.limiter.may_try(address) else too_many(wait)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self.hosts is not None and _host(scope) not in self.hosts:
            response: Response = json_error(400, "host_not_allowed",
                                            "this server does not answer for that Host header")
        elif path.startswith(_BLOCKED_UI):
            response = json_error(403, "forbidden", "the UI does not fetch or relay URLs")
        elif self.token and path != "/api/health" and (refusal := self._locked_out(scope, path)) is not None:
            response = refusal
        elif self.token and path == "/login":
            response = await login(scope, receive, self.token, self.sessions, self.limiter)
        elif self.token and path not in OPEN_PATHS and not self._authorised(
                scope, locked := bool(self.limiter.blocked_for(client_address(scope)))):
            wants_page = scope.get("method") == "GET" and b"text/html" in dict(scope["headers"]).get(b"accept", b"")
            if locked:
                response = too_many(self.limiter.blocked_for(client_address(scope)))  # answered like the unread ones
            elif wants_page and path.startswith(("/ui", "/docs", "/redoc")):
                response = RedirectResponse(f"/login?next={quote(path)}", status_code=303)
            else:
                response = json_error(401, "unauthorized", "this server needs a token: send 'Authorization: Bearer "
                                  "TOKEN' (the LTD_API_TOKEN it was started with), or log in at /login",
                                  headers={"WWW-Authenticate": "Bearer"})
        else:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await response(scope, receive, send)
