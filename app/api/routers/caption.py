"""Captions: what each served captioner says about an image (its CIDEr-D against the references and
how well it finds the image again under each retrieval model), and a checker for captions written by
a person ("how discriminative is my caption?")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict

from app.api.fields import QueryText
from app.api.routers.bodies import body_doc, json_body, media_type, unsupported, upload_form, validate
from app.api.routers.deps import COMMON_ERRORS, errors, get_captions, get_settings, json_model
from app.api.schemas import (
    Beam,
    CaptionCheckRequest,
    CaptionCheckResponse,
    Captioners,
    CaptionersResponse,
    CaptionRequest,
    CaptionResponse,
)
from app.api.settings import Settings
from search import CaptionService

router = APIRouter(prefix="/api", tags=["captions"])
Service = Annotated[CaptionService, Depends(get_captions)]
CAPTION_ERRORS = {**COMMON_ERRORS, **errors(400, 404, 413, 415)}
UPLOAD = {"type": "string", "format": "binary", "description": "an image (JPEG, PNG, WebP, BMP, GIF or TIFF)"}
CAPTION_FORM = {"type": "object", "required": ["file"], "additionalProperties": False,
                "properties": {"file": UPLOAD, "beam": {"type": "integer", "minimum": 1, "maximum": 20},
                               "captioners": {"type": "array", "items": {"type": "string", "minLength": 1}}}}
CHECK_FORM = {"type": "object", "required": ["file", "caption"], "additionalProperties": False,
              "properties": {"file": UPLOAD, "caption": {"type": "string", "minLength": 1, "maxLength": 1000}}}


class _CaptionForm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    beam: Beam = 5
    captioners: Captioners = None  # type: ignore[assignment]


class _CheckForm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    caption: QueryText


@dataclass
class CaptionQuery:
    """A caption or caption-check request, parsed from JSON or an upload."""

    image_id: int | None = None
    data: bytes | None = None
    beam: int = 5
    captioners: list[str] | None = None
    caption: str | None = None


async def caption_query(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> CaptionQuery:
    """The body of POST /api/caption: JSON (a dataset image) or multipart/form-data (an upload), checked
    under the settings' limits. 422 for bad fields, 413 for a file over the limit, 415 for another type."""
    mt = media_type(request)
    if mt == "application/json":
        req = validate(CaptionRequest, await json_body(request), settings)
        return CaptionQuery(image_id=req.image_id, beam=req.beam, captioners=req.captioners)
    if mt == "multipart/form-data":
        data, values = await upload_form(request, settings, {"beam", "captioners"})
        raw = {"beam": values["beam"][-1]} if "beam" in values else {}
        f = validate(_CaptionForm, raw | ({"captioners": values["captioners"]} if "captioners" in values else {}),
                     settings)
        return CaptionQuery(data=data, beam=f.beam, captioners=f.captioners)
    raise unsupported(request)


async def check_query(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> CaptionQuery:
    """The body of POST /api/caption/check: JSON or an upload, with the caption cleaned like a query.
    422 / 413 / 415 as for ``caption_query``."""
    mt = media_type(request)
    if mt == "application/json":
        req = validate(CaptionCheckRequest, await json_body(request), settings)
        return CaptionQuery(image_id=req.image_id, caption=req.caption)
    if mt == "multipart/form-data":
        data, values = await upload_form(request, settings, {"caption"})
        f = validate(_CheckForm, {k: v[-1] for k, v in values.items()}, settings)
        return CaptionQuery(data=data, caption=f.caption)
    raise unsupported(request)


@router.get("/captioners", response_model=CaptionersResponse, responses=COMMON_ERRORS)
async def list_captioners(svc: Service) -> CaptionersResponse:
    """The served captioners: ``ready`` (name → training summary) and ``down`` (name → why)."""
    return CaptionersResponse.model_validate(svc.captioners.status(), from_attributes=True)


@router.post("/caption", response_model=CaptionResponse, responses=CAPTION_ERRORS,
             openapi_extra=body_doc(CaptionRequest, CAPTION_FORM))
def caption(q: Annotated[CaptionQuery, Depends(caption_query)], svc: Service) -> Response:
    """Each captioner's caption of an image — JSON ``{"image_id": 42}`` for a dataset image, or
    multipart/form-data with ``file`` — with CIDEr-D against the image's references (dataset images)
    and the image's rank for the caption under each retrieval model (self-retrieval)."""
    out = svc.caption_image(image_id=q.image_id, image_bytes=q.data, captioners=q.captioners, beam=q.beam)
    return json_model(CaptionResponse.model_validate(out, from_attributes=True))


@router.post("/caption/check", response_model=CaptionCheckResponse, responses=CAPTION_ERRORS,
             openapi_extra=body_doc(CaptionCheckRequest, CHECK_FORM))
def check(q: Annotated[CaptionQuery, Depends(check_query)], svc: Service) -> Response:
    """How discriminative a caption is: the image's rank for it under each retrieval model (and its
    CIDEr-D against the references, for a dataset image). JSON ``{"image_id": 42, "caption": "…"}`` or
    multipart/form-data with ``file`` and ``caption``."""
    out = svc.check_caption(q.caption, image_id=q.image_id, image_bytes=q.data)
    return json_model(CaptionCheckResponse.model_validate(out, from_attributes=True))
