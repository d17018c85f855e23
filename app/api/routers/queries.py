"""More query kinds: image → images ("more like this"), text → captions, a raw embedding, and batches.

Every route takes ``filter`` (only items whose metadata match) and ``cursor`` (the next page), like
/api/search/text and /api/search/image. Answers have the same shapes as theirs: image hits for
``i2i`` and ``v2i``, caption hits for ``t2t`` and ``v2t``.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from app.api.item_schemas import BatchRequest, BatchResponse, CaptionSearchRequest, SimilarRequest, VectorSearchRequest
from app.api.routers.bodies import IMAGE_UPLOAD_FORM, body_doc, json_model
from app.api.routers.deps import get_service, get_settings, json_response
from app.api.routers.search import IMAGE_HITS, UPLOAD_ERRORS, ImageQuery, image_answer, image_body, text_answer
from app.api.schemas import ImageSearchResponse, TextSearchResponse
from app.api.settings import Settings
from search import SearchResult, SearchService

router = APIRouter(prefix="/api/search", tags=["search"])
Service = Annotated[SearchService, Depends(get_service)]


def answer(r: SearchResult, k: int) -> dict:
    """The REST body of a result: the image-hits shape or the caption-hits shape, as its direction says."""
    return (text_answer if r.direction in IMAGE_HITS else image_answer)(r, k)


async def similar_query(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> ImageQuery:
    """A JSON ``SimilarRequest`` (a served image's id) or an upload with its form fields."""
    return await image_body(request, settings, SimilarRequest)


@router.post("/similar", response_model=TextSearchResponse, responses=UPLOAD_ERRORS,
             openapi_extra=body_doc(SimilarRequest, IMAGE_UPLOAD_FORM))
def similar_images(q: Annotated[ImageQuery, Depends(similar_query)], svc: Service) -> Response:
    """Image → images, "more like this": JSON ``{"image_id": 42}`` (a served image: it ranks first) or an
    upload (multipart/form-data ``file``)."""
    name = q.model or svc.registry.default_name
    r = svc.similar_images(name, image_id=q.image_id, image_bytes=q.data, k=q.k, filter=q.filter, cursor=q.cursor)
    return json_response(text_answer(r, q.k))


@router.post("/captions", response_model=ImageSearchResponse, responses=UPLOAD_ERRORS,
             openapi_extra=body_doc(CaptionSearchRequest))
def similar_captions(req: Annotated[CaptionSearchRequest, Depends(json_model(CaptionSearchRequest))],
                     svc: Service) -> Response:
    """Text → captions: the captions nearest to ``query`` (or to the served caption ``caption_id``)."""
    name = req.model or svc.registry.default_name
    r = svc.similar_captions(name, query=req.query, caption_id=req.caption_id, k=req.k, filter=req.filter,
                             cursor=req.cursor)
    return json_response(image_answer(r, req.k))


@router.post("/vector", response_model=TextSearchResponse | ImageSearchResponse, responses=UPLOAD_ERRORS,
             openapi_extra=body_doc(VectorSearchRequest))
def search_vector(req: Annotated[VectorSearchRequest, Depends(json_model(VectorSearchRequest))],
                  svc: Service) -> Response:
    """A raw embedding (the model's space and size; normalised here) against ``side`` images or captions."""
    name = req.model or svc.registry.default_name
    r = svc.search_vector(name, req.vector, side=req.side, k=req.k, filter=req.filter, cursor=req.cursor)
    return json_response(answer(r, req.k))


@router.post("/batch", response_model=BatchResponse, responses=UPLOAD_ERRORS, openapi_extra=body_doc(BatchRequest))
def batch(req: Annotated[BatchRequest, Depends(json_model(BatchRequest))], svc: Service) -> Response:
    """Many queries in one request (at most ``max_batch_queries``), answered in order."""
    name = req.model or svc.registry.default_name
    queries = [{**q.model_dump(exclude_none=True), "kind": q.kind} for q in req.queries]
    results = svc.batch(name, queries, k=req.k, filter=req.filter)
    return json_response({"model": name, "results": [answer(r, len(r.hits) or req.k) for r in results]})
