"""The FastAPI application: ``create_app(settings, service, captions)``.

- A lifespan handler loads the models and indexes once into the ``SearchService`` held on
  ``app.state.service`` (in a background thread when ``settings.load_in_background``, so
  /api/health answers 503 "loading" meanwhile); the ``CaptionService`` beside it, on
  ``app.state.captions``, loads its captioners in the same thread. Routers reach them through
  ``get_service`` and ``get_captions``.
- Errors are JSON ``{error, detail}`` (app/api/errors.py); request bodies are size-limited before
  and while they are read (app/api/limits.py); Host checks, the optional token and the Gradio
  routes this UI does not use are handled by app/api/security.py.
- /metrics serves Prometheus counters and latency histograms (app/api/prom.py).
- The Gradio UI is mounted at /ui when ``settings.ui``: ``ui.app.build_ui`` gets the two services
  (whose config holds the limits it must enforce) and how to reach thumbnails; it never calls the
  REST API over HTTP.
"""
from __future__ import annotations

import copy
import gc
import logging
import os
import sys
import threading
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import faiss
import torch
from fastapi import FastAPI

from app.api.errors import ClientGoneMiddleware, install_error_handlers
from app.api.fields import apply_limits
from app.api.limits import BodyLimitMiddleware, body_limits
from app.api.login import FailureLimiter
from app.api.prom import PrometheusMiddleware, Registry
from app.api.routers import caption, deps, docs, explain, health, items, media, metrics, queries, search
from app.api.security import AccessMiddleware
from app.api.settings import Settings, load_settings
from app.api.streams import StreamLimitMiddleware, StreamLimits
from app.api.ui_guard import MAX_FILES_PER_UPLOAD, UIGuardMiddleware, UploadCache
from app.api.ui_paths import PathAliases
from app.api.ui_values import UICalls
from indexer.index import read_manifest, resolve_checkpoint
from search import CaptionService, SearchService
from training.features import default_cache_dir
from training.fsio import private_folder, private_folder_or_temp

log = logging.getLogger(__name__)


# ---- app -------------------------------------------------------------------------------------------
# The GIL's switch interval in a server process (Python's default is 5 ms). The encoder's thread gives the GIL
# up inside OpenVINO / FAISS and must win it back from the event loop several times a batch; at 5 ms each
# such wait could cost up to a quantum. 0.5 ms: +21 % requests/s at concurrency 16 on the 2-core Xeon
# (BENCHMARKS.md, "REST API load"); 0.1 ms was slower again (switching itself).
SWITCH_INTERVAL_S = 0.0005


