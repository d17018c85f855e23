"""GET /metrics: Prometheus text exposition (request counters and latency histograms from
app/api/prom.py, plus the service's cache and batching counters)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from app.api.prom import CONTENT_TYPE, Registry
from search import SearchService

router = APIRouter(tags=["ops"])


def register_service_collectors(registry: Registry, svc: SearchService) -> None:
    """Add the service's gauges and counters (models loaded, readiness, the query cache, the batchers and
    text runtimes) to ``registry``; they are read at every scrape."""
    models = svc.registry
    registry.add_collector("models_loaded", "gauge", "Models loaded and serving.",
                           lambda: [({}, len(models.entries) if models.ready.is_set() else 0)])
    registry.add_collector("ready", "gauge", "1 when every model is loaded.", lambda: [({}, int(models.ready.is_set()))])

    def cache(key: str):
        return lambda: [({}, svc.encoder.info()[key])]

    registry.add_collector("text_cache_hits_total", "counter", "Query embeddings served from the cache.", cache("hits"))
    registry.add_collector("text_cache_misses_total", "counter", "Query embeddings computed.", cache("misses"))
    registry.add_collector("text_encoder_calls_total", "counter", "Batched text-encoder calls.",
                           cache("encoder_calls"))
    registry.add_collector("text_encoder_queries_total", "counter", "Queries encoded by batched calls "
                           "(queries / calls = mean batch size).", cache("encoded_queries"))
    registry.add_collector("text_runtime_info", "gauge", "What encodes each model's text queries (always 1).",
                           lambda: [({"model": m, "runtime": r["runtime"], "precision": r["precision"]}, 1)
                                    for m, r in svc.encoder.info()["runtimes"].items()])


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format 0.0.4"}})
async def prometheus_metrics(request: Request) -> PlainTextResponse:
    """Prometheus text exposition: request counts and latency histograms by route, and the service's
    cache, batching and model counters."""
    return PlainTextResponse(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
