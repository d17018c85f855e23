"""Request bodies that are JSON or an upload on the same path: parsing and validation shared by the
routers (image search, compare, explain, captions), and the OpenAPI documentation of the upload
forms. Every failure is a 4xx (422 for bad JSON or fields, 413 for a file over the limit, 415 for
another content type), never a 500."""
from __future__ import annotations

import json
from typing import Annotated

import anyio
from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from app.api.fields import MAX_ID, limit_marker
from app.api.routers.deps import get_settings
from app.api.settings import Settings

# Multipart bodies, documented by hand in the routes' openapi_extra (body_doc) and parsed by upload_form.
UPLOAD_FIELD = {"type": "string", "format": "binary", "description": "an image file (JPEG, PNG, WebP, BMP, GIF, TIFF)"}
K_FIELD = {"type": "integer", "minimum": 1, "default": 10, **limit_marker(maximum="max_k")}
MODEL_FIELD = {"type": "string", "minLength": 1, "maxLength": 100}
IMAGE_UPLOAD_FORM = {"type": "object", "required": ["file"], "additionalProperties": False,
                     "properties": {"file": UPLOAD_FIELD, "model": MODEL_FIELD, "k": K_FIELD}}
COMPARE_UPLOAD_FORM = {"type": "object", "required": ["file", "models"], "additionalProperties": False,
                       "properties": {"file": UPLOAD_FIELD, "k": K_FIELD,
                                      "models": {"type": "array", "items": MODEL_FIELD, "minItems": 2, "maxItems": 2,
                                                 "uniqueItems": True}}}
EXPLAIN_UPLOAD_FORM = {"type": "object", "required": ["file", "models"], "additionalProperties": False,
                       "properties": {"file": UPLOAD_FIELD, "query": {"type": "string", "minLength": 1,
                                                                      **limit_marker(maxLength="max_query_chars")},
                                      "caption_id": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
                                      "models": {"type": "array", "items": MODEL_FIELD, "minItems": 1, "maxItems": 4,
                                                 "uniqueItems": True}}}


def validate(model: type[BaseModel], data: object, settings: Settings) -> BaseModel:
    """``data`` as ``model``, under the request limits of ``settings`` (app/api/schemas.py); a 422 otherwise."""
    try:
        return model.model_validate(data, context={"limits": settings})
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)],
                                     body=None) from None


def media_type(request: Request) -> str:
    """The request's Content-Type without parameters, lower-cased ("" when absent)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


INLINE_PARSE_BYTES = 16 * 1024  # larger bodies are parsed in a worker thread, not on the event loop


async def json_body(request: Request) -> object:
    """The parsed JSON body (at most the JSON limit: app/api/limits.py); undecodable, too deeply nested
    or out-of-range JSON is a 422, not a 500."""
    body = await request.body()
    try:
        if len(body) <= INLINE_PARSE_BYTES:
            return json.loads(body)
        return await anyio.to_thread.run_sync(json.loads, body)
    except RecursionError:
        msg = "JSON decode error: nested too deeply"
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer over Python's digit limit
        msg = f"JSON decode error: {str(e)[:200]}"
    raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": msg}], body=None)


async def upload_form(request: Request, settings: Settings, fields: set[str]) -> tuple[bytes, dict]:
    """(file bytes, other fields) of a multipart body with exactly one file part named ``file``."""
    async with request.form(max_files=1, max_fields=8, max_part_size=4096) as form:
        unknown = set(form.keys()) - fields - {"file"}
        if unknown:
            raise RequestValidationError([{"type": "extra_forbidden", "loc": ("body", sorted(unknown)[0]),
                                           "msg": "Extra inputs are not permitted"}], body=None)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise RequestValidationError([{"type": "missing", "loc": ("body", "file"),
                                           "msg": "a file part named 'file' is required"}], body=None)
        if upload.size is not None and upload.size > settings.max_upload_bytes:
            raise HTTPException(413, f"the file is {upload.size:,} bytes; the limit is {settings.max_upload_bytes:,}")
        data = await upload.read(settings.max_upload_bytes + 1)
        if len(data) > settings.max_upload_bytes:
            raise HTTPException(413, f"the file exceeds the limit of {settings.max_upload_bytes:,} bytes")
        values = {k: form.getlist(k) for k in fields if k in form}
    return data, values


def unsupported(request: Request, *, uploads: bool = True) -> HTTPException:
    """The 415 for a body that is neither JSON nor (where ``uploads``) multipart/form-data."""
    accepted = "application/json, or multipart/form-data with a file" if uploads else "application/json"
    return HTTPException(415, f"Content-Type {media_type(request) or '(none)'} is not accepted here: send {accepted}")


def body_doc(json_model_cls: type[BaseModel], form_schema: dict | None = None) -> dict:
    """The ``openapi_extra`` of a route that reads its body itself: the JSON model's schema and, when given,
    the multipart form's (its limits are filled in by ``schemas.apply_limits`` when the app builds its
    document)."""
    content: dict = {"application/json": {"schema": json_model_cls.model_json_schema()}}
    if form_schema is not None:
        content["multipart/form-data"] = {"schema": form_schema, "encoding": {"file": {"contentType": "image/*"}}}
    return {"requestBody": {"required": True, "content": content}}


def json_model(model: type[BaseModel]):
    """A dependency that reads a JSON body as ``model`` under the settings' limits (a 415 for another
    type): for routes that take JSON only (declare ``openapi_extra=body_doc(model)`` beside it)."""
    async def read(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> BaseModel:
        if media_type(request) != "application/json":
            raise unsupported(request, uploads=False)
        return validate(model, await json_body(request), settings)

    read.__doc__ = f"The JSON body of the request, as {model.__name__}, under the settings' limits."
    return read
