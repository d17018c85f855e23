"""Dataset items: image files, thumbnails, captions and example queries.

Only files that belong to a loaded index are served: the path takes an integer id, the service
maps it to the file the index recorded, and nothing from the request is ever joined to a path.
"""
from __future__ import annotations

import os
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import FileResponse

from app.api.fields import MAX_ID
from app.api.routers.deps import (
    COMMON_ERRORS,
    errors,
    get_service,
    get_settings,
    image_url,
    thumbnail_url,
)
from app.api.schemas import CaptionInfo
from app.api.settings import Settings
from search import DatasetCaption, NotFound, SearchService
from training.data.members import ImageMember

router = APIRouter(prefix="/api", tags=["dataset"])
Service = Annotated[SearchService, Depends(get_service)]
Config = Annotated[Settings, Depends(get_settings)]
ImageIdPath = Annotated[int, Path(ge=0, le=MAX_ID, description="a dataset image id")]
ModelQuery = Annotated[str, Query(min_length=1, max_length=100, description="restrict to this model's index")]

MEDIA_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
               ".gif": "image/gif", ".bmp": "image/bmp", ".tif": "image/tiff", ".tiff": "image/tiff"}
BINARY = {"schema": {"type": "string", "format": "binary"}}
IMAGE_CONTENT = {t: BINARY for t in sorted(set(MEDIA_TYPES.values()))} | {"application/octet-stream": BINARY}


def _cache_headers(settings: Settings) -> dict[str, str]:
    return {"Cache-Control": f"public, max-age={settings.image_cache_seconds}"}


@router.get("/images/{image_id}", response_class=FileResponse,
            responses={200: {"content": IMAGE_CONTENT, "description": "the image file"},
                       304: {"description": "not modified (the If-None-Match ETag matches)"},
                       **COMMON_ERRORS, **errors(404)})
def get_image(image_id: ImageIdPath, request: Request, svc: Service, settings: Config,
              model: ModelQuery = None) -> Response:  # type: ignore[assignment]
    """The original image file of a dataset image (content type from its extension; ETag and
    Last-Modified, and 304 for a matching If-None-Match)."""
    path = svc.image_path(image_id, model)
    media_type = MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream")
    f = svc.open_image(path, image_id)  # the checked file itself (search/files.py open_served)
    if isinstance(path, ImageMember):  # inside a webdataset shard: its byte range (bounded), not a file
        with f:
            try:
                data, stat = path.read_from(f), os.fstat(f.fileno())
            except OSError:
                raise NotFound(f"image {image_id} cannot be read on the server") from None
        tag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}-{path.offset:x}-{path.size:x}"'  # the shard's state, the range
        response = Response(data, media_type=media_type, headers={"ETag": tag, **_cache_headers(settings)})
    else:
        response = OpenFileResponse(f, path, media_type=media_type, headers=_cache_headers(settings))
    etag = response.headers["etag"]
    if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        f.close()
        return Response(status_code=304, headers={"ETag": etag, **_cache_headers(settings)})
    return response


class OpenFileResponse(FileResponse):
    """A file response of a file the route opened (and checked): sent through its descriptor
    (``/proc/self/fd/N`` reopens that very file, whatever its name leads to by now), closed once sent."""

    def __init__(self, f, path, **kw):
        self._file = f
        by_fd = f"/proc/self/fd/{f.fileno()}"
        super().__init__(by_fd if os.path.exists(by_fd) else path, stat_result=os.fstat(f.fileno()), **kw)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._file.close()


@router.get("/images/{image_id}/thumbnail", response_class=Response,
            responses={200: {"content": {"image/jpeg": BINARY}, "description": "a JPEG thumbnail"},
                       **COMMON_ERRORS, **errors(404)})
def get_thumbnail(image_id: ImageIdPath, svc: Service, settings: Config,
                  size: Annotated[int, Query(ge=32, le=1024, description="longest side in pixels")] = 256,
                  model: ModelQuery = None) -> Response:  # type: ignore[assignment]
    """A JPEG thumbnail whose longest side is ``size`` pixels (kept in an in-memory LRU cache)."""
    return Response(svc.thumbnail(image_id, size, model), media_type="image/jpeg", headers=_cache_headers(settings))


def _caption_info(name: str, c: DatasetCaption) -> CaptionInfo:
    img = c.image_id
    return CaptionInfo(id=c.id, model=name, text=c.text, image_id=img,
                       image_url=None if img is None else image_url(img, name),
                       thumbnail_url=None if img is None else thumbnail_url(img, name))


@router.get("/captions/{caption_id}", response_model=CaptionInfo, responses={**COMMON_ERRORS, **errors(404)})
async def get_caption(caption_id: Annotated[int, Path(ge=0, le=MAX_ID, description="a dataset caption id")],
                      svc: Service, model: ModelQuery = None) -> CaptionInfo:  # type: ignore[assignment]
    """A dataset caption and the image it describes (searched in every model's index unless ``model``)."""
    if model is not None:
        return _caption_info(model, svc.caption(model, caption_id))
    svc.registry.get(None)  # 503 while nothing is loaded yet
    for name in list(svc.registry.entries):
        try:
            return _caption_info(name, svc.caption(name, caption_id))
        except NotFound:
            continue
    raise NotFound(f"caption id {caption_id} is not in any loaded index")


@router.get("/examples", response_model=list[CaptionInfo], responses={**COMMON_ERRORS, **errors(404)})
def examples(svc: Service, model: ModelQuery = None,  # type: ignore[assignment]
                   n: Annotated[int, Query(ge=1, le=100)] = 10,
                   seed: Annotated[int, Query(ge=0, le=2**32 - 1)] = 0) -> list[CaptionInfo]:
    """``n`` dataset captions drawn at random (reproducible by ``seed``): example queries for UIs. Without
    ``model``, from the first model whose index has ground truth (a dataset split, not a corpus)."""
    name = model or svc.registry.default_name_with_ground_truth
    return [_caption_info(name, c) for c in svc.sample_captions(name, n, seed)]
