"""Indexes built to a target at 210,000 and 1,000,000 vectors: what `--factory auto` chooses for recall@10 ≥
0.99 within 1 GB, against the fixed size rule (`--factory fixed`), and `ltd serve` serving it memory-mapped.

    python bench/ann_index.py [--n 1000000] [--recall 0.99] [--max-memory 1GB] [--requests 1000] [--write]

Data: ``n`` × 256 float32 vectors from 10,000 Gaussian clusters (centre + 0.7 × noise, normalised; as
bench/eval_speed.py), cached in ``--cache`` (default /work/runs/ann, outside the repository) so runs at
the same size reuse them; 1,000 *fresh* queries from the same mixture (not in the corpus). Both indexes
are built by ``indexer.ann.build_vector_index``; each is then searched with the fresh queries in one
batch (k = 10, best of 3, on every core FAISS uses) and scored against exact search over the corpus:
that measured recall stands beside the recall the tuner predicted from its own held-out corpus queries.
With ``--requests`` > 0 an index directory holding the tuned index as its image side is served by a real
`ltd serve` (a tiny model trained here, embed_dim 256, encodes the text queries) and that many
sequential text searches are timed at the client; the server's resident memory is read from /proc.
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
from bench._common import publish, read_section, replace_marked  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = "## Indexes built to a target (bench/ann_index.py)"
INTRO = """\
Clustered 256-d vectors (10,000 Gaussian clusters, centre + 0.7 × noise, normalised; the top-1 and top-10
neighbours differ by about 0.03 in cosine, a hard case), k = 10, recall@10 against exact search. `auto`
is `ltd index --recall 0.99 --max-memory 1GB` (indexer/tune.py): the fastest setting whose recall on 1,000
queries held out from the corpus clears 0.99 at the lower end of its 95 % interval, within 1 GB of
resident memory per index (codes, lists, quantizers, graph; the exact vectors that re-ranking reads are
the memory-mapped `.npy`, page cache, counted as bytes read per query). `fixed` is the size rule
`auto` was before (Flat up to 200,000 vectors, else `IVF{2√n},PQ{d/8}`, nprobe nlist/32, re-rank ×10).
"Measured" recall: 1,000 fresh queries from the mixture, not in the corpus, with a 95 % interval.
Queries/s: one batch of the 1,000 fresh queries, best of 3, on 2 cores."""


def clustered(n: int, d: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    x = np.empty((n, d), dtype=np.float32)
    for a in range(0, n, 100_000):
        b = min(a + 100_000, n)
        x[a:b] = centres[rng.integers(0, len(centres), b - a)] + 0.7 * rng.standard_normal((b - a, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def data(n: int, d: int, cache: Path) -> tuple[np.ndarray, np.ndarray]:
    """(corpus, fresh queries), generated once per size and kept in ``cache`` (atomic .npy files)."""
    from training.fsio import save_npy_atomic

    base, qpath = cache / f"clustered_{n}x{d}_seed0.npy", cache / f"clustered_{n}x{d}_seed0_fresh1000.npy"
    if base.is_file() and qpath.is_file():
        return np.load(base, mmap_mode="r"), np.load(qpath)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((10_000, d), dtype=np.float32)
    xb = clustered(n, d, rng, centres)
    xq = clustered(1000, d, np.random.default_rng(12345), centres)
    cache.mkdir(parents=True, exist_ok=True)
    save_npy_atomic(base, xb)
    save_npy_atomic(qpath, xq)
    return np.load(base, mmap_mode="r"), xq


def measure(vi, xq: np.ndarray, truth: np.ndarray) -> dict:
    from indexer.tune_candidates import per_query_recall, resident_bytes, summarise

    t = []
    for _ in range(3):
        t0 = time.perf_counter()
        _, ids = vi.search(xq, 10)
        t.append(time.perf_counter() - t0)
    r, ci = summarise(per_query_recall(ids, truth))
    return {"factory": vi.factory, "nprobe": vi.nprobe, "efSearch": vi.ef_search, "rerank": vi.rerank,
            "recall": r, "ci": ci, "qps": len(xq) / min(t), "resident_bytes": resident_bytes(vi.index),
            "read_per_query": 10 * vi.rerank * 4 * xq.shape[1], "load1": load1()}


def build(xb: np.ndarray, factory: str) -> tuple[object, float]:
    from indexer.ann import build_vector_index

    t = time.perf_counter()
    vi = build_vector_index(np.ascontiguousarray(xb), factory)
    return vi, time.perf_counter() - t


def run(args) -> dict:
    import faiss

    from indexer.tune import auto_factory
    from indexer.tune_candidates import exact_topk

    xb, xq = data(args.n, 256, Path(args.cache))
    res = {"machine": machine_line(), "date": today(), "n": args.n, "d": 256, "threads": faiss.omp_get_max_threads(),
           "command": "python bench/ann_index.py " + " ".join(args.argv), "load1_start": load1()}
    t = time.perf_counter()
    truth = exact_topk(xb, xq, 10)
    res["exact_qps"] = len(xq) / (time.perf_counter() - t)
    factory = auto_factory(args.recall, args.max_memory)
    res["target"] = {"recall": args.recall, "max_memory": args.max_memory}
    vi, res["auto_build_s"] = build(xb, factory)
    res["auto"], res["tuning"] = measure(vi, xq, truth), vi.tuning
    print(json.dumps(res, default=str), flush=True)
    fixed, res["fixed_build_s"] = build(xb, "fixed")
    res["fixed"] = measure(fixed, xq, truth)
    del fixed
    if args.requests:
        res["serve"] = serve(vi, np.asarray(xb), args)
    res["load1_end"] = load1()
    return res


def serve(vi, xb: np.ndarray, args) -> dict:
    from bench._ann_serve import serve_latency, verify_times, write_index_dir
    from bench._models import tiny_checkpoint

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        ckpt = tiny_checkpoint(tmp, image_size=64)
        out = {"save_s": write_index_dir(tmp / "ix", xb, vi, ckpt)}
        out["load_s"] = verify_times(tmp / "ix")
        out.update(serve_latency(tmp / "ix", args.requests, tmp / "serve.log"))
    return out


def _setting(m: dict) -> str:
    p = [f"nprobe {m['nprobe']}" if m.get("nprobe") else "", f"efSearch {m['efSearch']}" if m.get("efSearch") else "",
         f"re-rank ×{m['rerank']}" if m.get("rerank") else ""]
    return f"`{m['factory']}`" + (f" ({', '.join(x for x in p if x)})" if any(p) else "")


def render(res: dict) -> str:
    a, f, tu = res["auto"], res["fixed"], res["tuning"]
    ch = tu["chosen"]
    mb = 1e6
    lines = [f"### {res['n']:,} vectors", "",
             f"Machine: {res['machine']}; FAISS on {res['threads']} threads. Date: {res['date']}. Command: "
             f"`{res['command']}` (under `nice -n 10`; 1-minute load {res['load1_start']:.1f} at the start, "
             f"{res['load1_end']:.1f} at the end: the 2 cores were shared with other jobs throughout). Exact search: "
             f"{res['exact_qps']:.0f} queries/s (numpy, one batch).", "",
             "| | `auto` (recall ≥ 0.99, 1 GB) | `fixed` |", "|---|---|---|",
             f"| index chosen | {_setting(a)} | {_setting(f)} |",
             f"| build (tuning included) | {res['auto_build_s']:.0f} s | {res['fixed_build_s']:.0f} s |",
             f"| resident memory | {a['resident_bytes'] / mb:.0f} MB | {f['resident_bytes'] / mb:.0f} MB |",
             f"| exact-vector bytes read per query (re-ranking, page cache) | {a['read_per_query'] / 1e3:.0f} kB | "
             f"{f['read_per_query'] / 1e3:.0f} kB |",
             f"| recall@10 predicted by the tuner (held-out corpus queries) | {ch['recall']:.4f} "
             f"({ch['recall_ci95'][0]:.4f}–{ch['recall_ci95'][1]:.4f}) | — |",
             f"| recall@10 measured (fresh queries) | **{a['recall']:.4f}** ({a['ci'][0]:.4f}–{a['ci'][1]:.4f}) | "
             f"{f['recall']:.4f} ({f['ci'][0]:.4f}–{f['ci'][1]:.4f}) |",
             f"| predicted − measured | {ch['recall'] - a['recall']:+.4f} | |",
             f"| queries/s (one batch of 1,000) | **{a['qps']:.0f}** | {f['qps']:.0f} |", ""]
    sec = tu["seconds"]
    lines += ["Where the tuner's time went (s): " + ", ".join(f"{k} {v:.0f}" for k, v in sec.items()) + ".", "",
              "The settings the tuner timed (held-out corpus queries; per nprobe, the cheapest re-rank factor that met "
              "the target; every efSearch up to the first that met it):", "",
              "| setting | recall@10 (95 % interval) | resident MB | ms/query |", "|---|---|---:|---:|"]
    for m in tu["measured"]:
        lines.append(f"| {_setting(m)} | {m['recall']:.4f} ({m['recall_ci95'][0]:.4f}–{m['recall_ci95'][1]:.4f}) | "
                     f"{m['resident_bytes'] / mb:.0f} | {m['query_ms']:.3f} |")
    s = res.get("serve")
    if s:
        lines += ["", f"`ltd serve --verify-index counts` with the `auto` index as its image side: ready in "
                  f"{s['startup_s']:.0f} s; {s['requests']:,} sequential text searches p50 / p99 {s['p50_ms']:.1f} / "
                  f"{s['p99_ms']:.1f} ms; resident memory before / after {s['rss_before']['VmRSS']:.0f} / "
                  f"{s['rss_after']['VmRSS']:.0f} MB (file-backed after: {s['rss_after'].get('RssFile', 0):.0f} MB); "
                  f"loading the directory: sizes + counts {s['load_s']['counts']:.1f} s, + sha256 "
                  f"{s['load_s']['hash']:.1f} s."]
    return "\n".join(lines) + "\n"


def section(res: dict) -> str:
    """The whole section: the intro and every size's block, this run's replaced."""
    cur = read_section(SECTION) or ""
    if "<!-- ann_index:" not in cur:
        cur = f"{SECTION}\n\n{INTRO}\n"
    return replace_marked(cur, f"ann_index:{res['n']}", render(res))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--recall", type=float, default=0.99)
    p.add_argument("--max-memory", default="1GB")
    p.add_argument("--requests", type=int, default=1000, help="text searches through `ltd serve` (0: skip serving)")
    p.add_argument("--cache", default="/work/runs/ann", help="folder for the generated vectors (reused across runs)")
    p.add_argument("--tmp", default=None, help="folder for the served index directory (default: the system temp)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    res = run(args)
    print(json.dumps(res, indent=2, default=str))
    publish(SECTION, section(res), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
