"""The load generator of bench/api_load.py: a minimal keep-alive HTTP/1.1 client on asyncio (far less
CPU per request than a general client, so the measurement loads the server, not itself), or httpx,
with a fixed number of requests in flight; every answer is parsed and checked."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import numpy as np


class RawConnection:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def post_json(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", header)
        if m is None:
            raise RuntimeError("response without Content-Length")
        data = await self.reader.readexactly(int(m.group(1)))
        if re.search(rb"(?i)\r\nconnection:\s*close", header):
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None


def _check(status: int, data: bytes, k: int) -> str | None:
    """None for a good answer, else a short reason."""
    if status != 200:
        return f"HTTP {status}"
    try:
        body = json.loads(data)
    except ValueError:
        return "invalid JSON"
    if not isinstance(body.get("results"), list) or not body["results"] or len(body["results"]) > k:
        return "bad results"
    return None


async def run_load(host: str, port: int, queries: list[str], model: str, k: int, concurrency: int,
                   max_seconds: float, client: str, path: str = "/api/search/text", settle: int = 0) -> dict:
    """Send ``queries`` over ``concurrency`` keep-alive connections. The first ``settle`` requests open the
    connections and wake an idle server: checked for errors, but timed apart (``settle_ms``) and left out of
    the latencies and the throughput, which start when request ``settle`` is sent."""
    bodies = [json.dumps({"query": q, "model": model, "k": k}).encode() for q in queries]
    lat = np.full(len(bodies), np.nan)
    errors: dict[str, int] = {}
    next_i = 0
    deadline = time.perf_counter() + max_seconds
    started = time.perf_counter()  # when the timed part began

    async def worker(send) -> None:
        nonlocal next_i, started
        while next_i < len(bodies) and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            t0 = time.perf_counter()
            if i == settle:
                started = t0
            try:
                status, data = await send(bodies[i])
                why = _check(status, data, k)
            except Exception as e:  # connection errors count as errors, the run goes on
                why = type(e).__name__
            lat[i] = time.perf_counter() - t0
            if why:
                errors[why] = errors.get(why, 0) + 1

    if client == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", limits=limits, timeout=60) as c:
            async def send_httpx(b: bytes) -> tuple[int, bytes]:
                r = await c.post(path, content=b, headers={"content-type": "application/json"})
                return r.status_code, r.content

            await asyncio.gather(*(worker(send_httpx) for _ in range(concurrency)))
    else:
        conns = [RawConnection(host, port) for _ in range(concurrency)]

        def sender(conn: RawConnection):
            async def send_raw(b: bytes) -> tuple[int, bytes]:
                try:
                    return await conn.post_json(path, b)
                except Exception:
                    await conn.close()  # reconnect on the next request
                    raise
            return send_raw

        await asyncio.gather(*(worker(sender(c)) for c in conns))
        for c in conns:
            await c.close()
    wall = time.perf_counter() - started
    timed, first = lat[settle:], lat[:settle]
    return summary(timed[~np.isnan(timed)] * 1000, wall) | {"errors": errors, "settle_ms": first[~np.isnan(first)] * 1000}


def summary(lat_ms: np.ndarray, wall: float) -> dict:
    return {"requests": len(lat_ms), "wall_s": wall, "qps": len(lat_ms) / wall, "lat_ms": lat_ms,
            "p50_ms": float(np.percentile(lat_ms, 50)), "p90_ms": float(np.percentile(lat_ms, 90)),
            "p99_ms": float(np.percentile(lat_ms, 99)), "max_ms": float(lat_ms.max()), "mean_ms": float(lat_ms.mean())}


def merged(parts: list[dict]) -> dict:
    """Rounds of the same measurement as one: all latencies, total requests over total wall time."""
    out = summary(np.concatenate([r["lat_ms"] for r in parts]), sum(r["wall_s"] for r in parts))
    if "settle_ms" in parts[0]:
        out["settle_ms"] = np.concatenate([r["settle_ms"] for r in parts])
    out |= {k: sum(r[k] for r in parts) for k in ("cpu_s", "client_cpu_s") if k in parts[0]}
    errors: dict[str, int] = {}
    for r in parts:
        for why, n in r.get("errors", {}).items():
            errors[why] = errors.get(why, 0) + n
    return out | {"errors": errors}


