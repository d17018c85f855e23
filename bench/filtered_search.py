"""Filtered search on 1,000,000 vectors: recall@10 against brute force over the filtered subset, k results
whenever k match, and the latency per query, per selectivity, on an IVF-PQ index and on an exact one.

    python bench/filtered_search.py [--n 1000000] [--queries 200] [--write]

Data: the clustered 256-d vectors of bench/ann_index.py (10,000 Gaussian clusters, seeded; cached in
``--cache``, shared with that bench) and its fresh queries (not in the corpus). Every row has metadata
``{"tag": V}``; the values are dealt out by a seeded permutation so that each share is exact and
independent of the vectors: ``half`` 50 %, ``fifth`` 20 % (the smallest share on the FAISS path,
``EXACT_SHARE``), ``six`` 6 % (past ``EXACT_CANDIDATES``, under ``EXACT_SHARE``: exact), ``five`` 5 %,
``tenth`` 0.1 %, ``seven`` 7 rows (fewer than k) and ``rest`` the others; and ``{"u": X}`` with X uniform
in [0, 1) (seeded), for the sweep that shows why ``EXACT_SHARE`` is where it is: ``{"field": "u", "lt": s}``
at shares around it, with both thresholds set to 0 so that the widened FAISS path answers alone. The indexes:
``--factory fixed`` as ``ltd index`` builds it at this size (``IVF2048,PQ32``, nprobe 64, re-rank ×10 on the
memory-mapped exact vectors; cached in ``--cache`` beside the vectors) and ``Flat``. Each query goes as a
request does in ``ltd serve`` (search/queries.py ``filter_masks``): ``parse_filter({"field": "tag", "eq": V})``,
its mask over a ``MetadataTable`` of the rows, then ``LiveSearch.search(q, 10, allowed=mask)``; one query at
a time, its whole wall time (mask included) and the search alone timed. The truth is brute force over
the filtered rows (score descending, row ascending on ties).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = "## Filtered search on a million vectors (bench/filtered_search.py)"
K = 10
# (value, share of the rows; a whole number of rows when ≥ 1)
SWEEP = (0.06, 0.1, 0.15, 0.2, 0.25)  # shares of `{"field": "u", "lt": share}` on the forced FAISS path
TAGS = (("half", 0.5), ("fifth", 0.2), ("six", 0.06), ("five", 0.05), ("tenth", 0.001), ("seven", 7))


def tag_counts(n: int) -> dict[str, int]:
    """Rows per tag value; ``rest`` takes what the listed shares leave."""
    counts = {v: int(s) if s >= 1 else int(round(s * n)) for v, s in TAGS}
    counts["rest"] = n - sum(counts.values())
    return counts


def tags(n: int, seed: int = 1) -> np.ndarray:
    """Each row's tag: exact counts, dealt out by a seeded permutation (independent of the vectors)."""
    counts = tag_counts(n)
    return np.random.default_rng(seed).permutation(np.repeat(np.array(list(counts)), list(counts.values())))


def ivf_index(xb: np.ndarray, cache: Path):
    """``fixed`` at this size, built once and kept in ``cache`` (reloaded with the exact vectors memory-mapped)."""
    from indexer.ann import build_vector_index, choose_index
    from indexer.vector_index import VectorIndex

    plan = choose_index(len(xb), xb.shape[1])
    path = cache / f"clustered_{len(xb)}x{xb.shape[1]}_seed0_{plan.factory.replace(',', '_')}.faiss"
    built_s = None
    if not path.is_file():
        t = time.perf_counter()
        vi = build_vector_index(np.ascontiguousarray(xb), "fixed")
        built_s = time.perf_counter() - t
        vi.save(path)
        del vi
    spec = {"factory": plan.factory, "nprobe": plan.nprobe, "rerank": plan.rerank}
    return VectorIndex.load(path, spec, exact=xb), built_s


