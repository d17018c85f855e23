"""REST API load test: text → image search against a live `ltd serve` (run on demand, not a test).

    python bench/api_load.py --model ltd=indexes/ltd [--model bl=indexes/bl] [--requests 10000]
                             [--concurrency 16] [--cache on|off] [--write]

1. starts `ltd serve` on 127.0.0.1 as a subprocess (no UI) and waits for /api/health;
2. draws the queries from the served index's own caption texts (with replacement, fixed seed: the
   same query repeats, as on a real service); ``--cache off`` starts the server with its query
   embedding cache disabled, ``--cache on`` leaves it on, and the hit rate read back from the
   server's /metrics is reported either way;
3. runs the load from this process with a small keep-alive HTTP/1.1 client on asyncio
   (``--client httpx`` uses httpx.AsyncClient instead), ``--concurrency`` requests in flight,
   bounded by ``--requests`` and ``--max-seconds``; every answer is parsed and checked;
4. stops the server, then times the same queries in process through SearchService (the encode +
   search the handler runs), sequentially and with ``--concurrency`` threads, and reports
   API p50 / in-process p50.

``--profile FILE`` samples the server with py-spy during the measured load (collapsed stacks into
FILE) and prints where its CPU went, stage by stage (bench/_profile.py).

``--write`` replaces the "REST API load" section of BENCHMARKS.md (other sections are kept).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import _profile, _server  # noqa: E402
from bench._common import replace_section  # noqa: E402

BENCHMARKS = ROOT / "BENCHMARKS.md"
SECTION = "## REST API load (bench/api_load.py)"
PROFILE_HZ = 100
TARGETS = {"p50_ms": 10.0, "p99_ms": 50.0, "errors": 0, "ratio": 2.0}


# ---- a minimal keep-alive HTTP/1.1 client (far less CPU per request than a general client) ----------
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
                   max_seconds: float, client: str, path: str = "/api/search/text") -> dict:
    bodies = [json.dumps({"query": q, "model": model, "k": k}).encode() for q in queries]
    lat = np.full(len(bodies), np.nan)
    errors: dict[str, int] = {}
    next_i = 0
    deadline = time.perf_counter() + max_seconds

    async def worker(send) -> None:
        nonlocal next_i
        while next_i < len(bodies) and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            t0 = time.perf_counter()
            try:
                status, data = await send(bodies[i])
                why = _check(status, data, k)
            except Exception as e:  # connection errors count as errors, the run goes on
                why = type(e).__name__
            lat[i] = time.perf_counter() - t0
            if why:
                errors[why] = errors.get(why, 0) + 1

    t0 = time.perf_counter()
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
    wall = time.perf_counter() - t0
    done = lat[~np.isnan(lat)] * 1000
    return {"requests": len(done), "wall_s": wall, "qps": len(done) / wall, "errors": errors,
            "p50_ms": float(np.percentile(done, 50)), "p90_ms": float(np.percentile(done, 90)),
            "p99_ms": float(np.percentile(done, 99)), "max_ms": float(done.max()), "mean_ms": float(done.mean())}


# ---- the server ------------------------------------------------------------------------------------
def server_args(models: list[str], args) -> list[str]:
    cmd = ["--host", "127.0.0.1", "--no-ui", "--workers", str(args.workers), "--torch-threads", str(args.torch_threads),
           "--log-level", "warning"]
    if args.quantize_text:
        cmd.append("--quantize-text")
    for m in models:
        cmd += ["--model", m]
    if args.cache == "off":
        cmd.append("--no-text-cache")
    if args.batching == "off":
        cmd.append("--no-batching")
    return cmd


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def scrape(port: int) -> dict[str, float]:
    """Unlabelled samples of /metrics (the service counters)."""
    _, body = http_get(port, "/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


# ---- in process ------------------------------------------------------------------------------------
def in_process(index_dirs: dict[str, str], model: str, queries: list[str], k: int, args) -> dict:
    from app.api.main import apply_thread_settings
    from app.api.settings import Settings

    settings = Settings(models=index_dirs, ui=False, torch_threads=args.torch_threads,
                        text_cache=0 if args.cache == "off" else Settings().text_cache,
                        text_batching=args.batching == "on", text_quantize=args.quantize_text)
    apply_thread_settings(settings)
    svc = settings.search_service()
    svc.load()

    def one(q: str) -> float:
        t0 = time.perf_counter()
        svc.search_text(model, query=q, k=k)
        return (time.perf_counter() - t0) * 1000

    for q in queries[: min(200, len(queries))]:  # warm-up, as for the server
        one(q)
    svc.clear_text_cache()
    seq = np.array([one(q) for q in queries])
    svc.clear_text_cache()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        conc = np.array(list(pool.map(one, queries)))
    wall = time.perf_counter() - t0
    info = svc.text_cache_info()
    svc.close()
    return {"seq_p50_ms": float(np.percentile(seq, 50)), "seq_p99_ms": float(np.percentile(seq, 99)),
            "conc_p50_ms": float(np.percentile(conc, 50)), "conc_p99_ms": float(np.percentile(conc, 99)),
            "conc_qps": len(queries) / wall, "cache": info}


# ---- report ----------------------------------------------------------------------------------------
def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        cpu = re.search(r"Model name:\s*(.+)", lscpu).group(1).strip()
    except (OSError, subprocess.CalledProcessError, AttributeError):
        cpu = platform.processor() or "unknown CPU"
    import faiss
    import torch

    return (f"{cpu}, {os.cpu_count()} cores (nproc), Python {platform.python_version()}, torch {torch.__version__}, "
            f"faiss {faiss.__version__}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")


def render(r: dict) -> str:
    a, ip, srv = r["api"], r["inproc"], r["server"]
    ratio = a["p50_ms"] / ip["seq_p50_ms"]
    ratio_c = a["p50_ms"] / ip["conc_p50_ms"]
    n_err = sum(a["errors"].values())
    hits, misses = srv.get("ltd_text_cache_hits_total", 0), srv.get("ltd_text_cache_misses_total", 0)
    calls, enc = srv.get("ltd_text_encoder_calls_total", 0), srv.get("ltd_text_encoder_queries_total", 0)

    def ok(v: float, t: float) -> str:
        return "yes" if v <= t else "**no**"

    lines = [
        SECTION, "",
        f"Measured {r['date']} with `{r['command']}` (1-min load average at start: {r['load']:.1f} on {os.cpu_count()} cores).",
        "", f"Machine: {r['machine']}.", "",
        f"Server: `ltd serve` (uvicorn, {r['workers']} worker process(es), no UI, torch threads "
        f"{r['torch_threads'] or 'default'}, text batching {r['batching']}, query-embedding cache {r['cache']}"
        f"{', int8 query encoder' if r['quantize'] else ''}), model "
        f"`{r['model']}` from `{r['index']}` ({r['n_images']:,} images); ready {r['startup_s']:.1f} s after start. "
        f"Load: {a['requests']:,} `POST /api/search/text` (k = {r['k']}) at concurrency {r['concurrency']} from a second "
        f"process ({r['client']} client, keep-alive), after {r['warmup']} warm-up requests; queries drawn with "
        f"replacement from the index's {r['n_texts']:,} caption texts ({r['unique']:,} distinct in this run).",
        "",
        "| what | value | target | met |", "|---|---:|---:|:-:|",
        f"| API p50 latency | {a['p50_ms']:.2f} ms | ≤ {TARGETS['p50_ms']:.0f} ms | {ok(a['p50_ms'], TARGETS['p50_ms'])} |",
        f"| API p99 latency | {a['p99_ms']:.2f} ms | ≤ {TARGETS['p99_ms']:.0f} ms | {ok(a['p99_ms'], TARGETS['p99_ms'])} |",
        f"| throughput | {a['qps']:,.0f} requests/s | | |",
        f"| errors | {n_err}{' ' + json.dumps(a['errors']) if n_err else ''} | 0 | {ok(n_err, 0)} |",
    ]
    if ip["seq_p50_ms"] == ip["seq_p50_ms"]:  # not NaN: the in-process part ran
        lines += [
            f"| in-process encode + search p50 (sequential) | {ip['seq_p50_ms']:.2f} ms (p99 {ip['seq_p99_ms']:.2f}) | | |",
            f"| API p50 / in-process p50 | {ratio:.1f} | ≤ {TARGETS['ratio']:.0f} | {ok(ratio, TARGETS['ratio'])} |",
            f"| in-process, {r['concurrency']} threads: p50 / throughput | {ip['conc_p50_ms']:.2f} ms / "
            f"{ip['conc_qps']:,.0f} per s | | |",
            f"| API p50 / in-process p50 at the same concurrency | {ratio_c:.1f} | | |",
        ]
    lines += [
        "",
        f"API latency p90 {a['p90_ms']:.2f} ms, max {a['max_ms']:.1f} ms, mean {a['mean_ms']:.2f} ms. "
        f"Server counters over the measured requests: query-embedding cache "
        + (f"{hits:,.0f} hits / {misses:,.0f} misses (hit rate {hits / max(1, hits + misses):.0%})" if r["cache"] == "on"
           else "off (every query encoded)")
        + (f"; {enc:,.0f} encodings in {calls:,.0f} batched encoder calls (mean batch {enc / calls:.1f})" if calls else "")
        + ".",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    replace_section(SECTION, text, BENCHMARKS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=INDEX_DIR", help="as for ltd serve")
    p.add_argument("--target", help="model to query (default: the last --model)")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--max-seconds", type=float, default=600, help="stop the load after this long")
    p.add_argument("--cache", choices=("on", "off"), default="off", help="server's query-embedding cache")
    p.add_argument("--batching", choices=("on", "off"), default="on", help="server's text micro-batching")
    p.add_argument("--torch-threads", type=int, default=0, help="server's intra-op torch threads (0 = torch default)")
    p.add_argument("--quantize-text", action="store_true", help="server encodes queries with an int8 text encoder")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--client", choices=("raw", "httpx"), default="raw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-inproc", action="store_true", help="skip the in-process comparison")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="sample the server with py-spy during the load into FILE and print the breakdown")
    p.add_argument("--write", action="store_true", help="replace this section of BENCHMARKS.md")
    args = p.parse_args(argv)
    if args.profile and not _profile.available():
        p.error("--profile needs py-spy on PATH (pip install py-spy)")

    from app.cli.serve import parse_models

    index_dirs, _ = parse_models(args.model)
    target = args.target or list(index_dirs)[-1]
    if target not in index_dirs:
        p.error(f"--target {target} is not one of the --model names")
    manifest = json.loads((Path(index_dirs[target]) / "manifest.json").read_text())
    texts = json.loads((Path(index_dirs[target]) / manifest["files"]["captions.json"]["file"]).read_text())["texts"]
    n_images = manifest["counts"]["images"]
    rng = np.random.default_rng(args.seed)
    queries = [texts[i] for i in rng.integers(0, len(texts), args.requests)]
    warm = [texts[i] for i in rng.integers(0, len(texts), args.warmup)]

    load = os.getloadavg()[0]
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ltd_api_load_{os.getpid()}.log"
    t0 = time.perf_counter()
    proc, base = _server.start(server_args([f"{n}={d}" for n, d in index_dirs.items()], args), log_path, timeout=600)
    port = int(base.rsplit(":", 1)[1])
    try:
        startup = time.perf_counter() - t0
        print(f"server ready on port {port} after {startup:.1f} s (log: {log_path})", file=sys.stderr)
        if warm:
            asyncio.run(run_load("127.0.0.1", port, warm, target, args.k, args.concurrency, 120, args.client))
        before = scrape(port)
        spy = _profile.record(proc.pid, args.profile, PROFILE_HZ) if args.profile else None
        try:
            api = asyncio.run(run_load("127.0.0.1", port, queries, target, args.k, args.concurrency,
                                       args.max_seconds, args.client))
        finally:
            if spy is not None:
                _profile.finish(spy)
        after = scrape(port)
    finally:
        _server.stop(proc)
    if args.profile:
        print("\n".join(_profile.render(_profile.breakdown(args.profile), api["requests"], PROFILE_HZ)))
    server = {k: after[k] - before.get(k, 0) for k in after}
    print(json.dumps({"api": api, "server": server}, indent=1), file=sys.stderr)
    inproc = {"seq_p50_ms": float("nan"), "seq_p99_ms": float("nan"), "conc_p50_ms": float("nan"),
              "conc_p99_ms": float("nan"), "conc_qps": float("nan")}
    if not args.no_inproc:
        inproc = in_process(index_dirs, target, queries[: api["requests"]], args.k, args)
        print(json.dumps(inproc, indent=1), file=sys.stderr)
    report = {"api": api, "server": server, "inproc": inproc, "date": dt.date.today().isoformat(), "load": load,
              "machine": machine(), "command": "python bench/api_load.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "workers": args.workers, "torch_threads": args.torch_threads, "batching": args.batching,
              "quantize": args.quantize_text,
              "cache": args.cache, "model": target, "index": index_dirs[target], "n_images": n_images,
              "startup_s": startup, "k": args.k, "concurrency": args.concurrency, "client": args.client,
              "warmup": len(warm), "n_texts": len(texts), "unique": len(set(queries[: api["requests"]]))}
    text = render(report)
    print(text)
    if args.write:
        write_section(text)
        print(f"wrote the section to {BENCHMARKS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
