"""bench/_load_client.py against a stub HTTP server on loopback: every request is counted and checked, and
the first ``settle`` requests are timed apart (left out of the latencies and the throughput)."""
from __future__ import annotations

import asyncio
import json

from bench._load_client import merged, run_load

SLOW_S = 0.25


async def stub_server(slow_first: int):
    """A keep-alive HTTP/1.1 server answering a search-shaped body; the first ``slow_first`` requests wait."""
    seen = 0
    body = json.dumps({"results": [{"id": 1}]}).encode()

    async def handle(reader, writer):
        nonlocal seen
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
                await reader.readexactly(n)
                seen += 1
                if seen <= slow_first:
                    await asyncio.sleep(SLOW_S)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], lambda: seen


def test_settling_requests_are_timed_apart():
    async def scenario():
        server, port, seen = await stub_server(slow_first=4)
        async with server:
            r = await run_load("127.0.0.1", port, ["q"] * 40, "m", 10, 4, 60, "raw", settle=8)
        return r, seen()

    r, seen = asyncio.run(scenario())
    assert seen == 40 and r["errors"] == {}
    assert r["requests"] == 32 and len(r["settle_ms"]) == 8
    assert r["max_ms"] < SLOW_S * 1000 <= r["settle_ms"].max()  # the slow starts are only in settle_ms
    both = merged([r, r])
    assert both["requests"] == 64 and len(both["settle_ms"]) == 16


def test_without_settle_every_request_is_timed():
    async def scenario():
        server, port, _ = await stub_server(slow_first=2)
        async with server:
            return await run_load("127.0.0.1", port, ["q"] * 10, "m", 10, 2, 60, "raw")

    r = asyncio.run(scenario())
    assert r["requests"] == 10 and len(r["settle_ms"]) == 0 and r["max_ms"] >= SLOW_S * 1000
