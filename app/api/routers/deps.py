"""What every router shares: dependencies (the services and settings from ``app.state``; tests swap
them with ``app.dependency_overrides``), the documented error answers, and URL builders.

The dependencies are ``async def`` on purpose: they only read ``app.state``, and a plain ``def``
dependency would cost a trip through the thread pool on every request.
"""
from __future__ import annotations

from functools import lru_cache
from urllib.parse import quote

import orjson
from fastapi import Request, Response
from pydantic import BaseModel

from app.api.schemas import ErrorResponse
from app.api.settings import Settings
from search import CaptionService, SearchService


async def get_service(request: Request) -> SearchService:
    """The app's ``SearchService`` (``app.state.service``); tests swap it with ``dependency_overrides``."""
    return request.app.state.service


async def get_captions(request: Request) -> CaptionService:
    """The app's ``CaptionService`` (``app.state.captions``)."""
    return request.app.state.captions


async def get_settings(request: Request) -> Settings:
    """The app's settings (``app.state.settings``): the limits every body is validated against."""
    return request.app.state.settings


def errors(*codes: int) -> dict:
    """OpenAPI ``responses`` entries for error status codes, all answered with ErrorResponse."""
    return {c: {"model": ErrorResponse} for c in codes}


# Every operation can answer 503 (still loading) and 422 (request validation).
COMMON_ERRORS = errors(422, 503)


def json_model(model: BaseModel, status_code: int = 200, headers: dict | None = None) -> Response:
    """Serialise a response model straight to JSON bytes (pydantic's Rust serialiser).

    Returning a Response skips FastAPI's second validation of the return value, which for a plain
    ``def`` handler would be one more trip through the thread pool."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json",
                    headers=headers)


def json_response(data: dict, status_code: int = 200) -> Response:
    """Plain data (already in the shape of its response model) to JSON bytes with orjson, once."""
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json")


@lru_cache(maxsize=256)
def _quoted(model: str) -> str:  # a handful of served names, quoted once each instead of twice per hit
    return quote(model, safe="")


def image_url(image_id: int, model: str) -> str:
    """The API path of dataset image ``image_id`` as served by ``model`` (the name URL-quoted)."""
    return f"/api/images/{image_id}?model={_quoted(model)}"


def thumbnail_url(image_id: int, model: str, size: int = 256) -> str:
    """The API path of the image's thumbnail at most ``size`` pixels on a side."""
    return f"/api/images/{image_id}/thumbnail?model={_quoted(model)}&size={size}"
