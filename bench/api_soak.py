"""API soak: thousands of mixed good and hostile requests against a live `ltd serve`, loopback only.

    python bench/api_soak.py --model bl=indexes/bl --model ltd=indexes/ltd [--requests 3000]
                             [--concurrency 8] [--max-seconds 600] [--write]

Starts `ltd serve` on 127.0.0.1 (UI mounted, so its routes are soaked too), then sends a fixed,
seeded mix: text and image searches (dataset ids and real uploads), compares, models, examples,
thumbnails, and bad input of every kind the server must answer with a 4xx (malformed and deeply
nested JSON, huge integers, lone surrogates, unknown models, oversized and non-image uploads,
decompression bombs, path traversal, files named as UI inputs, foreign Host headers, oversized UI
bodies). Records the count of 5xx answers (target 0) and of transport errors, p50/p99 latency per
kind, and the server's resident memory before and after. ``--write`` replaces the "API soak"
section of BENCHMARKS.md. Bounded by ``--requests`` and ``--max-seconds``; never leaves loopback.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import io
import json
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import _server  # noqa: E402
from bench._common import replace_section  # noqa: E402

SECTION = "## API soak (bench/api_soak.py)"


def _png(side: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), (20, 90, 160)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def _jpeg(side: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), (160, 90, 20)).save(buf, "JPEG", quality=70)
    return buf.getvalue()


def requests_mix(models: list[str], image_ids: list[int], caption_ids: list[int], texts: list[str], n: int,
                 seed: int) -> list[tuple[str, dict]]:
    """(kind, httpx request kwargs) × n, drawn with fixed weights; kinds ending in '!' must be 4xx."""
    rng = np.random.default_rng(seed)
    small_jpeg, bomb, big = _jpeg(320), _png(7100), _jpeg(4000)  # bomb: ~50 MP, tens of KB
    m = models[0]
    pool: list[tuple[str, float, object]] = [
        ("text", 20, lambda: {"method": "POST", "url": "/api/search/text",
                              "json": {"query": texts[rng.integers(len(texts))], "model": m, "k": 10}}),
        ("caption_id", 8, lambda: {"method": "POST", "url": "/api/search/text",
                                   "json": {"caption_id": int(rng.choice(caption_ids)), "model": m}}),
        ("image_id", 8, lambda: {"method": "POST", "url": "/api/search/image",
                                 "json": {"image_id": int(rng.choice(image_ids)), "model": m}}),
        ("upload", 5, lambda: {"method": "POST", "url": "/api/search/image", "files": {"file": ("a.jpg", small_jpeg)}}),
        ("upload_large", 1, lambda: {"method": "POST", "url": "/api/search/image", "files": {"file": ("b.jpg", big)}}),
        ("compare", 6, lambda: {"method": "POST", "url": "/api/compare",
                                "json": {"query": texts[rng.integers(len(texts))], "models": models[:2], "k": 5}}),
        ("models", 3, lambda: {"method": "GET", "url": "/api/models"}),
        ("examples", 2, lambda: {"method": "GET", "url": "/api/examples?n=5"}),
        ("thumbnail", 6, lambda: {"method": "GET", "url": f"/api/images/{int(rng.choice(image_ids))}/thumbnail"}),
        ("health", 2, lambda: {"method": "GET", "url": "/api/health"}),
        ("nested_json!", 3, lambda: {"method": "POST", "url": "/api/compare", "content": "[" * 4000 + "]" * 4000,
                                     "headers": {"content-type": "application/json"}}),
        ("huge_int!", 3, lambda: {"method": "POST", "url": "/api/search/image",
                                  "content": '{"image_id": ' + "7" * 5000 + "}",
                                  "headers": {"content-type": "application/json"}}),
        ("surrogate!", 3, lambda: {"method": "POST", "url": "/api/search/text", "content": '{"query": "\\ud800 x"}',
                                   "headers": {"content-type": "application/json"}}),
        ("bad_json!", 3, lambda: {"method": "POST", "url": "/api/search/text", "content": b"{\"query\": ",
                                  "headers": {"content-type": "application/json"}}),
        ("unknown_model!", 3, lambda: {"method": "POST", "url": "/api/search/text", "json": {"query": "x", "model": "nope"}}),
        ("k_out_of_range!", 2, lambda: {"method": "POST", "url": "/api/search/text", "json": {"query": "x", "k": 10**6}}),
        ("not_an_image!", 3, lambda: {"method": "POST", "url": "/api/search/image",
                                      "files": {"file": ("a.jpg", b"MZ" + bytes(500))}}),
        ("bomb!", 2, lambda: {"method": "POST", "url": "/api/search/image", "files": {"file": ("b.png", bomb)}}),
        ("oversized!", 1, lambda: {"method": "POST", "url": "/api/search/image",
                                   "files": {"file": ("c.jpg", b"\xff\xd8\xff" + bytes(11 * 2**20))}}),
        ("traversal!", 2, lambda: {"method": "GET", "url": "/api/images/..%2f..%2fetc%2fpasswd"}),
        ("unknown_image!", 2, lambda: {"method": "GET", "url": "/api/images/987654321"}),
        ("ui_file_input!", 2, lambda: {"method": "POST", "url": "/ui/gradio_api/call/upload_image",
                                       "json": {"data": [m, {"path": "/etc/passwd",
                                                             "meta": {"_type": "gradio.FileData"}}, 10]}}),
        ("ui_url_fetch!", 1, lambda: {"method": "GET", "url": "/ui/gradio_api/file=http://127.0.0.1:9/"}),
        ("ui_big_body!", 1, lambda: {"method": "POST", "url": "/ui/gradio_api/call/upload_image",
                                     "content": b'{"data": ["' + b"x" * 400_000 + b'"]}',
                                     "headers": {"content-type": "application/json"}}),
        ("foreign_host!", 2, lambda: {"method": "GET", "url": "/api/models", "headers": {"Host": "evil.example"}}),
    ]
    kinds = [k for k, _, _ in pool]
    weights = np.array([w for _, w, _ in pool], float)
    picks = rng.choice(len(pool), size=n, p=weights / weights.sum())
    return [(kinds[i], pool[i][2]()) for i in picks]


def soak(base: str, reqs: list[tuple[str, dict]], concurrency: int, max_seconds: float) -> dict:
    import httpx

    lat: dict[str, list[float]] = defaultdict(list)
    codes: dict[str, Counter] = defaultdict(Counter)
    t_end = time.time() + max_seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=base, timeout=120, limits=limits) as client:
        def one(item: tuple[str, dict]) -> None:
            kind, kw = item
            if time.time() > t_end:
                return
            t0 = time.perf_counter()
            try:
                r = client.request(**kw)
                status = r.status_code
                if kind == "ui_file_input!" and status == 200:  # the UI queues the call: its outcome is an event
                    stream = client.get(f"{kw['url']}/{r.json()['event_id']}").text
                    status = "event:error" if "event: error" in stream else "event:complete"
            except httpx.HTTPError as e:
                # An over-limit upload is answered 413 before its body is read and the connection is
                # closed; a client still sending then sees the close instead of the answer.
                closed = kind == "oversized!" and isinstance(e, (httpx.RemoteProtocolError, httpx.WriteError,
                                                                  httpx.ReadError))
                status = "closed:413-before-body" if closed else f"transport:{type(e).__name__}"
            lat[kind].append((time.perf_counter() - t0) * 1000)
            codes[kind][status] += 1

        with cf.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, reqs))
    return {"latency_ms": lat, "codes": codes}


def summarise(res: dict) -> dict:
    all_lat = [x for v in res["latency_ms"].values() for x in v]
    codes = res["codes"]
    n5xx = sum(n for c in codes.values() for s, n in c.items() if isinstance(s, int) and s >= 500)
    transport = sum(n for c in codes.values() for s, n in c.items() if str(s).startswith("transport:"))
    def refused(s: object) -> bool:
        return s in ("event:error", "closed:413-before-body") or (isinstance(s, int) and 400 <= s < 500)

    wrong = {k: dict(c) for k, c in codes.items()
             if (k.endswith("!") and not all(refused(s) for s in c)) or (not k.endswith("!") and any(s != 200 for s in c))}
    per_kind = {k: {"n": len(v), "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                    "codes": dict(codes[k])} for k, v in sorted(res["latency_ms"].items())}
    transport_kinds = {k: {str(s): n for s, n in c.items() if str(s).startswith("transport:")}
                       for k, c in codes.items()}
    return {"requests": len(all_lat), "5xx": n5xx, "transport_errors": transport,
            "transport_by_kind": {k: v for k, v in transport_kinds.items() if v}, "unexpected": wrong,
            "p50_ms": float(np.percentile(all_lat, 50)), "p99_ms": float(np.percentile(all_lat, 99)),
            "per_kind": per_kind}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=INDEX_DIR")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    from indexer.index import load_index_dir

    names = [m.split("=", 1)[0] for m in args.model]
    ix = load_index_dir(args.model[0].split("=", 1)[1])
    reqs = requests_mix(names, [int(i) for i in ix.images.ids], [int(i) for i in ix.captions.ids],
                        ix.captions.meta["texts"], args.requests, args.seed)
    log = Path("/tmp") / f"ltd_api_soak_{time.time_ns()}.log"
    model_args = [a for m in args.model for a in ("--model", m)]
    with _server.serving(model_args, log, timeout=600) as (proc, base):
        warm = requests_mix(names, [int(i) for i in ix.images.ids], [int(i) for i in ix.captions.ids],
                            ix.captions.meta["texts"], 200, args.seed + 1)
        soak(base, warm, args.concurrency, args.max_seconds)  # first use of every code path and cache
        rss0 = _server.rss_mb(proc.pid)
        t0 = time.time()
        res = soak(base, reqs, args.concurrency, args.max_seconds)
        wall = time.time() - t0
        time.sleep(1)
        rss1 = _server.rss_mb(proc.pid)
        healthy = _server.status(base + "/api/health") == 200
    s = summarise(res)
    s.update(wall_s=wall, rss_before_mb=rss0, rss_after_mb=rss1, healthy_after=healthy)
    print(json.dumps({k: v for k, v in s.items() if k != "per_kind"}, indent=1))
    if args.write:
        write(s, args)
    ok = s["5xx"] == 0 and s["transport_errors"] == 0 and not s["unexpected"] and healthy
    return 0 if ok else 1


def write(s: dict, args: argparse.Namespace) -> None:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    rows = [f"| {k} | {v['n']} | {v['p50']:.1f} | {v['p99']:.1f} | {', '.join(f'{c}×{n}' for c, n in v['codes'].items())} |"
            for k, v in s["per_kind"].items()]
    text = "\n".join([
        SECTION, "",
        f"`python bench/api_soak.py {' '.join('--model ' + m.split('=')[0] + '=…' for m in args.model)} "
        f"--requests {args.requests} --concurrency {args.concurrency}` — {cpu}, {dt.date.today()}, loopback, "
        "UI mounted; kinds ending in `!` are hostile and must answer 4xx.", "",
        f"**{s['requests']} requests in {s['wall_s']:.0f} s: {s['5xx']} answers 5xx (target 0), "
        f"{s['transport_errors']} transport errors, {len(s['unexpected'])} kinds with an unexpected status; "
        f"p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms; resident memory {s['rss_before_mb']:.0f} MB before, "
        f"{s['rss_after_mb']:.0f} MB after; healthy afterwards: {s['healthy_after']}.**", "",
        "| kind | n | p50 ms | p99 ms | statuses |", "|---|---:|---:|---:|---|", *rows])
    replace_section(SECTION, text)


if __name__ == "__main__":
    sys.exit(main())
