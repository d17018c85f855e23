"""Slow-client protection (app/api/connections.py): what it costs and what it holds (loopback only).

    python bench/slow_clients.py [--model bl=indexes/bl ...] [--requests 20000] [--rounds 3] [--write]

1. **Cost**: the same tiny ASGI app served by uvicorn with its own HTTP protocol and with
   ``GuardedHTTPProtocol``, in alternating rounds (subprocess servers, one at a time), under a
   keep-alive load of small requests: the median requests/s of each and their ratio (same run, same
   machine).
   Whichever parser and loop are installed are used (h11 + asyncio, or httptools + uvloop).
2. **Hold** (with ``--model``): `ltd serve` under a 1,024-descriptor limit, 1,100 connections that
   never finish their headers; /api/health polled every 0.2 s: worst latency, failures, how many of
   the slow connections the server closed, and the size of its log.

``--write`` replaces the "Slow clients" section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import _server  # noqa: E402
from bench._common import publish  # noqa: E402
from bench._machine import machine_line, today  # noqa: E402

SECTION = "## Slow clients (bench/slow_clients.py)"
PROTOCOLS = {"uvicorn": "uvicorn.protocols.http.auto:AutoHTTPProtocol",
             "guarded": "app.api.connections:GuardedHTTPProtocol"}
TINY_APP = """
import sys, uvicorn
from uvicorn.config import Config
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")]})
    await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http=sys.argv[2], log_level="warning")
"""


async def _load(port: int, requests: int, concurrency: int) -> float:
    """Requests/s of GET / over ``concurrency`` keep-alive connections."""
    request = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    left = [requests]

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - t0)


def cost(requests: int, rounds: int, concurrency: int) -> dict:
    rates: dict[str, list[float]] = {name: [] for name in PROTOCOLS}
    for _ in range(rounds):
        for name, proto in PROTOCOLS.items():
            port = _server.free_port()
            proc = subprocess.Popen([sys.executable, "-c", TINY_APP, str(port), proto], cwd=ROOT,
                                    env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
            try:
                while _server.status(f"http://127.0.0.1:{port}/") != 200:
                    time.sleep(0.1)
                asyncio.run(_load(port, requests // 10, concurrency))  # warm-up
                rates[name].append(asyncio.run(_load(port, requests, concurrency)))
            finally:
                proc.terminate()
                proc.wait(10)
    best = {name: float(statistics.median(r)) for name, r in rates.items()}  # a shared machine: medians
    return {"rates": rates, "best": best, "ratio": best["guarded"] / best["uvicorn"]}


def hold(model_args: list[str], n_slow: int = 1100, seconds: float = 13.0) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n_slow + 256)), hard))
    log = Path(tempfile.mkdtemp(prefix="ltd-slow-")) / "serve.log"
    out: dict = {"latencies": [], "failures": 0}
    with _server.serving(model_args, log, nofile=1024) as (_, base):
        port = int(base.rsplit(":", 1)[1])
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                ok = _server.status(base + "/api/health") == 200
                out["latencies"].append(time.monotonic() - t0)
                out["failures"] += not ok
                time.sleep(0.2)

        poller = threading.Thread(target=poll)
        poller.start()
        t0 = time.monotonic()
        socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(n_slow)]
        out["connect_s"] = time.monotonic() - t0
        for s in socks:
            s.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        _server.dribble_headers(socks, seconds)
        stop.set()
        poller.join()
        closed = sum(_server.closed_by_server(s) for s in socks)
        for s in socks:
            s.close()
    out.update(closed=closed, n_slow=n_slow, log_bytes=log.stat().st_size,
               worst_s=max(out["latencies"]), polls=len(out["latencies"]))
    return out


def report(c: dict, h: dict | None, args) -> str:
    try:
        import httptools  # noqa: F401
        parser = "httptools"
    except ImportError:
        parser = "h11"
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    lines = [SECTION, "", f"{machine_line()}, {today()}. Command: `python bench/slow_clients.py "
             f"{' '.join(sys.argv[1:])}` (parser {parser}, loop {loop}).", "",
             "| server protocol | requests/s (median of rounds) | rounds |", "|---|---:|---|"]
    for name, rates in c["rates"].items():
        lines.append(f"| {name} | {c['best'][name]:,.0f} | {', '.join(f'{r:,.0f}' for r in rates)} |")
    lines += ["", f"Guarded / uvicorn: **{c['ratio']:.2f}×** (GET of a 15-byte answer, {args.concurrency} "
              "keep-alive connections; the deadlines' cost per request is an attribute check or two)."]
    if h:
        lines += ["", f"Under `ulimit -n 1024`, {h['n_slow']:,} connections that never finish their headers "
                  f"(a header line a second, for 13 s): /api/health polled {h['polls']} times, worst "
                  f"**{h['worst_s']:.2f} s**, {h['failures']} failures; the server closed {h['closed']:,} of "
                  f"{h['n_slow']:,} (header deadline 10 s, or evicted for newer connections); log "
                  f"**{h['log_bytes']:,} bytes** (before: health stopped answering, ~180 MB of "
                  "`Too many open files` in 30 s). The attacker's connects took "
                  f"{h['connect_s']:.1f} s (the listen backlog is 1/8 of the descriptor limit)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="NAME=INDEX_DIR")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    c = cost(args.requests, args.rounds, args.concurrency)
    h = hold([a for m in args.model for a in ("--model", m)]) if args.model else None
    text = report(c, h, args)
    publish(SECTION, text, args.write)


if __name__ == "__main__":
    main()
