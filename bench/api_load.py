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
   in ``--rounds`` alternating with the same queries in process through SearchService from
   ``--concurrency`` threads (the server idles meanwhile). Each round's first ``--settle`` requests
   (new connections to a server that was idle) are checked but timed apart on both sides: the table
   gives the steady-state latencies and throughput, and the API p99 with those requests counted;
4. stops the server, then times queries in process one at a time, and reports API p50 / in-process
   p50.

``--profile FILE`` samples the server with py-spy during the measured load (collapsed stacks into
FILE) and prints where its CPU went, stage by stage (bench/_profile.py).

``--write`` replaces the "REST API load" section of BENCHMARKS.md (other sections are kept).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import platform
import re
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
from bench._load_client import merged, run_load, summary  # noqa: E402

BENCHMARKS = ROOT / "BENCHMARKS.md"
SECTION = "## REST API load (bench/api_load.py)"
PROFILE_HZ = 100
# Issue 44: p99 at concurrency 16, throughput against in process in the same run, p50 at concurrency 1.
TARGETS = {"p99_ms": 50.0, "errors": 0, "throughput": 0.5, "ratio_c1": 1.5}


# ---- the server ------------------------------------------------------------------------------------
def server_args(models: list[str], args) -> list[str]:
    cmd = ["--host", "127.0.0.1", "--no-ui", "--workers", str(args.workers), "--torch-threads", str(args.torch_threads),
           "--log-level", "warning"]
    if args.quantize_text:
        cmd.append("--quantize-text")
    cmd += ["--text-runtime", args.text_runtime]
    if args.text_runtime_threads:
        cmd += ["--text-runtime-threads", str(args.text_runtime_threads)]
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


def runtime_of(metrics: str, model: str) -> str:
    """The server's query runtime for ``model``, from its ``ltd_text_runtime_info`` sample."""
    m = re.search(r'ltd_text_runtime_info\{model="' + re.escape(model) + r'",runtime="([^"]*)",precision="([^"]*)"\}', metrics)
    return f"{m.group(1)} ({m.group(2)})" if m else "unknown"


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
class InProcess:
    """The same encode + search through SearchService in this process (the server idles meanwhile), at
    the library's defaults: torch's own thread count, whatever ``--torch-threads`` gives the server."""

    def __init__(self, index_dirs: dict[str, str], model: str, k: int, args):
        from app.api.main import apply_thread_settings
        from app.api.settings import Settings

        settings = Settings(models=index_dirs, ui=False, torch_threads=0,
                            text_cache=0 if args.cache == "off" else Settings().text_cache,
                            text_batching=args.batching == "on", text_quantize=args.quantize_text,
                            text_runtime=args.text_runtime, text_runtime_threads=args.text_runtime_threads)
        apply_thread_settings(settings)
        self.svc, self.model, self.k, self.concurrency = settings.search_service(), model, k, args.concurrency
        self.svc.registry.load()
        # as the server does once its models load (app.api.main.freeze_when_loaded): a full collection of
        # this process's loaded models would otherwise pause the load client and the in-process side alike
        gc.collect()
        gc.freeze()

    def one(self, q: str) -> float:
        t0 = time.perf_counter()
        self.svc.search_text(self.model, query=q, k=self.k)
        return (time.perf_counter() - t0) * 1000

    def sequential(self, queries: list[str]) -> dict:
        """One query at a time. The rounds' queries again: with the query cache off nothing remembers them
        (served queries no longer enter the model's frozen-tower memory), so each is encoded afresh."""
        self.svc.encoder.clear()
        return summary(np.array([self.one(q) for q in queries]), 1.0)

    def concurrent(self, queries: list[str], settle: int = 0) -> dict:
        """``queries`` from ``concurrency`` threads; the first ``settle`` untimed, as on the API side."""
        self.svc.encoder.clear()
        with ThreadPoolExecutor(self.concurrency) as pool:
            list(pool.map(self.one, queries[:settle]))
            t0 = time.perf_counter()
            lat = np.array(list(pool.map(self.one, queries[settle:])))
        return summary(lat, time.perf_counter() - t0)


def measure(port: int, pid: int, queries: list[str], target: str, args, inproc: InProcess | None) -> tuple[dict, dict, list]:
    """``--rounds`` alternations of the API load and the in-process run on the same slice of queries:
    on a shared machine the background load drifts, and alternating exposes both to the same drift.
    Returns (API, in-process concurrent, per-round throughput ratios API / in-process)."""
    api_parts, ip_parts, ratios = [], [], []
    deadline = time.perf_counter() + args.max_seconds
    for chunk in np.array_split(np.arange(len(queries)), args.rounds):
        part = [queries[i] for i in chunk]
        left = max(1.0, deadline - time.perf_counter())
        cpu0, own0 = _server.cpu_seconds(pid), time.process_time()
        api_parts.append(asyncio.run(run_load("127.0.0.1", port, part, target, args.k, args.concurrency, left,
                                              args.client, settle=args.settle)))
        api_parts[-1] |= {"cpu_s": _server.cpu_seconds(pid) - cpu0, "client_cpu_s": time.process_time() - own0}
        if inproc is not None:
            own0 = time.process_time()
            ip_parts.append(inproc.concurrent(part[: args.settle + api_parts[-1]["requests"]], args.settle))
            ip_parts[-1]["cpu_s"] = time.process_time() - own0
            ratios.append(api_parts[-1]["qps"] / ip_parts[-1]["qps"])
        print(f"round {len(api_parts)}: API {api_parts[-1]['qps']:,.0f}/s"
              + (f", in process {ip_parts[-1]['qps']:,.0f}/s" if ip_parts else ""), file=sys.stderr)
    return merged(api_parts), (merged(ip_parts) if ip_parts else {}), ratios