def apply_thread_settings(settings: Settings) -> None:
    """Process-wide: intra-op threads of torch and OpenMP threads of FAISS (0 = leave as is), and the GIL's
    switch interval. Called by the server entry points, not by create_app (tests share the process)."""
    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)
    if settings.faiss_threads > 0:
        faiss.omp_set_num_threads(settings.faiss_threads)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def freeze_when_loaded(service: SearchService) -> None:
    """Once the models have loaded, move every object then alive out of the cyclic garbage collector's reach
    (``gc.freeze``): a full collection otherwise walks the loaded models' and indexes' millions of objects, a
    pause of 150–550 ms under load (measured with gc.callbacks), which was most of the API's p99. Objects
    made later are collected as usual. Server processes only (a test process would keep its garbage)."""
    def watch() -> None:
        service.registry.ready.wait()
        gc.collect()
        gc.freeze()
        log.info("froze %d objects out of the garbage collector's reach", gc.get_freeze_count())

    threading.Thread(target=watch, name="ltd-gc-freeze", daemon=True).start()


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Load the models when the app starts (in a background thread with ``load_in_background``, else
    before the first request: a start-up without any loadable model fails), and at shutdown wait for a
    load in progress and close the service if the app built it."""
    svc: SearchService = app.state.service
    models = svc.registry
    if not models.ready.is_set():
        if app.state.settings.load_in_background:
            models.start_loading()
        else:
            await anyio.to_thread.run_sync(models.load)  # when no model loads, the start-up fails
    if app.state.owns_service and svc.config.watch_seconds > 0:
        models.watch(svc.config.watch_seconds)  # other processes' writes and new generations (search/registry.py)
    try:
        yield
    finally:
        # A process must not exit while the loader thread is inside torch/FAISS native code (the C++
        # runtime aborts it: "terminate called without an active exception"); loading takes seconds.
        if not models.ready.is_set():
            log.info("waiting for model loading to finish before shutting down")
            await anyio.to_thread.run_sync(models.ready.wait, 120)
        if app.state.owns_service:
            svc.close()


def _mount_ui(app: FastAPI, service: SearchService, captions: CaptionService, settings: Settings) -> None:
    """The Gradio UI at /ui, calling the same service objects as the routers (never HTTP)."""
    # lazy: gradio (and the ui package, which imports it at its top) takes ~4 s to import; API-only
    # servers (ui=false) and the tests' apps never need it
    import gradio as gr

    from ui.app import build_ui
    from ui.theme import CSS, THEME

    ui_upload_folder()  # before the Blocks exist: each component records Gradio's folder when built
    blocks = build_ui(service, captions, thumb_url=deps.thumbnail_url, writes=page_writes(settings))  # limits: the config
    gr.mount_gradio_app(app, blocks, path="/ui", theme=THEME, css=CSS, max_file_size=settings.max_upload_bytes,
                        blocked_paths=_private_paths(settings), run_history=False, enable_monitoring=False,
                        allowed_paths=[str(service.thumbnails.private_folder())],  # gallery thumbnails
                        mcp_server=False)
    # gr.mount_gradio_app never marks the Blocks as launched, and Gradio checks that a file path sent
    # as an input was uploaded through the UI only for launched Blocks: without this, any client could
    # name any file on the server as an "image" and have it copied into Gradio's cache and served.
    blocks.has_launched = True
    app.state.ui_calls = UICalls.of(blocks)  # the events the UI guard lets scripts and the page call
    app.state.ui_mounted = True


def page_writes(settings: Settings) -> bool:
    """Whether the UI's page may add and remove items: the server is writable and its writes need no token
    (a write token is for REST clients; the page, reached with the read token or none, never has it)."""
    return settings.writable and settings.write_token is None


def ui_upload_folder() -> Path:
    """Gradio's upload folder, private to this user (training/fsio.py): ``$GRADIO_TEMP_DIR`` when set
    (PermissionError when it is not private), else ``ui-uploads`` in the cache folder (or a private
    temporary folder), exported as ``$GRADIO_TEMP_DIR`` for Gradio and the worker processes. Gradio's
    default, ``$TMPDIR/gradio``, is shared and predictable."""
    if os.environ.get("GRADIO_TEMP_DIR"):
        return private_folder(os.environ["GRADIO_TEMP_DIR"])
    folder = private_folder_or_temp(default_cache_dir() / "ui-uploads", "ltd-ui-uploads-")
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    return folder


def _ui_guard(app: FastAPI, settings: Settings, service: SearchService) -> None:
    folder = ui_upload_folder()
    cache = UploadCache(folder, max_bytes=settings.ui_cache_bytes, max_age=settings.ui_cache_seconds,
                        max_files=settings.ui_cache_files)
    aliases = PathAliases({"uploads": folder, "thumbs": service.thumbnails.private_folder()})
    app.add_middleware(UIGuardMiddleware, upload_dir=folder, cache=cache, aliases=aliases,
                       calls=lambda: getattr(app.state, "ui_calls", None),
                       max_files=max(MAX_FILES_PER_UPLOAD, settings.max_items_per_add) if page_writes(settings)
                       else MAX_FILES_PER_UPLOAD)


def _private_paths(settings: Settings) -> list[str]:
    """Folders Gradio must never serve from: the index directories and their checkpoints' folders."""
    out = set()
    for name, d in settings.models.items():
        out.add(str(Path(d).resolve()))
        try:
            ckpt = resolve_checkpoint(d, read_manifest(d), settings.checkpoints.get(name))
            out.add(str(ckpt.parent))
        except Exception:  # noqa: BLE001 - any broken index is reported when the models load
            pass
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


