"""Prometheus metrics on ``prometheus_client``: a pure-ASGI middleware that counts requests by method,
route template and status and times them into a latency histogram by route, in a registry of the app's
own (several apps in one process, as in the tests, do not share counts); ``render`` writes the text
exposition format 0.0.4 served at GET /metrics.

Routes are labelled by their template (``/api/images/{image_id}``), never the raw path, so label
cardinality stays bounded; paths that match no route share the label ``<unmatched>``. A request whose
client went away before any answer was sent (an abandoned upload, a UI body never finished) is
counted as 499, nginx's "client closed request", not as a 500.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# Seconds; tuned for a search API whose answers take milliseconds (uploads take ~0.1 s).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNMATCHED = "<unmatched>"
CLIENT_CLOSED = 499
prometheus_client.disable_created_metrics()  # no *_created series: nothing here reads them

Samples = Callable[[], Iterable[tuple[dict, float]]]


class _Gauges:
    """Values read at scrape time from the service (models loaded, cache counters, runtimes)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.fns: dict[str, tuple[str, str, Samples]] = {}

    def collect(self):
        """The collectors' metric families, read now (prometheus_client calls this at every scrape)."""
        for name, (kind, help_text, fn) in sorted(self.fns.items()):
            rows = list(fn())
            keys = sorted({k for labels, _ in rows for k in labels})
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                f"{self.prefix}_{name}", help_text, labels=keys)
            for labels, value in rows:
                family.add_metric([str(labels.get(k, "")) for k in keys], value)
            yield family


class Registry:
    """The app's metrics: request counter, latency histogram, in-progress gauge and scrape-time
    collectors. Thread-safe (prometheus_client's metrics are)."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS, prefix: str = "ltd"):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(f"{prefix}_http_requests", "HTTP requests by method, route template and status "
                                "code.", ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram(f"{prefix}_http_request_duration_seconds", "HTTP request latency by method and "
                                 "route template.", ["method", "route"], buckets=buckets, registry=self.registry)
        self.in_progress = Gauge(f"{prefix}_http_requests_in_progress", "HTTP requests being served.",
                                 registry=self.registry)
        self._gauges = _Gauges(prefix)
        self.registry.register(self._gauges)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one finished request and add its duration to the route's histogram (thread-safe)."""
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def add_collector(self, name: str, kind: str, help_text: str, fn: Samples) -> None:
        """A metric ``PREFIX_NAME`` of ``kind`` ("gauge" or "counter") whose samples ``fn`` returns."""
        self._gauges.fns[name] = (kind, help_text, fn)

    def render(self) -> str:
        """The text exposition (format 0.0.4) of every metric, collectors read now (thread-safe)."""
        return prometheus_client.generate_latest(self.registry).decode()


class PrometheusMiddleware:
    """Times every HTTP request; reads the matched route from ``scope["route"]`` (set by FastAPI for
    its API routes). Requests without one (FastAPI's own /openapi.json and /docs, mounted apps) are
    labelled by ``fixed_paths`` (exact paths) and ``prefixes`` (mount points), else ``<unmatched>``."""

    def __init__(self, app: ASGIApp, registry: Registry, fixed_paths: Iterable[str] = (),
                 prefixes: Iterable[str] = ()):
        self.app, self.registry = app, registry
        self.fixed_paths, self.prefixes = frozenset(fixed_paths), tuple(prefixes)

    def _unrouted(self, path: str) -> str:
        if path in self.fixed_paths:
            return path
        for prefix in self.prefixes:
            if path == prefix or path.startswith(prefix + "/"):
                return prefix
        return UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status, gone = None, False

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def receive_wrapper() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        root0 = scope.get("root_path", "")
        self.registry.in_progress.inc()
        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            self.registry.in_progress.dec()
            if status is None:  # nothing was sent: the client left first, or an exception escaped everything
                status = CLIENT_CLOSED if gone else 500
            template = getattr(scope.get("route"), "path", None)
            if template is None:
                template = self._unrouted(scope.get("path", ""))
            else:  # a route of a mounted app (the UI at /ui) is relative to its mount point
                root = scope.get("root_path", "")
                if root != root0 and root.startswith(root0):
                    template = root[len(root0):] + template
            self.registry.observe(scope.get("method", "GET"), template, status, time.perf_counter() - t0)
