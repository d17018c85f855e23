"""A million-vector index: build time, size, recall@10 against exact search, and search latency and
resident memory of `ltd serve` serving it memory-mapped.

    python bench/ann_index.py [--n 1000000] [--queries 1000] [--requests 1000] [--write]

Data: ``n`` × 256 float32 vectors from 10,000 Gaussian clusters (centre + 0.7 × noise, normalised;
the same distribution as bench/eval_speed.py), 1,000 queries from the same mixture. The index is
what ``--factory auto`` builds at this size (indexer/ann.py); recall@10 = |top-10 ∩ exact top-10| / 10
over a grid of nprobe × re-rank factors. Then an index directory holding the vectors as its image
side is served by a real `ltd serve` (a tiny model trained here, embed_dim 256, encodes the text
queries), and ``requests`` sequential text searches (k = 10) are timed at the client; the server's
resident memory (VmRSS, anonymous and file-backed) is read from /proc before and after.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402
from bench._models import tiny_checkpoint  # noqa: E402

SECTION = "## A million-vector index (bench/ann_index.py)"


def clustered(n: int, d: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    x = np.empty((n, d), dtype=np.float32)
    for a in range(0, n, 100_000):
        b = min(a + 100_000, n)
        x[a:b] = centres[rng.integers(0, len(centres), b - a)] + 0.7 * rng.standard_normal((b - a, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def recall(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / truth.shape[1] for a, b in zip(ids, truth)]))


def grid(vi, xq: np.ndarray, truth: np.ndarray, nprobes, reranks) -> list[dict]:
    rows = []
    ivf = vi.index
    for nprobe in nprobes:
        import faiss

        faiss.extract_index_ivf(ivf).nprobe = nprobe
        for rr in reranks:
            vi.rerank = rr
            t = time.perf_counter()
            _, ids = vi.search(xq, 10)
            dt = time.perf_counter() - t
            rows.append({"nprobe": nprobe, "rerank": rr, "recall@10": recall(ids, truth), "qps": len(xq) / dt,
                         "load1": load1()})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def write_index_dir(out: Path, xb: np.ndarray, vi, ckpt: Path) -> float:
    from indexer.ann import build_vector_index
    from indexer.index import Modality, save_index_dir
    from training.fsio import sha256_file

    n = len(xb)
    caps = xb[:1000].copy()
    t = time.perf_counter()
    save_index_dir(out, {"name": "million", "checkpoint": str(ckpt), "checkpoint_sha256": sha256_file(ckpt),
                         "factory": "auto", "ground_truth": False, "metric": "inner_product", "dim": xb.shape[1],
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


def run(args) -> dict:
    import faiss

    from indexer.ann import build_vector_index, choose_index

    d = 256
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((10_000, d), dtype=np.float32)
    xb, xq = clustered(args.n, d, rng, centres), clustered(args.queries, d, rng, centres)
    res = {"machine": machine_line(), "date": today(), "n": args.n, "d": d, "queries": args.queries,
           "command": "python bench/ann_index.py " + " ".join(args.argv), "load1_start": load1()}
    flat = faiss.IndexFlatIP(d)
    flat.add(xb)
    t = time.perf_counter()
    _, truth = flat.search(xq, 10)
    res["exact_qps"] = args.queries / (time.perf_counter() - t)
    del flat
    plan = choose_index(args.n, d)
    res["plan"] = plan.__dict__
    t = time.perf_counter()
    vi = build_vector_index(xb, "auto")
    res["build_s"], res["build_load1"] = time.perf_counter() - t, load1()
    res["faiss_bytes"] = faiss.serialize_index(vi.index).nbytes
    print(json.dumps({k: v for k, v in res.items()}, default=str), flush=True)
    res["grid"] = grid(vi, xq, truth, args.nprobe, args.rerank)
    vi.rerank = plan.rerank
    faiss.extract_index_ivf(vi.index).nprobe = plan.nprobe
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        ckpt = tiny_checkpoint(tmp, image_size=64)
        res["save_s"] = write_index_dir(tmp / "ix", xb, vi, ckpt)
        res["dir_bytes"] = {p.name.split(".")[0] + "." + p.suffix[1:]: p.stat().st_size for p in (tmp / "ix").iterdir()
                            if p.suffix in (".faiss", ".npy", ".json")}
        del xb, vi
        res["load_s"] = verify_times(tmp / "ix")
        res["serve"] = serve_latency(tmp / "ix", args.requests, tmp / "serve.log")
    res["load1_end"] = load1()
    return res


def render(res: dict) -> str:
    plan, s = res["plan"], res["serve"]
    chosen = next(g for g in res["grid"] if g["nprobe"] == plan["nprobe"] and g["rerank"] == plan["rerank"])
    mb = 2**20
    db = res["dir_bytes"]
    lines = [SECTION, "", f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}` "
             f"(1-minute load: {res['load1_start']:.1f} at the start, {res['build_load1']:.1f} after the build, "
             f"{res['load1_end']:.1f} at the end; 2 cores shared with other jobs throughout).", "",
             f"{res['n']:,} × {res['d']} float32 vectors from 10,000 Gaussian clusters (as bench/eval_speed.py), "
             f"{res['queries']:,} queries from the same mixture, k = 10, recall against exact search "
             f"(Flat: {res['exact_qps']:.0f} queries/s in one batch). `--factory auto` chose "
             f"`{plan['factory']}`, nprobe {plan['nprobe']}, re-rank ×{plan['rerank']} on the exact vectors, "
             f"trained on {plan['train_size']:,} sampled vectors.", "",
             "| what | value |", "|---|---:|",
             f"| build (train + add) | {res['build_s']:.0f} s |",
             f"| search index (`images.*.faiss`: IVF lists + PQ codes) | {res['faiss_bytes'] / mb:.0f} MB |",
             f"| exact vectors (`images.*.npy`, memory-mapped, read for re-ranking) | {db.get('images.npy', 0) / mb:.0f} MB |",
             f"| recall@10 vs exact at the chosen setting | **{chosen['recall@10']:.3f}** (target ≥ 0.95) |",
             f"| in-process search at the chosen setting (1,000 queries, one call) | {chosen['qps']:.0f} queries/s |",
             f"| load the index directory: sizes + counts / + sha256 of every file | {res['load_s']['counts']:.1f} s / "
             f"{res['load_s']['hash']:.1f} s |",
             f"| `ltd serve --verify-index counts`: start until healthy | {s['startup_s']:.0f} s |",
             f"| text search through `ltd serve` ({s['requests']:,} sequential requests after 50 warm-up): p50 / p99 | "
             f"{s['p50_ms']:.1f} / {s['p99_ms']:.1f} ms |",
             f"| server resident memory before / after the requests (VmRSS) | {s['rss_before']['VmRSS']:.0f} / "
             f"{s['rss_after']['VmRSS']:.0f} MB |",
             f"| of which file-backed (mapped index + vectors) after | {s['rss_after'].get('RssFile', 0):.0f} MB |", "",
             "| nprobe | re-rank × | recall@10 | queries/s | load |", "|---:|---:|---:|---:|---:|"]
    for g in res["grid"]:
        lines.append(f"| {g['nprobe']} | {g['rerank'] or '—'} | {g['recall@10']:.3f} | {g['qps']:.0f} | {g['load1']:.1f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--nprobe", type=int, action="append", default=None)
    p.add_argument("--rerank", type=int, action="append", default=None)
    p.add_argument("--flat-max", type=int, default=None, help="override indexer.ann.FLAT_MAX (smoke runs on small n)")
    p.add_argument("--tmp", default=None, help="folder for the index directory (default: the system temp)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.nprobe = args.nprobe or [16, 32, 64, 128]
    args.rerank = args.rerank or [0, 10, 20, 40]
    if args.flat_max is not None:
        import indexer.ann

        indexer.ann.FLAT_MAX = args.flat_max
    res = run(args)
    print(json.dumps(res, indent=2, default=str))
    text = render(res)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