def hoist_defs(schema: dict) -> None:
    """Move the ``$defs`` of schemas embedded in the document (a route's ``openapi_extra``: pydantic's own
    JSON schema of a body model) into ``components/schemas`` and point their ``$ref``s there: a
    ``#/$defs/X`` reference means the document's root, where ReDoc and other viewers fail to find it."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})

    def walk(node):
        if isinstance(node, dict):
            for name, sub in (node.pop("$defs", None) or {}).items():
                walk(sub)
                if components.get(name, sub) != sub:
                    raise ValueError(f"two different schemas named {name} in the OpenAPI document")
                components[name] = sub
            for key, value in node.items():
                if isinstance(value, str) and value.startswith("#/$defs/"):
                    node[key] = "#/components/schemas/" + value[len("#/$defs/"):]
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema.get("paths", {}))


def _install_openapi(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = copy.deepcopy(generate())  # the parts from openapi_extra are shared module constants
            hoist_defs(schema)  # nested models of hand-documented bodies: into components, where viewers look
            apply_limits(schema, app.state.settings)  # k and query limits: this server's, not the defaults
            _enumerate_models(schema, list(app.state.service.registry.names))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None, service: SearchService | None = None,
               captions: CaptionService | None = None) -> FastAPI:
    """The app. ``service`` may be given ready (tests, ``ltd demo``); otherwise one is built from
    ``settings.models`` and loaded by the lifespan handler. ``captions`` likewise, from
    ``settings.captioners`` beside ``service``."""
    settings = settings or Settings()
    owns = service is None
    if service is None:
        service = settings.search_service()
    if captions is None:
        captions = settings.caption_service(service)
    app = FastAPI(
        title="LTD retrieval",
        version="0.1.0",
        summary="Image–caption retrieval: text → images, image → captions, two models side by side.",
        lifespan=lifespan,
        docs_url=None, redoc_url=None,  # served from installed files by routers/docs.py (works offline)
    )
    app.state.settings, app.state.service, app.state.captions, app.state.owns_service = settings, service, captions, owns
    app.state.ui_mounted = False
    registry = Registry()
    metrics.register_service_collectors(registry, service)
    app.state.metrics = registry
    install_error_handlers(app)
    if settings.ui:
        _ui_guard(app, settings, service)  # innermost: sees only bodies already capped and authorised
        app.add_middleware(StreamLimitMiddleware, limits=StreamLimits(
            max_streams=settings.max_streams, max_streams_per_client=settings.max_streams_per_client,
            idle_seconds=settings.stream_idle_seconds, max_seconds=settings.stream_max_seconds))
    app.add_middleware(ClientGoneMiddleware)  # sees the Gradio mount's errors too
    app.add_middleware(BodyLimitMiddleware, limit_for=body_limits(settings))
    token = settings.api_token.get_secret_value() if settings.api_token else None
    write_token = settings.write_token.get_secret_value() if settings.write_token else None
    app.add_middleware(AccessMiddleware, token=token, write_token=write_token, allowed_hosts=settings.allowed_hosts,
                       session_seconds=settings.session_seconds,
                       limiter=FailureLimiter(max_failures=-(-settings.max_wrong_tokens // settings.workers)))
    app.add_middleware(PrometheusMiddleware, registry=registry,  # outermost: times everything, 413s included
                       fixed_paths=[app.openapi_url, "/docs", "/redoc"],
                       prefixes=[docs.ASSETS, *(["/ui"] if settings.ui else [])])
    app.include_router(health.router)
    app.include_router(search.router)
    app.include_router(media.router)
    app.include_router(caption.router)
    app.include_router(explain.router)
    app.include_router(queries.router)
    app.include_router(items.router)
    app.include_router(metrics.router)
    docs.mount(app)
    _install_openapi(app)
    if settings.ui:
        _mount_ui(app, service, captions, settings)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` and worker processes: settings from LTD_* variables."""
    settings = load_settings()
    apply_thread_settings(settings)
    app = create_app(settings)
    freeze_when_loaded(app.state.service)
    return app
