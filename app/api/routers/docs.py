"""API docs that work offline: Swagger UI at /docs and ReDoc at /redoc, their scripts and styles served
from files installed with the project (the ``fastapi-offline`` package ships them), never a CDN."""
from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"
router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI for the OpenAPI document, its scripts and styles served from the installed package."""
    app = request.app
    return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} — API docs",
                               swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{ASSETS}/swagger-ui.css", swagger_favicon_url=f"{ASSETS}/favicon.png")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc for the OpenAPI document, its script served from the installed package (no web fonts)."""
    app = request.app
    return get_redoc_html(openapi_url=app.openapi_url, title=f"{app.title} — API reference",
                          redoc_js_url=f"{ASSETS}/redoc.standalone.js", redoc_favicon_url=f"{ASSETS}/favicon.png",
                          with_google_fonts=False)


def mount(app: FastAPI) -> None:
    """The docs routes and their static assets (FastAPI's own /docs and /redoc must be off)."""
    app.mount(ASSETS, StaticFiles(directory=str(resources.files("fastapi_offline") / "static")), name="docs-assets")
    app.include_router(router)