# ---- report ----------------------------------------------------------------------------------------
def loop_and_parser() -> dict:
    """What uvicorn's "auto" picks in the server: uvloop and httptools when they are installed."""
    import importlib.util

    return {name: importlib.util.find_spec(name) is not None for name in ("uvloop", "httptools")}


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


def _ok(good: bool) -> str:
    return "yes" if good else "**no**"


def _per(m: dict, key: str) -> str:
    return f"{m[key] * 1000 / m['requests']:.2f}"


def _rows(r: dict) -> list[str]:
    a, ip, seq = r["api"], r["inproc"], r["sequential"]
    n_err = sum(a["errors"].values())
    rows = [
        "| what | value | target | met |", "|---|---:|---:|:-:|",
        f"| API p50 latency | {a['p50_ms']:.2f} ms | | |",
        f"| API p99 latency | {a['p99_ms']:.2f} ms | ≤ {TARGETS['p99_ms']:.0f} ms | {_ok(a['p99_ms'] <= TARGETS['p99_ms'])} |",
        f"| API throughput | {a['qps']:,.0f} requests/s | | |",
        f"| API p99 latency counting each round's first {r['settle']} requests too (new connections to a server that "
        f"idled during the in-process round) | {r['p99_all_ms']:.2f} ms | | |",
        f"| errors | {n_err}{' ' + json.dumps(a['errors']) if n_err else ''} | 0 | {_ok(n_err == 0)} |",
    ]
    if ip:
        ratio, rounds = a["qps"] / ip["qps"], sorted(r["ratios"])
        per_round = (f" (per round: median {np.median(rounds):.0%}, {rounds[0]:.0%} to {rounds[-1]:.0%})"
                     if len(rounds) > 1 else "")
        rows += [
            f"| in process, {r['concurrency']} threads: p50 / p99 / throughput | {ip['p50_ms']:.2f} / {ip['p99_ms']:.2f} ms"
            f" / {ip['qps']:,.0f} per s | | |",
            f"| API throughput / in-process throughput | {ratio:.0%}{per_round} | ≥ {TARGETS['throughput']:.0%} | "
            f"{_ok(ratio >= TARGETS['throughput'])} |",
            f"| CPU ms per query: server / load client / in process | {_per(a, 'cpu_s')} / {_per(a, 'client_cpu_s')} / "
            f"{_per(ip, 'cpu_s')} | | |",
        ]
    if seq:
        ratio = a["p50_ms"] / seq["p50_ms"]
        target = (f"≤ {TARGETS['ratio_c1']}", _ok(ratio <= TARGETS["ratio_c1"])) if r["concurrency"] == 1 else ("", "")
        rows += [f"| in process, sequential: p50 (p99) | {seq['p50_ms']:.2f} ms ({seq['p99_ms']:.2f}) | | |",
                 f"| API p50 / in-process sequential p50 | {ratio:.2f} | {target[0]} | {target[1]} |"]
    return rows


