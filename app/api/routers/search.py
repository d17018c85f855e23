"""Search: text → images, image → captions, and one query against two models side by side.

The handlers are plain ``def``: they encode and search (torch, FAISS) in the thread pool. The
image endpoints take JSON (a dataset image id) or multipart/form-data (an upload) on the same path;
an ``async`` dependency reads and checks the body, so the handler only sees a parsed query.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, Json

from app.api.fields import K, ModelName
from app.api.routers.bodies import (
    COMPARE_UPLOAD_FORM,
    IMAGE_UPLOAD_FORM,
    body_doc,
    json_body,
    media_type,
    unsupported,
    upload_form,
    validate,
)
from app.api.routers.deps import (
    COMMON_ERRORS,
    errors,
    get_service,
    get_settings,
    image_url,
    json_response,
    thumbnail_url,
)
from app.api.schemas import (
    CompareRequest,
    CompareResponse,
    Cursor,
    ImageSearchRequest,
    ImageSearchResponse,
    TextSearchRequest,
    TextSearchResponse,
)
from app.api.settings import Settings
from search import SearchResult, SearchService

router = APIRouter(prefix="/api", tags=["search"])
Service = Annotated[SearchService, Depends(get_service)]
SEARCH_ERRORS = {**COMMON_ERRORS, **errors(400, 404, 413)}
IMAGE_HITS = ("t2i", "i2i", "v2i")  # directions whose hits are images
UPLOAD_ERRORS = {**SEARCH_ERRORS, **errors(415)}


# ---- answers ---------------------------------------------------------------------------------------
# Plain data in the shape of the response models (TextSearchResponse, ImageSearchResponse), serialised
# once by orjson: the service's results (search/results.py) are already typed, and building ~25
# pydantic models per answer to validate them again cost more CPU than parsing the request and writing
# the HTTP response together (BENCHMARKS.md, "REST API load"). Their field names are the API's, so
# ``query`` and ``metrics`` go to orjson as the dataclasses they are (orjson writes dataclasses
# natively); each hit is a dict because it gains the API's URLs. tests/test_api.py checks the answers
# against the models.
def _answer(r: SearchResult, k: int, hits: list[dict]) -> dict:
    return {"direction": r.direction, "model": r.model, "k": k, "query": r.query, "took_ms": round(r.took_ms, 3),
            "ground_truth_ids": r.ground_truth_ids, "metrics": r.metrics, "results": hits,
            "next_cursor": r.next_cursor, "generation": r.generation, "partial": r.partial,
            "missing_shards": r.missing_shards}


def text_answer(r: SearchResult, k: int) -> dict:
    """A TextSearchResponse as plain data."""
    name = r.model
    return _answer(r, k, [
        {"rank": h.rank, "id": h.id, "score": h.score, "filename": h.filename, "image_url": image_url(h.id, name),
         "thumbnail_url": thumbnail_url(h.id, name), "ground_truth": h.ground_truth, "relevance": h.relevance}
        for h in r.hits])


def image_answer(r: SearchResult, k: int) -> dict:
    """An ImageSearchResponse as plain data."""
    name = r.model
    return _answer(r, k, [
        {"rank": h.rank, "id": h.id, "score": h.score, "text": h.text or "", "image_id": h.image_id,
         "image_url": None if h.image_id is None else image_url(h.image_id, name),
         "thumbnail_url": None if h.image_id is None else thumbnail_url(h.image_id, name),
         "ground_truth": h.ground_truth, "relevance": h.relevance} for h in r.hits])


# ---- JSON-or-upload bodies -------------------------------------------------------------------------
@dataclass
class ImageQuery:
    """An image search request, parsed from JSON (a dataset image) or an upload."""

    model: str | None
    k: int
    image_id: int | None = None
    data: bytes | None = None
    filter: dict | None = None
    cursor: str | None = None


@dataclass
class CompareQuery:
    """A compare request, parsed from JSON or an upload."""

    models: list[str]
    k: int
    query: str | None = None
    caption_id: int | None = None
    image_id: int | None = None
    data: bytes | None = None
    filter: dict | None = None


class _ImageForm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: ModelName = None  # type: ignore[assignment]
    k: K = 10
    filter: Json[dict[str, Any]] | None = None  # a JSON object, as a form field
    cursor: Cursor = None


class _CompareForm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: Annotated[list[ModelName], Field(min_length=2, max_length=2)]
    k: K = 10
    filter: Json[dict[str, Any]] | None = None


async def text_request(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> TextSearchRequest:
    """The JSON body of a text search, validated under the settings' limits."""
    if media_type(request) != "application/json":
        raise unsupported(request, uploads=False)
    return validate(TextSearchRequest, await json_body(request), settings)


