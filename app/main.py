"""The FastAPI application: ``create_app(settings, service)``.

- A lifespan handler loads the models and indexes once into the ``SearchService`` held on
  ``app.state.service`` (in a background thread when ``settings.load_in_background``, so
  /api/health answers 503 "loading" meanwhile); routers reach it through ``get_service``.
- Every error is JSON ``{error, detail}``: the service's typed errors, FastAPI's 422 validation
  errors, Starlette's 404/405/413, and a catch-all 500 that logs the traceback.
- Request bodies are size-limited before they are read (Content-Length) and while they stream.
- /metrics serves Prometheus counters and latency histograms (app/prom.py).
- The Gradio UI is mounted at /ui when ``settings.ui`` (``ui.blocks.build_ui(service)``).
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.prom import PrometheusMiddleware, Registry
from app.routers import health, media, metrics, search
from app.security import AccessMiddleware
from app.service import SearchService, ServiceError
from app.settings import Settings

log = logging.getLogger(__name__)

UPLOAD_PATHS = ("/api/search/image", "/api/compare", "/ui/gradio_api/upload")
MULTIPART_OVERHEAD = 64 * 1024  # boundaries, part headers and the small form fields next to the file

ERROR_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 406: "not_acceptable",
               413: "payload_too_large", 415: "unsupported_media_type", 422: "validation_error",
               500: "internal", 503: "unavailable"}


def error_body(status: int, detail: str, error: str | None = None, **extra) -> dict:
    if error is None:
        error = ERROR_CODES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    return {"error": error, "detail": detail, **{k: v for k, v in extra.items() if v is not None}}


# ---- request body limits ---------------------------------------------------------------------------
class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for request bodies over the limit of their path, without reading more than the limit.

    A Content-Length over the limit is refused before the body is read; a body that streams past
    the limit (chunked, or a lying Content-Length) stops the read with an exception, and whatever
    the app was about to answer is replaced by the 413. ``limit_for(path)`` returns None for no limit.
    """

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int | None]):
        self.app, self.limit_for = app, limit_for

    @staticmethod
    async def _send_413(send: Send, limit: int) -> None:
        body = JSONResponse(error_body(413, f"the request body exceeds the limit of {limit:,} bytes"),
                            status_code=413, headers={"Connection": "close"})
        await send({"type": "http.response.start", "status": 413, "headers": body.raw_headers})
        await send({"type": "http.response.body", "body": body.body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit_for(scope["path"]) if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        if length.isdigit() and int(length) > limit:
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
                await self._send_413(send, limit)


def body_limits(settings: Settings) -> Callable[[str], int | None]:
    upload = settings.max_upload_bytes + MULTIPART_OVERHEAD

    def limit_for(path: str) -> int | None:
        if path.startswith(UPLOAD_PATHS):
            return upload  # Gradio's upload route also checks each file against max_file_size
        if path == "/ui" or path.startswith("/ui/"):
            return settings.max_ui_json_bytes  # the UI's queue and API calls: component values, no files
        return settings.max_json_bytes

    return limit_for


# ---- errors ----------------------------------------------------------------------------------------
def _issues(errors: list) -> list[dict]:
    out = []
    for e in errors:
        loc = [x if isinstance(x, (str, int)) else str(x) for x in e.get("loc", ())]
        out.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.detail, exc.error, **exc.extra), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

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


# ---- app -------------------------------------------------------------------------------------------
def apply_thread_settings(settings: Settings) -> None:
    """Process-wide: intra-op threads of torch and OpenMP threads of FAISS (0 = leave as is).
    Called by the server entry points, not by create_app (tests share the process)."""
    import faiss
    import torch

    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)
    if settings.faiss_threads > 0:
        faiss.omp_set_num_threads(settings.faiss_threads)


@asynccontextmanager
async def lifespan(app: FastAPI):
    svc: SearchService = app.state.service
    if not svc.ready.is_set():
        if app.state.settings.load_in_background:
            svc.start_loading()
        else:
            await anyio.to_thread.run_sync(svc.load)  # when no model loads, the start-up fails
    try:
        yield
    finally:
        if app.state.owns_service:
            svc.close()