def truth_topk(xb: np.ndarray, rows: np.ndarray, xq: np.ndarray, k: int, chunk: int = 131_072) -> np.ndarray:
    """Exact top-k rows of each query among ``rows`` (score descending, row ascending), −1 past them."""
    best_s = np.full((len(xq), 0), -np.inf, np.float32)
    best_r = np.zeros((len(xq), 0), np.int64)
    for a in range(0, len(rows), chunk):
        part = rows[a:a + chunk]
        s = np.concatenate([best_s, xq @ np.asarray(xb[part], np.float32).T], axis=1)
        r = np.concatenate([best_r, np.broadcast_to(part, (len(xq), len(part)))], axis=1)
        if s.shape[1] > k:
            top = np.argpartition(-s, k - 1, axis=1)[:, :k]
            s, r = np.take_along_axis(s, top, 1), np.take_along_axis(r, top, 1)
        best_s, best_r = s, r
    out = np.full((len(xq), k), -1, np.int64)
    for i in range(len(xq)):
        order = np.lexsort((best_r[i], -best_s[i]))
        out[i, : len(order)] = best_r[i][order]
    return out


def measure(live, table, xb: np.ndarray, xq: np.ndarray, flt: dict, exact_index: bool, forced: bool = False) -> dict:
    from indexer.tune_candidates import per_query_recall, summarise
    from search import live_views
    from search.filters import parse_filter

    mask = parse_filter(flt).mask(table)
    rows = np.flatnonzero(mask)
    truth = truth_topk(xb, rows, xq, K)
    want = min(K, len(rows))
    got = np.full((len(xq), K), -1, np.int64)
    total, search = [], []
    live.search(xq[:1], K, allowed=mask)  # warm-up
    for i, q in enumerate(xq):
        t0 = time.perf_counter()
        m = parse_filter(flt).mask(table)
        t1 = time.perf_counter()
        _, r = live.search(q[None, :], K, allowed=m)
        t2 = time.perf_counter()
        total.append(t2 - t0)
        search.append(t2 - t1)
        got[i] = r[0]
    n_hits = (got >= 0).sum(1)
    valid = got >= 0
    recall, ci = summarise(per_query_recall(np.where(valid, got, -2), truth[:, :want]))
    ms = np.array(total) * 1e3
    exact = exact_index or len(rows) <= live_views.EXACT_CANDIDATES or len(rows) < live_views.EXACT_SHARE * len(xb)
    return {"filter": flt, "rows": int(len(rows)), "share": len(rows) / len(xb),
            "path": "faiss (forced)" if forced else "exact" if exact else "faiss",
            "recall": recall, "ci": ci, "short": int((n_hits < want).sum()), "over": int((n_hits > want).sum()),
            "outside": int((~mask[np.where(valid, got, 0)] & valid).sum()),
            "equal": int((got == truth).all(1).sum()),
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "search_p50_ms": float(np.percentile(np.array(search) * 1e3, 50)),
            "mask_p50_ms": float(np.percentile((np.array(total) - np.array(search)) * 1e3, 50))}


def run(args) -> dict:
    import faiss

    from bench.ann_index import data
    from indexer.vector_index import VectorIndex
    from search import live_views
    from search.filters import MetadataTable
    from search.live_views import LiveSearch

    res = {"machine": machine_line(), "date": today(), "n": args.n, "d": 256, "threads": faiss.omp_get_max_threads(),
           "command": "python bench/filtered_search.py " + " ".join(args.argv), "load1_start": load1(),
           "counts": tag_counts(args.n)}
    xb, xq = data(args.n, 256, Path(args.cache))
    xq = np.ascontiguousarray(xq[: args.queries])
    t = time.perf_counter()
    u = np.random.default_rng(2).random(args.n)
    table = MetadataTable.from_dicts([{"tag": str(v), "u": float(x)} for v, x in zip(tags(args.n), u)])
    res["table_s"] = time.perf_counter() - t
    no_added, no_dead = np.zeros((0, 256), np.float32), np.zeros(args.n, bool)
    ivf, res["ivf_build_s"] = ivf_index(xb, Path(args.cache))
    res["ivf"] = ivf.describe()
    live = LiveSearch(ivf, xb, no_added, no_dead)
    res["rows"], res["sweep"] = [], []
    for value, _ in TAGS:
        r = measure(live, table, xb, xq, {"field": "tag", "eq": value}, exact_index=False)
        print(json.dumps(r), flush=True)
        res["rows"].append({"index": "ivf", **r})
    # why EXACT_SHARE: the widened FAISS path alone (both thresholds off) at shares around it
    saved = live_views.EXACT_CANDIDATES, live_views.EXACT_SHARE
    live_views.EXACT_CANDIDATES, live_views.EXACT_SHARE = 0, 0.0
    try:
        for share in SWEEP:
            r = measure(live, table, xb, xq, {"field": "u", "lt": share}, exact_index=False, forced=True)
            print(json.dumps(r), flush=True)
            res["sweep"].append({"index": "ivf", **r})
    finally:
        live_views.EXACT_CANDIDATES, live_views.EXACT_SHARE = saved
    del live, ivf
    flat = VectorIndex.build(np.asarray(xb), "Flat")
    live = LiveSearch(flat, xb, no_added, no_dead)
    for value, _ in TAGS:
        r = measure(live, table, xb, xq, {"field": "tag", "eq": value}, exact_index=True)
        print(json.dumps(r), flush=True)
        res["rows"].append({"index": "flat", **r})
    res["load1_end"] = load1()
    return res