async def image_query(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> ImageQuery:
    """The body of POST /api/search/image (``image_body`` with ``ImageSearchRequest``)."""
    return await image_body(request, settings, ImageSearchRequest)


async def image_body(request: Request, settings: Settings, json_model: type[BaseModel]) -> ImageQuery:
    """An image query's body: JSON (``json_model``: a served image's id) or multipart/form-data (an upload),
    with ``filter`` and ``cursor``, checked under the settings' limits. 422 for bad fields, 413 for a file
    over the limit, 415 for another type."""
    mt = media_type(request)
    if mt == "application/json":
        req = validate(json_model, await json_body(request), settings)
        return ImageQuery(model=req.model, k=req.k, image_id=req.image_id, filter=req.filter, cursor=req.cursor)
    if mt == "multipart/form-data":
        data, values = await upload_form(request, settings, {"model", "k", "filter", "cursor"})
        f = validate(_ImageForm, {k: v[-1] for k, v in values.items()}, settings)
        return ImageQuery(model=f.model, k=f.k, data=data, filter=f.filter, cursor=f.cursor)
    raise unsupported(request)


async def compare_query(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> CompareQuery:
    """The body of POST /api/compare: JSON (one of query, caption_id, image_id) or an upload with
    ``models`` given twice; 422 for bad fields or one model twice, 413 / 415 as for ``image_query``."""
    mt = media_type(request)
    if mt == "application/json":
        req = validate(CompareRequest, await json_body(request), settings)
        return CompareQuery(models=req.models, k=req.k, filter=req.filter,
                            **{f: getattr(req, f) for f in req.model_fields_set if f in ("query", "caption_id", "image_id")})
    if mt == "multipart/form-data":
        data, values = await upload_form(request, settings, {"models", "k", "filter"})
        raw = {"models": values.get("models", [])} | {k: values[k][-1] for k in ("k", "filter") if k in values}
        f = validate(_CompareForm, raw, settings)
        if f.models[0] == f.models[1]:
            raise RequestValidationError([{"type": "value_error", "loc": ("body", "models"),
                                           "msg": "models must name two different models"}], body=None)
        return CompareQuery(models=f.models, k=f.k, data=data, filter=f.filter)
    raise unsupported(request)


# ---- endpoints -------------------------------------------------------------------------------------
@router.post("/search/text", response_model=TextSearchResponse, responses=UPLOAD_ERRORS,
             openapi_extra=body_doc(TextSearchRequest))
async def search_text(req: Annotated[TextSearchRequest, Depends(text_request)], svc: Service) -> Response:
    """Text → images: ``{"query": "a dog on grass", "model": "ltd", "k": 10}``, or ``caption_id`` for a
    dataset caption (then each hit says whether it is the caption's own image, and ``metrics`` has the
    rank of that image, P@k and nDCG@k)."""
    name = req.model or svc.registry.default_name
    r = await svc.search_text_async(name, query=req.query, caption_id=req.caption_id, k=req.k, filter=req.filter,
                                    cursor=req.cursor)
    return json_response(text_answer(r, req.k))


@router.post("/search/image", response_model=ImageSearchResponse, responses=UPLOAD_ERRORS,
             openapi_extra=body_doc(ImageSearchRequest, IMAGE_UPLOAD_FORM))
def search_image(q: Annotated[ImageQuery, Depends(image_query)], svc: Service) -> Response:
    """Image → captions. JSON ``{"image_id": 42, "model": "bl", "k": 10}`` for a dataset image (ground
    truth and metrics attached), or multipart/form-data with ``file`` (≤ 10 MB; JPEG, PNG, WebP, BMP,
    GIF or TIFF) and optional ``model`` and ``k`` fields."""
    name = q.model or svc.registry.default_name
    r = svc.search_image(name, image_id=q.image_id, image_bytes=q.data, k=q.k, filter=q.filter, cursor=q.cursor)
    return json_response(image_answer(r, q.k))


@router.post("/compare", response_model=CompareResponse, responses=UPLOAD_ERRORS,
             openapi_extra=body_doc(CompareRequest, COMPARE_UPLOAD_FORM))
def compare(q: Annotated[CompareQuery, Depends(compare_query)], svc: Service) -> Response:
    """One query, two models: both rankings, their overlap, and per-model metrics when the query is a
    dataset item. JSON with exactly one of ``query``/``caption_id`` (text → images) or ``image_id``
    (image → captions), or multipart/form-data with ``file`` and ``models`` given twice
    (``-F models=bl -F models=ltd``)."""
    out = svc.compare(q.models, query=q.query, caption_id=q.caption_id, image_id=q.image_id, image_bytes=q.data,
                      k=q.k, filter=q.filter)
    answer = text_answer if out.direction in IMAGE_HITS else image_answer
    return json_response({"direction": out.direction, "k": q.k, "models": q.models,
                          "results": [answer(r, q.k) for r in out.results], "overlap": out.overlap,
                          "overlap_ids": out.overlap_ids, "jaccard": out.jaccard})