def _mount_ui(app: FastAPI, service: SearchService, settings: Settings) -> None:
    """The Gradio UI at /ui: ``ui.blocks.build_ui(service)``, calling the same service (never HTTP)."""
    try:
        from ui.blocks import build_ui
        from ui.theme import CSS, THEME
    except ModuleNotFoundError as e:
        if e.name not in ("ui", "ui.blocks", "ui.theme"):
            raise
        log.warning("no UI mounted: %s", e)
        return
    import gradio as gr

    blocks = build_ui(service, max_upload_bytes=settings.max_upload_bytes)
    gr.mount_gradio_app(app, blocks, path="/ui", theme=THEME, css=CSS, max_file_size=settings.max_upload_bytes,
                        blocked_paths=_private_paths(settings), run_history=False, enable_monitoring=False,
                        mcp_server=False)
    # gr.mount_gradio_app never marks the Blocks as launched, and Gradio checks that a file path sent
    # as an input was uploaded through the UI only for launched Blocks: without this, any client could
    # name any file on the server as an "image" and have it copied into Gradio's cache and served.
    blocks.has_launched = True
    app.state.ui_mounted = True


def _private_paths(settings: Settings) -> list[str]:
    """Folders Gradio must never serve from: the index directories and their checkpoints' folders."""
    from indexer.index import IndexDirError, read_manifest, resolve_checkpoint

    out = set()
    for name, d in settings.models.items():
        out.add(str(Path(d).resolve()))
        try:
            ckpt = resolve_checkpoint(d, read_manifest(d), settings.checkpoints.get(name))
            out.add(str(ckpt.parent))
        except (IndexDirError, OSError):
            pass  # reported when the models load
    return sorted(out)


def _enumerate_models(node: object, names: list[str]) -> None:
    """Name the served models as an ``enum`` wherever the document takes or returns a model name
    (``model`` / ``models`` properties and ``model`` query parameters): /docs gets drop-downs and
    schema-driven clients (and the schemathesis test) use real names. Unknown names still get a 404."""
    if isinstance(node, dict):
        for key, prop in (node.get("properties") or {}).items():
            if key == "model" and prop.get("type") == "string":
                prop["enum"] = names
            elif key == "models" and prop.get("type") == "array" and isinstance(prop.get("items"), dict):
                prop["items"]["enum"] = names
        if node.get("in") == "query" and node.get("name") == "model" and isinstance(node.get("schema"), dict):
            node["schema"]["enum"] = names
        for v in node.values():
            _enumerate_models(v, names)
    elif isinstance(node, list):
        for v in node:
            _enumerate_models(v, names)


def _install_openapi(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = copy.deepcopy(generate())  # the parts from openapi_extra are shared module constants
            _enumerate_models(schema, list(app.state.service.names))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None, service: SearchService | None = None) -> FastAPI:
    """The app. ``service`` may be given ready (tests, ``ltd demo``); otherwise one is built from
    ``settings.models`` and loaded by the lifespan handler."""
    settings = settings or Settings()
    owns = service is None
    if service is None:
        service = SearchService.from_settings(settings)
    app = FastAPI(
        title="LTD retrieval",
        version="0.1.0",
        summary="Image–caption retrieval: text → images, image → captions, two models side by side.",
        lifespan=lifespan,
    )
    app.state.settings, app.state.service, app.state.owns_service = settings, service, owns
    app.state.ui_mounted = False
    registry = Registry()
    metrics.register_service_collectors(registry, service)
    app.state.metrics = registry
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limit_for=body_limits(settings))
    token = settings.api_token.get_secret_value() if settings.api_token else None
    app.add_middleware(AccessMiddleware, token=token, allowed_hosts=settings.allowed_hosts)
    app.add_middleware(PrometheusMiddleware, registry=registry,  # outermost: times everything, 413s included
                       fixed_paths=[u for u in (app.openapi_url, app.docs_url, app.redoc_url,
                                                app.swagger_ui_oauth2_redirect_url) if u],
                       prefixes=["/ui"] if settings.ui else [])
    app.include_router(health.router)
    app.include_router(search.router)
    app.include_router(media.router)
    app.include_router(metrics.router)
    _install_openapi(app)
    if settings.ui:
        _mount_ui(app, service, settings)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` and worker processes: settings from LTD_* variables."""
    settings = Settings()
    apply_thread_settings(settings)
    return create_app(settings)
