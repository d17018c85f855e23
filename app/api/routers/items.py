"""The living index's items: add (uploads or a server-side folder), list, read, edit and remove them, and
pick up other processes' changes (reload) or write a new generation (compact).

Reads are open like every other route (behind the API token when there is one). Writes need the server
to be writable (``ltd serve --writable``) and, when it has a write token (``LTD_WRITE_TOKEN``; required
on any non-loopback bind), ``Authorization: Bearer WRITE_TOKEN``. A write answers when it is durable and
the next query sees it (search/writes.py).
"""
from __future__ import annotations

import hmac
import json
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import UploadFile

from app.api.item_schemas import (
    AddFolderRequest,
    AddResponse,
    CompactResponse,
    ItemOut,
    ItemPatch,
    ItemsPage,
    ReloadResponse,
    RemovedItem,
)
from app.api.routers.bodies import json_body, media_type, unsupported, validate
from app.api.routers.deps import COMMON_ERRORS, errors, get_service, get_settings, image_url, thumbnail_url
from app.api.settings import Settings
from search import BadRequest, SearchService
from search.writes import Upload

router = APIRouter(prefix="/api/models/{name}", tags=["items"])
Service = Annotated[SearchService, Depends(get_service)]
Name = Annotated[str, Path(min_length=1, max_length=100)]
WRITE_ERRORS = {**COMMON_ERRORS, **errors(400, 403, 404, 413, 415)}


