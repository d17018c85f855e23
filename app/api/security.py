"""Who may talk to the server: Host-header check, optional bearer token, and Gradio routes turned off.

- **Host check** (DNS rebinding): a web page on another site can make a browser send requests to
  ``127.0.0.1`` under its own host name, and read the answers, unless the server refuses Host
  headers it does not serve. `ltd serve` on a loopback address answers only ``localhost``,
  ``127.0.0.1`` and ``[::1]`` (plus ``--allowed-host``).
- **Token**: with ``LTD_API_TOKEN`` set, every route except ``/api/health`` and ``/login`` needs
  ``Authorization: Bearer TOKEN`` or the cookie that ``/login`` sets after the token is typed into
  its form (browsers cannot add headers to page loads and ``<img>`` requests). The cookie holds a
  hash of the token, not the token; comparisons are constant-time.
- **Gradio's URL routes**: ``/ui/gradio_api/file=http…`` fetches a URL on the server's behalf and
  ``/ui/gradio_api/proxy=…`` relays to another Gradio app; this UI needs neither, so both answer 403.
"""
from __future__ import annotations

import hashlib
import hmac
import html
from urllib.parse import parse_qs, quote

from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "ltd_token"
OPEN_PATHS = ("/api/health", "/login")
_BLOCKED_UI = ("/ui/gradio_api/file=http", "/ui/gradio_api/proxy=", "/ui/gradio_api/file=//")


def _error(status: int, error: str, detail: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def _host(scope: Scope) -> str:
    raw = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1").strip().lower()
    if raw.startswith("["):  # [::1]:8000
        return raw[1:].split("]", 1)[0]
    return raw.rsplit(":", 1)[0] if raw.count(":") == 1 else raw


def cookie_value(token: str) -> str:
    return hashlib.sha256(f"ltd-ui-session:{token}".encode()).hexdigest()


class AccessMiddleware:
    """Host allow-list, bearer token, and the Gradio routes this app does not use (see the module doc)."""

    def __init__(self, app: ASGIApp, *, token: str | None, allowed_hosts: list[str] | None):
        self.app = app
        self.token = token or None
        self.hosts = None if allowed_hosts is None or "*" in allowed_hosts else {h.lower() for h in allowed_hosts}

    def _authorised(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer ") and hmac.compare_digest(auth[7:].strip().encode(), self.token.encode()):
            return True
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(value.encode(), cookie_value(self.token).encode()):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self.hosts is not None and _host(scope) not in self.hosts:
            response: Response = _error(400, "host_not_allowed", "this server does not answer for that Host header")
        elif path.startswith(_BLOCKED_UI):
            response = _error(403, "forbidden", "the UI does not fetch or relay URLs")
        elif self.token and path == "/login":
            response = await login(scope, receive, self.token)
        elif self.token and not path.startswith(OPEN_PATHS) and not self._authorised(scope):
            wants_page = scope.get("method") == "GET" and b"text/html" in dict(scope["headers"]).get(b"accept", b"")
            if wants_page and path.startswith(("/ui", "/docs", "/redoc")):
                response = RedirectResponse(f"/login?next={quote(path)}", status_code=303)
            else:
                response = _error(401, "unauthorized", "this server needs a token: send 'Authorization: Bearer "
                                  "TOKEN' (the LTD_API_TOKEN it was started with), or log in at /login",
                                  headers={"WWW-Authenticate": "Bearer"})
        else:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await response(scope, receive, send)


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


async def login(scope: Scope, receive: Receive, token: str) -> Response:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if scope.get("method") == "GET":
        nxt = _safe_next(query.get("next", ["/ui"])[0])
        return HTMLResponse(_FORM.format(error="", next=html.escape(nxt)))
    if scope.get("method") != "POST":
        return _error(405, "method_not_allowed", "GET or POST /login")
    body, more = b"", True
    while more and len(body) <= 8192:  # a token form is tiny; the body limit middleware caps it too
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    form = parse_qs(body[:8192].decode("utf-8", "replace"))
    nxt = _safe_next(form.get("next", ["/ui"])[0])
    given = form.get("token", [""])[0]
    if not hmac.compare_digest(given.encode(), token.encode()):
        page = _FORM.format(error='<p class="err">Wrong token.</p>', next=html.escape(nxt))
        return HTMLResponse(page, status_code=401)
    response = RedirectResponse(nxt, status_code=303)
    secure = scope.get("scheme") == "https"
    response.set_cookie(COOKIE, cookie_value(token), httponly=True, samesite="strict", secure=secure, path="/")
    return response
