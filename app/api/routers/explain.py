"""Explanations: which words of a query hold an image up, under each model (``POST /api/explain``).

JSON (a dataset image, or a dataset caption's own image) or multipart/form-data (an upload) on the
same path, parsed by the same helpers as the search routes; the handler is a plain ``def`` (it
encodes and scores in the thread pool).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from app.api.fields import ItemId, ModelName, QueryText
from app.api.routers.bodies import (
    EXPLAIN_UPLOAD_FORM,
    body_doc,
    json_body,
    media_type,
    unsupported,
    upload_form,
    validate,
)
from app.api.routers.deps import COMMON_ERRORS, errors, get_service, get_settings, image_url, json_model, thumbnail_url
from app.api.schemas import (
    ExplainRequest,
    ExplainResponse,
)
from app.api.settings import Settings
from search import SearchService

router = APIRouter(prefix="/api", tags=["explain"])
Service = Annotated[SearchService, Depends(get_service)]


@dataclass
class ExplainQuery:
    """An explain request, parsed from JSON or an upload."""

    models: list[str]
    query: str | None = None
    caption_id: int | None = None
    image_id: int | None = None
    data: bytes | None = None


class _ExplainForm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: Annotated[list[ModelName], Field(min_length=1, max_length=4)]
    query: QueryText = None  # type: ignore[assignment]
    caption_id: ItemId = None  # type: ignore[assignment]


async def explain_query(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> ExplainQuery:
    """The body of POST /api/explain: JSON or multipart/form-data (an upload), checked under the
    settings' limits. 422 for bad fields, 413 for a file over the limit, 415 for another type."""
    mt = media_type(request)
    if mt == "application/json":
        req = validate(ExplainRequest, await json_body(request), settings)
        return ExplainQuery(models=req.models, query=req.query, caption_id=req.caption_id, image_id=req.image_id)
    if mt == "multipart/form-data":
        data, values = await upload_form(request, settings, {"models", "query", "caption_id"})
        raw = {"models": values.get("models", [])} | {k: values[k][-1] for k in ("query", "caption_id") if k in values}
        f = validate(_ExplainForm, raw, settings)
        return ExplainQuery(models=f.models, query=f.query, caption_id=f.caption_id, data=data)
    raise unsupported(request)


@router.post("/explain", response_model=ExplainResponse, responses={**COMMON_ERRORS, **errors(400, 404, 413, 415)},
             openapi_extra=body_doc(ExplainRequest, EXPLAIN_UPLOAD_FORM))
def explain(q: Annotated[ExplainQuery, Depends(explain_query)], svc: Service) -> Response:
    """Word attributions by occlusion: for each model and each word of the query, how the image's score
    and rank change when that word is removed (every variant of the query is encoded in one batch), with
    the full query's score and rank. JSON ``{"query": "a red car", "image_id": 7, "models": ["bl", "ltd"]}``
    or ``{"caption_id": 42, "models": [...]}`` (the caption's own image unless ``image_id`` says otherwise);
    or multipart/form-data with ``file``, ``models`` (repeated) and ``query`` or ``caption_id``. A query
    needs two to 64 words."""
    ex = svc.explainer.explain(q.models, query=q.query, caption_id=q.caption_id, image_id=q.image_id, image_bytes=q.data)
    answer = ExplainResponse.model_validate(ex, from_attributes=True)
    if ex.image_id is not None:  # the one thing the API adds: where the image is
        first = q.models[0]
        answer = answer.model_copy(update={"image_url": image_url(ex.image_id, first),
                                           "thumbnail_url": thumbnail_url(ex.image_id, first)})
    return json_model(answer)
