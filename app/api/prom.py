"""Prometheus metrics without a dependency: a pure-ASGI middleware that counts requests by method,
route template and status, and times them into a latency histogram by route; ``render`` writes the
text exposition format (version 0.0.4) served at GET /metrics.

Routes are labelled by their template (``/api/images/{image_id}``), never the raw path, so label
cardinality stays bounded; paths that match no route share the label ``<unmatched>``.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds; tuned for a search API whose answers take milliseconds (uploads take ~0.1 s).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNMATCHED = "<unmatched>"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kv: str) -> str:
    return ",".join(f'{k}="{_escape(str(v))}"' for k, v in kv.items())


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) or abs(x) >= 1e15 else str(int(x))


class Registry:
    """Request counters and latency histograms, safe to update from many threads."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS, prefix: str = "ltd"):
        self.buckets, self.prefix = tuple(sorted(buckets)), prefix
        self._lock = threading.Lock()
        self._count: dict[tuple[str, str, str], int] = {}
        self._hist: dict[tuple[str, str], list] = {}  # (method, route) → [bucket counts..., sum, count]
        self.in_progress = 0
        # name → (type, help, callable returning [(labels dict, value)]): gauges read at scrape time.
        self._collectors: dict[str, tuple[str, str, Callable[[], Iterable[tuple[dict, float]]]]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            key = (method, route, str(status))
            self._count[key] = self._count.get(key, 0) + 1
            h = self._hist.get((method, route))
            if h is None:
                h = self._hist[(method, route)] = [0] * len(self.buckets) + [0.0, 0]
            i = bisect.bisect_left(self.buckets, seconds)
            if i < len(self.buckets):
                h[i] += 1  # cumulated when rendered
            h[-2] += seconds
            h[-1] += 1

    def add_collector(self, name: str, kind: str, help_text: str,
                      fn: Callable[[], Iterable[tuple[dict, float]]]) -> None:
        self._collectors[name] = (kind, help_text, fn)

    def render(self) -> str:
        p = self.prefix
        with self._lock:
            counts = sorted(self._count.items())
            hists = sorted((k, list(v)) for k, v in self._hist.items())
            in_progress = self.in_progress
        out = [f"# HELP {p}_http_requests_total HTTP requests by method, route template and status code.",
               f"# TYPE {p}_http_requests_total counter"]
        out += [f"{p}_http_requests_total{{{_labels(method=m, route=r, status=s)}}} {n}" for (m, r, s), n in counts]
        out += [f"# HELP {p}_http_request_duration_seconds HTTP request latency by method and route template.",
                f"# TYPE {p}_http_request_duration_seconds histogram"]
        for (m, r), h in hists:
            lab = _labels(method=m, route=r)
            cum = 0
            for le, c in zip(self.buckets, h):
                cum += c
                out.append(f'{p}_http_request_duration_seconds_bucket{{{lab},le="{_num(le)}"}} {cum}')
            out.append(f'{p}_http_request_duration_seconds_bucket{{{lab},le="+Inf"}} {h[-1]}')
            out.append(f"{p}_http_request_duration_seconds_sum{{{lab}}} {h[-2]!r}")
            out.append(f"{p}_http_request_duration_seconds_count{{{lab}}} {h[-1]}")
        out += [f"# HELP {p}_http_requests_in_progress HTTP requests being served.",
                f"# TYPE {p}_http_requests_in_progress gauge", f"{p}_http_requests_in_progress {in_progress}"]
        for name, (kind, help_text, fn) in sorted(self._collectors.items()):
            out += [f"# HELP {p}_{name} {help_text}", f"# TYPE {p}_{name} {kind}"]
            for labels, value in fn():
                lab = "{" + _labels(**labels) + "}" if labels else ""
                out.append(f"{p}_{name}{lab} {_num(value)}")
        return "\n".join(out) + "\n"


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
        status = 500  # an exception that escapes everything becomes a 500 for the client

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        reg = self.registry
        path, root0 = scope.get("path", ""), scope.get("root_path", "")
        reg.in_progress += 1  # one event loop: no lock needed for this gauge
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            reg.in_progress -= 1
            template = getattr(scope.get("route"), "path", None)
            if template is None:
                template = self._unrouted(path)
            else:  # a route of a mounted app (the UI at /ui) is relative to its mount point
                root = scope.get("root_path", "")
                if root != root0 and root.startswith(root0):
                    template = root[len(root0):] + template
            reg.observe(scope.get("method", "GET"), template, status, time.perf_counter() - t0)
