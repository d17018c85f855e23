"""Sharded search: one index vs 2 shards (by id, by inverted list) in one process, and on Ray Serve.

    python bench/sharded_search.py [--n 250000] [--ray] [--write]

The clustered benchmark vectors of bench/ann_index.py (d = 256), indexed with the size rule's IVF-PQ
(``--factory fixed``: re-ranked ×10 on the exact vectors), then split into 2 shards by id and by list
(indexer/shards_index.py). For each: recall@10 against exact search on 1,000 fresh queries, latency of
single queries one after another (p50 / p99), queries/s of a batch, shards visited per query. ``--ray``
adds 2 shards × 1 and × 2 replicas on a local, loopback-only Ray (search/sharded.py's engine from
indexer/shards_ray.py). Results go to BENCHMARKS.md ("Sharded search") with ``--write``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402
from bench.ann_index import data  # noqa: E402
from indexer.ann import choose_index  # noqa: E402
from indexer.index import Modality, load_index_dir, save_index_dir  # noqa: E402
from indexer.shards_index import shard_index_dir  # noqa: E402
from indexer.vector_index import VectorIndex  # noqa: E402
from search.sharded import load_sharded  # noqa: E402

SECTION = "## Sharded search (bench/sharded_search.py)"


def write_index(path: Path, xb: np.ndarray) -> None:
    plan = choose_index(len(xb), xb.shape[1])
    vi = VectorIndex.build(xb, plan.factory, train_size=plan.train_size, nprobe=plan.nprobe, rerank=plan.rerank)
    cap = xb[:1000]
    meta = {"ids": list(range(len(xb)))}
    save_index_dir(path, {"name": "bench", "checkpoint_sha256": "0" * 64, "factory": plan.factory},
                   Modality(vi, xb, meta), Modality(VectorIndex.build(cap), cap, {"ids": list(range(len(cap)))}))


def measure(index, xq: np.ndarray, truth: np.ndarray, singles: int = 300) -> dict:
    lat = []
    for q in xq[:singles]:
        t0 = time.perf_counter()
        index.search(q[None, :], 10)
        lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _, ids = index.search(xq, 10)
    qps = len(xq) / (time.perf_counter() - t0)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth)]))
    visits = getattr(index, "visits", None)
    return {"recall": recall, "p50": 1000 * float(np.percentile(lat, 50)), "p99": 1000 * float(np.percentile(lat, 99)),
            "qps": qps, "visits": None if visits is None else visits[0] / max(1, visits[1])}


def ray_rows(root: Path, xq: np.ndarray, truth: np.ndarray) -> dict:
    import ray

    from indexer.shards_ray import RayShardEngine

    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    out = {}
    try:
        for replicas in (1, 2):
            ix = load_sharded(root / "by_id2", engine=RayShardEngine(replicas, timeout=30, probe_s=0), verify="counts")
            out[f"2 shards × {replicas} replica{'s' if replicas > 1 else ''}, Ray Serve"] = measure(ix.images.index, xq,
                                                                                                   truth)
    finally:
        ray.shutdown()
    return out


def run(args) -> dict:
    xb, xq = data(args.n, 256, Path(args.cache))
    xb = np.ascontiguousarray(xb)
    truth = np.argsort(-(xq @ xb.T), axis=1)[:, :10]
    root = Path(tempfile.mkdtemp(prefix="ltd-sharded-bench-"))
    t0 = time.perf_counter()
    write_index(root / "one", xb)
    build_s = time.perf_counter() - t0
    rows = {"1 index, 1 process": measure(load_index_dir(root / "one", verify="counts", mmap=True).images.index, xq, truth)}
    for n in (2, 4):
        for by in ("id", "list"):
            shard_index_dir(root / "one", n, by, out=root / f"by_{by}{n}")
            ix = load_sharded(root / f"by_{by}{n}", verify="counts")
            rows[f"{n} shards by {by}, 1 process"] = measure(ix.images.index, xq, truth)
    if args.ray:
        rows.update(ray_rows(root, xq, truth))
    factory = load_index_dir(root / "one", verify="counts").manifest["indexes"]["images"]
    return {"n": args.n, "rows": rows, "build_s": build_s, "factory": factory, "load": load1()}


def render(res: dict) -> str:
    f = res["factory"]
    lines = [SECTION, "", f"Machine: {machine_line()}. Date: {today()}. Command: `python bench/sharded_search.py --n {res['n']} "
             f"{'--ray ' if any('Ray' in k for k in res['rows']) else ''}--write` (1-minute load {res['load']:.1f} "
             "at the end: compare rows as ratios, not as absolutes, the 2 cores being shared).", "",
             f"{res['n']:,} × 256 clustered vectors (bench/ann_index.py), `{f['factory']}`, nprobe {f['nprobe']}, "
             f"re-rank ×{f['rerank']}; 1,000 fresh queries, k = 10, recall against exact search; latency: 300 single "
             "queries one after another; queries/s: one batch of 1,000. Visits: shard searches per query (by list: "
             "the shards owning the probed lists).", "",
             "| setting | recall@10 | p50 ms | p99 ms | queries/s | shards visited per query |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, m in res["rows"].items():
        v = "—" if m["visits"] is None else f"{m['visits']:.2f}"
        lines.append(f"| {name} | {m['recall']:.3f} | {m['p50']:.2f} | {m['p99']:.2f} | {m['qps']:.0f} | {v} |")
    if res["n"] < 1_000_000:
        lines += ["", f"Run at {res['n']:,} vectors, not the 1,000,000 of \"A million-vector index\": on a machine at a load "
                  "of 7–8 a million-vector build (119 s on a quieter one) and its shards did not fit this session; "
                  "`--n 1000000` runs it."]
    lines += ["", "Two cores cannot show what shards or replicas buy in speed (each shard and replica competes for "
              "the same cores); what they show is the cost of the fan-out and the merge, and that recall is kept. "
              "The sharded rows' batch includes the front's merge (one array operation over the shards' answers)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=250_000)
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "ltd" / "bench"))
    p.add_argument("--ray", action="store_true")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    text = render(run(args))
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