def render(r: dict) -> str:
    a, srv = r["api"], r["server"]
    hits, misses = srv.get("ltd_text_cache_hits_total", 0), srv.get("ltd_text_cache_misses_total", 0)
    calls, enc = srv.get("ltd_text_encoder_calls_total", 0), srv.get("ltd_text_encoder_queries_total", 0)
    lines = [
        SECTION, "",
        f"Measured {r['date']} with `{r['command']}` (1-min load average at start: {r['load']:.1f} on {os.cpu_count()} cores).",
        "", f"Machine: {r['machine']}.", "",
        f"Server: `ltd serve` (uvicorn{' + uvloop' if r['uvloop'] else ''}{' + httptools' if r['httptools'] else ''}, "
        f"{r['workers']} worker process(es), no UI, torch threads "
        f"{r['torch_threads'] or 'default'}, text batching {r['batching']}, query-embedding cache {r['cache']}"
        f"{', int8 query encoder' if r['quantize'] else ''}, queries encoded by {r['runtime']}, engine threads "
        f"{r.get('engine_threads') or 'cores − 1'}), model "
        f"`{r['model']}` from `{r['index']}` ({r['n_images']:,} images); ready {r['startup_s']:.1f} s after start. "
        f"Load: {a['requests']:,} `POST /api/search/text` (k = {r['k']}) at concurrency {r['concurrency']} from a second "
        f"process ({r['client']} client, keep-alive), after {r['warmup']} warm-up requests, each round's first "
        f"{r['settle']} untimed on both sides; queries drawn with "
        f"replacement from the index's {r['n_texts']:,} caption texts ({r['unique']:,} distinct in this run). "
        f"In process: the same queries through `SearchService.search_text` from {r['concurrency']} threads, "
        f"alternating with the API load in {r['rounds']} round(s) of equal size (the server idles meanwhile).",
        "", *_rows(r), "",
        f"API latency p90 {a['p90_ms']:.2f} ms, max {a['max_ms']:.1f} ms, mean {a['mean_ms']:.2f} ms. "
        f"Server counters over the rounds (their untimed first requests included): query-embedding cache "
        + (f"{hits:,.0f} hits / {misses:,.0f} misses (hit rate {hits / max(1, hits + misses):.0%})" if r["cache"] == "on"
           else "off (every query encoded)")
        + (f"; {enc:,.0f} encodings in {calls:,.0f} batched encoder calls (mean batch {enc / calls:.1f})" if calls else "")
        + ".",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    replace_section(SECTION, text, BENCHMARKS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=INDEX_DIR", help="as for ltd serve")
    p.add_argument("--target", help="model to query (default: the last --model)")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--settle", type=int, default=64,
                   help="untimed requests at the start of each round (on both sides; their API p99 is reported apart)")
    p.add_argument("--max-seconds", type=float, default=600, help="stop the load after this long")
    p.add_argument("--cache", choices=("on", "off"), default="off", help="server's query-embedding cache")
    p.add_argument("--batching", choices=("on", "off"), default="on", help="server's text micro-batching")
    p.add_argument("--torch-threads", type=int, default=0, help="server's intra-op torch threads (0 = torch default)")
    p.add_argument("--quantize-text", action="store_true", help="server encodes queries with an int8 text encoder")
    p.add_argument("--text-runtime", default="auto", help="as for ltd serve (default auto)")
    p.add_argument("--text-runtime-threads", type=int, default=0,
                   help="threads of the query engine, on both sides (0: as ltd serve, one fewer than the cores)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--client", choices=("raw", "httpx"), default="raw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-inproc", action="store_true", help="skip the in-process comparison")
    p.add_argument("--rounds", type=int, default=5, help="alternations of the API load and the in-process run")
    p.add_argument("--sequential", type=int, default=2000, help="queries timed one at a time in process")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="sample the server with py-spy during the load into FILE and print the breakdown")
    p.add_argument("--write", action="store_true", help="replace this section of BENCHMARKS.md")
    args = p.parse_args(argv)
    if args.profile and not _profile.available():
        p.error("--profile needs py-spy on PATH (pip install py-spy)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from app.cli.serve import parse_models

    index_dirs, _ = parse_models(args.model)
    target = args.target or list(index_dirs)[-1]
    if target not in index_dirs:
        raise SystemExit(f"--target {target} is not one of the --model names")
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
        inproc = None if args.no_inproc else InProcess(index_dirs, target, args.k, args)
        if inproc is not None:
            inproc.concurrent(warm)
        before = scrape(port)
        spy = _profile.record(proc.pid, args.profile, PROFILE_HZ) if args.profile else None
        try:
            api, conc, ratios = measure(port, proc.pid, queries, target, args, inproc)
        finally:
            if spy is not None:
                _profile.finish(spy)
        after = scrape(port)
        after_text = http_get(port, "/metrics")[1].decode()
    finally:
        _server.stop(proc)
    if args.profile:
        print("\n".join(_profile.render(_profile.breakdown(args.profile), api["requests"], PROFILE_HZ)))
    server = {k: after[k] - before.get(k, 0) for k in after}
    seq = {} if inproc is None else inproc.sequential(queries[: min(api["requests"], args.sequential)])
    report = {"api": api, "server": server, "inproc": conc, "sequential": seq, "ratios": ratios,
              "date": dt.date.today().isoformat(), "load": load, "machine": machine(),
              "command": "python bench/api_load.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "workers": args.workers, "torch_threads": args.torch_threads, "batching": args.batching,
              "quantize": args.quantize_text, "rounds": args.rounds, "engine_threads": args.text_runtime_threads, **loop_and_parser(),
              "runtime": runtime_of(after_text, target),
              "cache": args.cache, "model": target, "index": index_dirs[target], "n_images": n_images,
              "startup_s": startup, "k": args.k, "concurrency": args.concurrency, "client": args.client,
              "warmup": len(warm), "n_texts": len(texts), "unique": len(set(queries[: api["requests"]])),
              "settle": args.settle, "p99_all_ms": float(np.percentile(np.concatenate([api["lat_ms"], api["settle_ms"]]), 99))}
    text = render(report)
    print(text)
    if args.write:
        write_section(text)
        print(f"wrote the section to {BENCHMARKS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