def _share(r: dict) -> str:
    return f"{r['rows']} rows" if r["rows"] < 1000 else f"{100 * r['share']:.3g} % ({r['rows']:,} rows)"


def render(res: dict) -> str:
    iv = res["ivf"]
    lines = [SECTION, "",
             f"Machine: {res['machine']}; FAISS on {res['threads']} threads, one query at a time. Date: {res['date']}. "
             f"Command: `OMP_WAIT_POLICY=PASSIVE nice -n 10 {res['command']}` (1-minute load {res['load1_start']:.1f} "
             f"at the start, {res['load1_end']:.1f} at the end: the 2 cores were shared with other jobs).", "",
             f"{res['n']:,} clustered 256-d vectors (bench/ann_index.py's), each with metadata `{{\"tag\": V}}`, the "
             "values dealt out by a seeded permutation (exact shares, independent of the vectors); "
             "each query goes as a request does: `parse_filter({\"field\": \"tag\", \"eq\": V})`, its mask over the "
             "`MetadataTable` of the rows, `LiveSearch.search(q, 10, allowed=mask)` (search/live_views.py). "
             f"Recall@10 (95 % interval) against brute force over the filtered rows, per query; latency per query, the "
             f"mask included, over {res['queries']} fresh queries (not in the corpus). IVF-PQ: `{iv['factory']}`, "
             f"nprobe {iv['nprobe']}, re-rank ×{iv['rerank']} (`ltd index --factory fixed` at this size), exact "
             "vectors memory-mapped; Flat: exact. *Path*: `exact` scores every allowed row (up to "
             "`EXACT_CANDIDATES` = 50,000 of them, under `EXACT_SHARE` = 20 % of the rows, or any Flat index), "
             "`faiss` filters the index's candidates, widened until k are allowed.", "",
             "| index | filter selects | path | recall@10 | answers short of k (of min(k, matches)) | identical to "
             "brute force | p50 ms | p99 ms | of p50: mask / search ms |",
             "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        name = f"`{iv['factory']}`" if r["index"] == "ivf" else "`Flat`"
        bad = r["short"] + r["over"] + r["outside"]
        lines.append(f"| {name} | {_share(r)} | {r['path']} | {r['recall']:.4f} ({r['ci'][0]:.4f}–{r['ci'][1]:.4f}) | "
                     f"{bad} | {r['equal']}/{res['queries']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['mask_p50_ms']:.1f} / {r['search_p50_ms']:.1f} |")
    lines += ["", "Why exact below `EXACT_SHARE`: the widened FAISS path alone (both thresholds set to 0) on the IVF-PQ "
              "index, filter `{\"field\": \"u\", \"lt\": s}` (u uniform in [0, 1)):", "",
              "| filter selects | recall@10 | answers short of k | p50 ms | p99 ms |", "|---|---|---:|---:|---:|"]
    for r in res["sweep"]:
        lines.append(f"| {_share(r)} | {r['recall']:.4f} ({r['ci'][0]:.4f}–{r['ci'][1]:.4f}) | "
                     f"{r['short'] + r['over'] + r['outside']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=200, help="fresh queries per filter (at most 1,000)")
    p.add_argument("--cache", default="/work/runs/ann", help="folder for the vectors and the IVF index (reused)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    res = run(args)
    res["queries"] = args.queries
    print(json.dumps(res, indent=2, default=str))
    publish(SECTION, render(res), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