def require_write(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> None:
    """A write: the server takes writes, and the request carries the write token when there is one."""
    if not settings.writable:
        raise HTTPException(403, "this server does not take writes (start it with `ltd serve --writable`)")
    require_operator(request, settings)


def require_operator(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> None:
    """The write token, when the server has one (reloads: no writes, but work an operator asks for)."""
    token = settings.write_token.get_secret_value() if settings.write_token else None
    if token is None:
        return
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HTTPException(403, "writes need the write token: 'Authorization: Bearer WRITE_TOKEN' "
                                 "(the LTD_WRITE_TOKEN the server was started with)")


Write = Annotated[None, Depends(require_write)]
Operator = Annotated[None, Depends(require_operator)]


def _item(name: str, it: dict) -> dict:
    return {**it, "image_url": image_url(it["id"], name), "thumbnail_url": thumbnail_url(it["id"], name)}


async def _uploads(request: Request, settings: Settings) -> list[Upload]:
    """The uploads of a multipart add: ``file`` parts (repeatable), and either ``items`` (a JSON list of
    {captions, metadata}, one per file) or ``metadata`` (a JSON object for every file)."""
    n = settings.max_items_per_add
    async with request.form(max_files=n, max_fields=n + 4, max_part_size=256 * 1024) as form:
        unknown = set(form.keys()) - {"file", "items", "metadata"}
        if unknown:
            raise RequestValidationError([{"type": "extra_forbidden", "loc": ("body", sorted(unknown)[0]),
                                           "msg": "Extra inputs are not permitted"}], body=None)
        files = [f for f in form.getlist("file") if isinstance(f, UploadFile)]
        if not files:
            raise RequestValidationError([{"type": "missing", "loc": ("body", "file"),
                                           "msg": "at least one file part named 'file' is required"}], body=None)
        try:
            items = json.loads(form.get("items") or "null")
            common = json.loads(form.get("metadata") or "{}")
        except (ValueError, RecursionError):
            raise BadRequest("items and metadata must be JSON") from None
        if items is not None and (not isinstance(items, list) or len(items) != len(files)
                                  or not all(isinstance(i, dict) for i in items)):
            raise BadRequest("items must be a JSON list of objects, one per file")
        out = []
        for k, f in enumerate(files):
            data = await f.read(settings.max_upload_bytes + 1)
            if len(data) > settings.max_upload_bytes:
                raise HTTPException(413, f"a file exceeds the limit of {settings.max_upload_bytes:,} bytes")
            spec = (items or [{}] * len(files))[k]
            if set(spec) - {"captions", "metadata"}:
                raise BadRequest("each of items is {captions, metadata}")
            md = spec.get("metadata", {})
            if not isinstance(md, dict) or not isinstance(common, dict):
                raise BadRequest("metadata must be a JSON object")
            out.append(Upload(data=data, filename=f.filename or "upload", captions=spec.get("captions", []),
                              metadata={**common, **md}))
    return out


@router.post("/items", response_model=AddResponse, responses=WRITE_ERRORS, status_code=201)
async def add_items(name: Name, request: Request, svc: Service, settings: Annotated[Settings, Depends(get_settings)],
                    _: Write) -> AddResponse:
    """Add images: multipart/form-data with ``file`` parts (at most ``max_items_per_add``), optional ``items``
    (a JSON list of ``{"captions": [...], "metadata": {...}}``, one per file) or ``metadata`` (one object for
    all); or JSON ``{"folder": "sub/dir"}`` for a folder under the server's ``--ingest-root``. Adding an
    image that is already there (same bytes) answers its id with ``added: false``."""
    mt = media_type(request)
    if mt == "multipart/form-data":
        uploads = await _uploads(request, settings)
        out = await anyio.to_thread.run_sync(svc.writes.add, name, uploads)
    elif mt == "application/json":
        req = validate(AddFolderRequest, await json_body(request), settings)
        out = await anyio.to_thread.run_sync(lambda: svc.writes.add_folder(name, req.folder, metadata=req.metadata))
    else:
        raise unsupported(request)
    return AddResponse(model=name, items=out)


@router.get("/items", response_model=ItemsPage, responses={**COMMON_ERRORS, **errors(400, 404)})
def list_items(name: Name, svc: Service, after: Annotated[int | None, Query(ge=-1)] = None,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               filter: Annotated[str | None, Query(min_length=1, max_length=8192, description="a filter, as JSON")] = None) -> dict:
    """Items in id order, ``limit`` at a time after the id ``after``, optionally filtered."""
    try:
        flt = json.loads(filter) if filter is not None else None
    except (ValueError, RecursionError):
        raise BadRequest("filter must be JSON") from None
    page = svc.writes.list(name, filter=flt, after=after, limit=limit)
    return {**page, "items": [_item(name, it) for it in page["items"]]}


@router.get("/items/{item_id}", response_model=ItemOut, responses={**COMMON_ERRORS, **errors(404)})
def get_item(name: Name, item_id: Annotated[int, Path(ge=0, le=2**62)], svc: Service) -> dict:
    """One live item: its id, file name, metadata and captions (404 once it is removed)."""
    return _item(name, svc.writes.get(name, item_id))


@router.patch("/items/{item_id}", response_model=ItemOut, responses=WRITE_ERRORS)
def edit_item(name: Name, item_id: Annotated[int, Path(ge=0, le=2**62)], patch: ItemPatch, svc: Service,
              _: Write) -> dict:
    """Change an item's metadata and/or captions."""
    return _item(name, svc.writes.edit(name, item_id, metadata=patch.metadata, captions=patch.captions,
                                       merge=not patch.replace))


@router.delete("/items/{item_id}", response_model=RemovedItem, responses=WRITE_ERRORS)
def remove_item(name: Name, item_id: Annotated[int, Path(ge=0, le=2**62)], svc: Service, _: Write) -> dict:
    """Remove an item: it is in no answer, image or thumbnail once this returns (its uploaded file goes too)."""
    return svc.writes.remove(name, item_id)


@router.post("/reload", response_model=ReloadResponse, responses=WRITE_ERRORS)
def reload(name: Name, svc: Service, _: Operator) -> dict:
    """Pick up what another process changed (``ltd items``, ``ltd index --append`` or a rebuild) now."""
    return svc.writes.reload(name)


@router.post("/compact", response_model=CompactResponse, responses={**WRITE_ERRORS, **errors(409)}, status_code=202)
def compact(name: Name, svc: Service, _: Write) -> dict:
    """Write the index as its next generation (removed items physically dropped), in the background."""
    return svc.writes.compact(name)
