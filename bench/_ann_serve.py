"""bench/ann_index.py's serving half: an index directory around a built index, `ltd serve` on it, and the
server's latency and resident memory."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np


def write_index_dir(out: Path, xb: np.ndarray, vi, ckpt: Path) -> float:
    from indexer.ann import build_vector_index
    from indexer.index import Modality, save_index_dir
    from training.fsio import sha256_file

    n = len(xb)
    caps = xb[:1000].copy()
    t = time.perf_counter()
    save_index_dir(out, {"name": "million", "checkpoint": str(ckpt), "checkpoint_sha256": sha256_file(ckpt),
                         "factory": vi.factory, "ground_truth": False, "metric": "inner_product", "dim": xb.shape[1],
                         "normalized": True, "dataset": {"name": "synthetic vectors"}},
                   Modality(vi, xb, {"ids": list(range(n)), "filenames": [f"v{i}" for i in range(n)],
                                     "paths": [""] * n, "captions": [[] for _ in range(n)]}),
                   Modality(build_vector_index(caps, "Flat"), caps, {"ids": list(range(1000)), "texts": ["x"] * 1000,
                                                                     "image": [-1] * 1000}))
    return time.perf_counter() - t


def rss(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) / 1024
    return out


def serve_latency(index_dir: Path, requests: int, log: Path) -> dict:
    import urllib.request

    from bench._server import serving

    words = "a dog runs on the grass while two children play with a red ball near the water".split()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    with serving(["--model", f"big={index_dir}", "--no-ui", "--verify-index", "counts"], log, timeout=600) as (proc, base):
        startup = time.perf_counter() - t0
        before = rss(proc.pid)
        lat = []
        for i in range(requests + 50):
            body = json.dumps({"query": " ".join(rng.choice(words, 8)), "k": 10}).encode()
            req = urllib.request.Request(base + "/api/search/text", data=body, headers={"Content-Type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
            if i >= 50:
                lat.append(time.perf_counter() - t)
        after = rss(proc.pid)
    lat = np.array(lat) * 1000
    return {"startup_s": startup, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "rss_before": before, "rss_after": after, "requests": requests}


def verify_times(index_dir: Path) -> dict:
    from indexer.index import load_index_dir

    out = {}
    for mode in ("counts", "hash"):
        t = time.perf_counter()
        load_index_dir(index_dir, verify=mode, mmap=True)
        out[mode] = time.perf_counter() - t
    return out


