"""Every error is JSON ``{error, detail}``: the search service's typed errors (mapped to HTTP
statuses here, the service knows nothing of HTTP), FastAPI's 422 validation errors, Starlette's
404/405/413, and a catch-all 500 that logs the traceback. A client that goes away mid-request is
not an error of the server: ``ClientGoneMiddleware`` answers it 499 (nginx's "client closed
request"), which nobody reads but /metrics counts apart from the 5xx, and logs one line."""
from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from search.errors import (
    BadRequest,
    Busy,
    Conflict,
    Forbidden,
    NotFound,
    NotReady,
    SearchError,
    Unsupported,
    UnsupportedMediaType,
)

log = logging.getLogger(__name__)

ERROR_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 406: "not_acceptable",
               413: "payload_too_large", 415: "unsupported_media_type", 422: "validation_error",
               500: "internal", 503: "unavailable"}


def error_body(status: int, detail: str, error: str | None = None, **extra) -> dict:
    """The JSON body of every error answer: ``{"error": code, "detail": text, ...extra}``; ``error``
    defaults to the status's code (``not_found`` for 404) and ``extra`` keys whose value is None are left
    out."""
    if error is None:
        error = ERROR_CODES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    return {"error": error, "detail": detail, **{k: v for k, v in extra.items() if v is not None}}

# The search service's errors → (HTTP status, error code).
SEARCH_ERRORS: dict[type[SearchError], tuple[int, str]] = {
    BadRequest: (400, "bad_request"), NotFound: (404, "not_found"), NotReady: (503, "not_ready"),
    Busy: (503, "busy"), Unsupported: (422, "unsupported"), UnsupportedMediaType: (415, "unsupported_media_type"),
    Forbidden: (403, "forbidden"), Conflict: (409, "conflict")}


def status_of(exc: SearchError) -> tuple[int, str]:
    """The (HTTP status, error code) of a service error, by its most specific class (400 bad_request for
    an unlisted one)."""
    for cls in type(exc).__mro__:
        if cls in SEARCH_ERRORS:
            return SEARCH_ERRORS[cls]
    return 400, "bad_request"


def _issues(errors: list) -> list[dict]:
    out = []
    for e in errors:
        loc = [x if isinstance(x, (str, int)) else str(x) for x in e.get("loc", ())]
        out.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def install_error_handlers(app: FastAPI) -> None:
    """Answer every service error, HTTP error and validation error of ``app`` with ``error_body`` JSON
    (no tracebacks, no server paths); a validation error lists each issue."""
    @app.exception_handler(SearchError)
    async def _search_error(request: Request, exc: SearchError) -> JSONResponse:
        status, code = status_of(exc)
        return JSONResponse(error_body(status, exc.detail, code, **exc.extra), status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            allowed = allowed_methods(app, request.scope)
            if allowed:  # Starlette names only the first route's methods; a path can have several routes
                headers["Allow"] = ", ".join(sorted(allowed))
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        issues = _issues(list(exc.errors()))
        detail = "; ".join(f"{'.'.join(map(str, i['loc'])) or 'request'}: {i['msg']}" for i in issues)
        return JSONResponse(error_body(422, detail[:2000] or "invalid request", errors=issues), status_code=422)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(500, f"internal server error ({type(exc).__name__}); see the server log"),
                            status_code=500)


def allowed_methods(app: FastAPI, scope: Scope) -> set[str]:
    """Every method some route of ``app`` answers on this request's path (the ``Allow`` of a 405)."""
    out: set[str] = set()
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**scope, "method": method}  # routes nest (included routers): ask each whether it fully matches
        if any(route.matches(probe)[0] == Match.FULL for route in app.router.routes):
            out.add(method)
    return out


CLIENT_CLOSED = 499


class ClientGoneMiddleware:
    """A request whose client disconnected (an upload abandoned half way) ends as a 499, not a 500 with
    a traceback: the read that saw the disconnect raises ``ClientDisconnect`` (in our routes, or in the
    mounted Gradio app, whose own error middleware has already started a 500 by the time it re-raises)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gone = started = False

        async def watched_receive() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def relabelled_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if gone:
                    message = {**message, "status": CLIENT_CLOSED}
            await send(message)

        try:
            await self.app(scope, watched_receive, relabelled_send)
        except Exception as exc:
            if not gone and not isinstance(exc, ClientDisconnect):
                raise
            log.info("%s %s: the client went away (%s)", scope.get("method"), scope.get("path"), type(exc).__name__)
            if not started:
                await relabelled_send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
                await send({"type": "http.response.body", "body": b""})
