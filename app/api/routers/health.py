"""Service state: health (for load balancers and Docker's HEALTHCHECK) and the model registry."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse

from app.api.routers.deps import COMMON_ERRORS, errors, get_service
from app.api.schemas import HealthResponse, ModelInfo
from search import SearchService

router = APIRouter(prefix="/api", tags=["service"])
Service = Annotated[SearchService, Depends(get_service)]


@router.get("/health", response_model=HealthResponse,
            responses={503: {"model": HealthResponse, "description": "models are loading, or none could be loaded"}})
async def health(svc: Service) -> JSONResponse:
    """200 ``ok`` once every model is loaded, 200 ``degraded`` when some serve and others could not be
    loaded (``down`` says which and why); 503 ``loading`` before, 503 ``error`` when none could be loaded.
    Open without a token (load balancers): the reasons name files, never the server's folders."""
    body = HealthResponse.model_validate(svc.registry.health(), from_attributes=True)
    return JSONResponse(body.model_dump(), status_code=200 if body.status in ("ok", "degraded") else 503,
                        headers={"Cache-Control": "no-store"})


@router.get("/models", response_model=list[ModelInfo], responses=COMMON_ERRORS)
async def list_models(svc: Service) -> list[ModelInfo]:
    """Every model: a serving one's dataset, split, counts, embedding size, evaluation summary and manifest;
    one that could not be loaded as ``status: "down"`` with the reason, while the others serve. 503 while
    the models are still loading."""
    return [ModelInfo.model_validate(m, from_attributes=True) for m in svc.models()]


@router.get("/models/{name}", response_model=ModelInfo, responses={**COMMON_ERRORS, **errors(404)})
async def get_model(name: Annotated[str, Path(min_length=1, max_length=100)], svc: Service) -> ModelInfo:
    """One served model: dataset, split, counts, index, training summary and eval report (404 for an
    unknown name, 503 while loading)."""
    return ModelInfo.model_validate(svc.model_info(name), from_attributes=True)
