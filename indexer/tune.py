"""Indexes built to a target: recall@k, resident memory and query time, measured on the corpus itself.

``ltd index --recall R --max-memory M [--max-query-ms T]`` (and ``--factory auto``: R = 0.99, no memory or
time limit) builds the fastest index whose recall@k against exact search is at least R, within M bytes
of resident memory and T ms per query:

1. ``queries`` rows (1,000; a tenth of a smaller corpus) are drawn from the corpus and held out; their
   exact top-k among the other rows is computed by brute force, in chunks (linear in the corpus).
2. Each candidate of ``indexer/tune_candidates.py`` whose estimated memory fits is built on the other
   rows (IVF quantizers trained once, on a sample) and swept: nprobe, efSearch, the re-rank factor.
3. A setting *meets* the target when the lower end of its recall's 95 % interval (over the held-out
   queries) is at least R, its resident memory at most M and its time per query (one batch of all
   held-out queries, on every core FAISS uses) at most T. The fastest such setting wins; the held-out
   rows are added to it, so it indexes the whole corpus with row numbers as ids.
4. Nothing meets it: :class:`NoIndexMeetsTarget`, one line naming the closest setting (the highest
   recall within the memory and time limits, else the smallest candidate).

**Memory** counts what the index keeps resident: codes and ids of the IVF lists, coarse centroids, PQ
codebooks and the OPQ rotation; an HNSW's vectors and graph; a Flat index's vectors. The exact vectors
that re-ranking reads are *not* counted: they are the index directory's ``.npy``, memory-mapped, and a
query reads ``k × rerank × 4d`` bytes of it through the page cache (recorded per setting as
``rerank_read_bytes_per_query``; the operating system keeps the hot rows and evicts the rest).

Below ``SMALL`` vectors an exact index is chosen without measuring anything when it fits: a scan of
10,000 vectors takes microseconds and no approximate index beats it by enough to matter.

The manifest records, per side, ``indexes.<side>.tuning``: the target, the corpus size it was tuned at,
the measured recall with its interval, the time per query and the settings measured. ``ltd eval``
re-measures it on the finished index (:func:`remeasure`); :func:`needs_retune` says when a corpus that
grew (or shrank) past a factor should be tuned again.
"""
from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import asdict, dataclass

import faiss
import numpy as np

from indexer.tune_candidates import (
    EF_SEARCH,
    RERANKS,
    Builder,
    Candidate,
    Holdout,
    Point,
    candidates,
    exact_topk,
    per_query_recall,
    reranked_ids,
    resident_bytes,
    summarise,
    time_search,
)
from indexer.vector_index import VectorIndex, hnsw_of
from training.errors import UserValueError

log = logging.getLogger(__name__)

SMALL = 10_000
RETUNE_FACTOR = 2.0
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class NoIndexMeetsTarget(UserValueError):
    """No candidate index reaches the recall target within the memory and time limits."""


@dataclass(frozen=True)
class Target:
    """What the index must reach: recall@k ≥ ``recall`` within ``max_memory`` bytes and ``max_query_ms``."""

    recall: float = 0.99
    max_memory: int | None = None
    max_query_ms: float | None = None
    k: int = 10
    queries: int = 1000

    def describe(self) -> str:
        s = f"recall@{self.k} ≥ {self.recall:g}"
        if self.max_memory is not None:
            s += f" within {mb(self.max_memory)}"
        if self.max_query_ms is not None:
            s += f" and {self.max_query_ms:g} ms/query"
        return s


def mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB" if b < 1e9 else f"{b / 1e9:,.2f} GB"


def parse_bytes(text: str | int) -> int:
    """``"1GB"`` → 10⁹, ``"512MiB"`` → 2²⁹, ``"800M"`` → 8·10⁸, a plain number → bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise UserValueError(f"--max-memory: cannot read {text!r} as a size (e.g. 1GB, 512MB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def auto_factory(recall: float | None = None, max_memory: str | int | None = None,
                 max_query_ms: float | None = None) -> str:
    """The ``factory`` string that asks for a tuned index (``auto`` or ``auto:recall=…,memory=…,ms=…``)."""
    if recall is not None and not 0 < recall <= 1:
        raise UserValueError(f"--recall must be in (0, 1], got {recall}")
    if max_query_ms is not None and max_query_ms <= 0:
        raise UserValueError(f"--max-query-ms must be positive, got {max_query_ms}")
    parts = [f"recall={recall:g}" if recall is not None else "",
             f"memory={parse_bytes(max_memory)}" if max_memory is not None else "",
             f"ms={max_query_ms:g}" if max_query_ms is not None else ""]
    parts = [p for p in parts if p]
    return "auto:" + ",".join(parts) if parts else "auto"


def parse_auto(factory: str) -> Target | None:
    """The target an ``auto[:…]`` factory string asks for; None for any other factory."""
    if factory != "auto" and not factory.startswith("auto:"):
        return None
    kw = {}
    for part in filter(None, factory.partition(":")[2].split(",")):
        key, _, val = part.partition("=")
        try:
            kw[{"recall": "recall", "memory": "max_memory", "ms": "max_query_ms", "k": "k"}[key]] = (
                int(val) if key in ("memory", "k") else float(val))
        except (KeyError, ValueError):
            raise UserValueError(f"factory {factory!r}: cannot read {part!r} (recall=, memory=, ms=, k=)") from None
    return Target(**kw)


# ---- sweeps ---------------------------------------------------------------------------------------
def _meets(p: Point, t: Target) -> bool:
    """Timed (only the cheapest setting per nprobe is), and within every limit of the target."""
    return (p.query_ms is not None and p.ci[0] >= t.recall
            and (t.max_memory is None or p.resident_bytes <= t.max_memory)
            and (t.max_query_ms is None or p.query_ms <= t.max_query_ms))


def _timed(p: Point, vi: VectorIndex, h: Holdout) -> Point:
    p.query_ms = time_search(vi, h.queries, h.k)
    return p


def sweep_ivf(index: faiss.Index, c: Candidate, h: Holdout, t: Target, best_ms: float) -> list[Point]:
    ivf = faiss.extract_index_ivf(index)
    nbytes = resident_bytes(index)
    reranks = RERANKS if c.codec != "Flat" else (0,)
    points: list[Point] = []
    timed: list[Point] = []
    last_ms = math.inf
    nprobe = 1
    while nprobe <= ivf.nlist:
        ivf.nprobe = nprobe
        t0 = time.perf_counter()
        _, cand = index.search(h.queries, h.k * max(max(reranks), 1))
        sweep_ms = 1000 * (time.perf_counter() - t0) / len(h.queries)
        row = [Point(c.factory, {"nprobe": nprobe, "rerank": r}, *summarise(per_query_recall(
            reranked_ids(cand, h.vectors, h.queries, h.k, r), h.truth)), nbytes, read_per_query=h.k * r * 4 * h.vectors.shape[1])
            for r in reranks]
        points += row
        ok = [p for p in row if p.ci[0] >= t.recall]
        if ok:
            p = _timed(ok[0], VectorIndex(index, c.factory, rerank=ok[0].params["rerank"], exact=h.vectors), h)
            timed.append(p)
            log.info("  %s: recall %.4f, %.3f ms/query", p.label(), p.recall, p.query_ms)
            if p.params["rerank"] == reranks[0] or p.query_ms > min(last_ms, 1.5 * best_ms):
                break  # more probes cannot be faster from here
            last_ms = p.query_ms
        if sweep_ms > 4 * min(best_ms, last_ms):
            break  # the scan alone is already far slower than the best setting
        nprobe *= 2
    _retime(index, c, timed, h)
    return points


def _retime(index: faiss.Index, c: Candidate, timed: list[Point], h: Holdout, rounds: int = 2) -> None:
    """Time the settings that met the target again, in interleaved rounds, keeping each one's best:
    on a shared machine one timing can be several times another of the same search."""
    ivf = faiss.extract_index_ivf(index)
    for _ in range(rounds if len(timed) > 1 else 0):
        for p in timed:
            ivf.nprobe = p.params["nprobe"]
            vi = VectorIndex(index, c.factory, rerank=p.params["rerank"], exact=h.vectors)
            p.query_ms = min(p.query_ms, time_search(vi, h.queries, h.k, repeats=1))


def sweep_hnsw(index: faiss.Index, c: Candidate, h: Holdout, t: Target, best_ms: float) -> list[Point]:
    nbytes = resident_bytes(index)
    hnsw = hnsw_of(index)
    points: list[Point] = []
    for ef in EF_SEARCH:
        if ef < h.k:
            continue
        hnsw.efSearch = ef
        _, ids = index.search(h.queries, h.k)
        p = _timed(Point(c.factory, {"efSearch": ef}, *summarise(per_query_recall(ids, h.truth)), nbytes), index, h)
        points.append(p)
        if p.ci[0] >= t.recall or p.query_ms > 2 * best_ms:
            log.info("  %s: recall %.4f, %.3f ms/query", p.label(), p.recall, p.query_ms)
            break  # a larger efSearch is only slower
    return points


def _measure(builder: Builder, c: Candidate, h: Holdout, t: Target, best_ms: float) -> tuple[faiss.Index, list[Point]]:
    index = builder.build(c)
    if c.kind == "flat":
        return index, [_timed(Point(c.factory, {}, 1.0, (1.0, 1.0), resident_bytes(index)), index, h)]
    return index, (sweep_hnsw if c.kind == "hnsw" else sweep_ivf)(index, c, h, t, best_ms)


# ---- the tuner ------------------------------------------------------------------------------------
def _holdout(vectors: np.ndarray, t: Target, seed: int) -> Holdout:
    n = len(vectors)
    nq = max(2, min(t.queries, n // 10))
    rng = np.random.default_rng(seed + 1)
    q_ids = np.sort(rng.choice(n, nq, replace=False))
    mask = np.ones(n, bool)
    mask[q_ids] = False
    truth = exact_topk(vectors, np.ascontiguousarray(vectors[q_ids]), t.k, exclude=q_ids)
    return Holdout(vectors, q_ids, np.flatnonzero(mask), truth, t.k)


def _refusal(points: list[Point], cands: list[Candidate], t: Target) -> NoIndexMeetsTarget:
    """The one-line refusal: the setting that came closest (the highest recall within the memory and time
    limits; where time is what nothing meets, the fastest within memory), else the smallest candidate."""
    in_mem = [p for p in points if t.max_memory is None or p.resident_bytes <= t.max_memory]
    in_time = [p for p in in_mem if t.max_query_ms is None or (p.query_ms is not None and p.query_ms <= t.max_query_ms)]
    timed = [p for p in in_mem if p.query_ms is not None]
    if in_time:
        p = max(in_time, key=lambda p: (p.ci[0], -(p.query_ms or math.inf)))
    elif timed:
        p = min(timed, key=lambda p: p.query_ms)
    else:
        small = min(cands, key=lambda c: c.est_bytes)
        return NoIndexMeetsTarget(f"no index meets {t.describe()}: the smallest candidate, {small.factory}, needs "
                                  f"about {mb(small.est_bytes)}; allow more memory or time")
    ms = f", {p.query_ms:.3g} ms/query" if p.query_ms is not None else ""
    return NoIndexMeetsTarget(
        f"no index meets {t.describe()}: the closest is {p.label()} at recall {p.recall:.4f} (95 % interval "
        f"{p.ci[0]:.4f}–{p.ci[1]:.4f}), {mb(p.resident_bytes)}{ms}; lower the recall or allow more memory or time")


def tune_index(vectors: np.ndarray, target: Target = Target(), *, seed: int = 0,
               small: int = SMALL) -> VectorIndex:
    """The fastest index over ``vectors`` that meets ``target`` (module doc); its ``tuning`` holds the record."""
    t_start = time.perf_counter()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    cands = candidates(n, d)
    fitting = [c for c in cands if target.max_memory is None or c.est_bytes <= target.max_memory]
    if n <= small and any(c.kind == "flat" for c in fitting) and target.max_query_ms is None:
        index = faiss.IndexFlatIP(d)
        index.add(vectors)
        vi = VectorIndex(index, "Flat")
        vi.tuning = {"target": asdict(target), "n": n, "chosen": {"factory": "Flat", "recall": 1.0,
                     "recall_ci95": [1.0, 1.0], "resident_bytes": n * d * 4, "query_ms": None},
                     "note": f"exact below {small:,} vectors: not measured", "seconds": time.perf_counter() - t_start}
        return vi
    if not fitting:
        raise _refusal([], cands, target)
    h = _holdout(vectors, target, seed)
    log.info("tuning an index for %s vectors × %d to %s on %d held-out queries", f"{n:,}", d, target.describe(),
             len(h.q_ids))
    builder = Builder(h, seed=seed)
    builder.seconds["exact top-k of the held-out queries"] = time.perf_counter() - t_start
    best, best_index, points, fastest = None, None, [], {}
    for c in fitting:
        plain = fastest.get(c.factory.partition(",")[2])  # OPQ's plain-PQ twin, measured before it
        if c.opq and best is not None and plain is not None and plain > 1.5 * best.query_ms:
            log.info("  %s: skipped (plain PQ took %.3f ms/query, the best %.3f)", c.factory, plain, best.query_ms)
            continue
        index, pts = _measure(builder, c, h, target, best.query_ms if best else math.inf)
        points += pts
        ok = [p for p in pts if _meets(p, target)]
        mine = min(ok, key=lambda p: p.query_ms) if ok else None
        if mine is not None:
            fastest[c.factory] = mine.query_ms
        if mine is not None and (best is None or mine.query_ms < best.query_ms):
            best, best_index = mine, index
        del index
    if best is None:
        raise _refusal(points, cands, target)
    return _finish(best_index, best, h, target, points, builder.seconds, time.perf_counter() - t_start)


def _finish(index: faiss.Index, best: Point, h: Holdout, target: Target, points: list[Point],
            seconds: dict, elapsed: float) -> VectorIndex:
    """The chosen index with the held-out rows added and its search parameters set."""
    index.add_with_ids(h.queries, h.q_ids.astype(np.int64))
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = best.params["nprobe"]
    if "efSearch" in best.params:
        hnsw_of(index).efSearch = best.params["efSearch"]
    rerank = int(best.params.get("rerank", 0))
    vi = VectorIndex(index, best.factory, rerank=rerank, exact=h.vectors if rerank else None)
    vi.tuning = {"target": asdict(target), "n": int(len(h.vectors)), "queries": int(len(h.q_ids)),
                 "threads": faiss.omp_get_max_threads(), "chosen": best.record(),
                 "measured": [p.record() for p in points if p.query_ms is not None],
                 "seconds": {**{k: round(v, 2) for k, v in seconds.items()}, "total": round(elapsed, 2)}}
    log.info("chose %s: recall@%d %.4f (%.4f–%.4f), %s resident, %.3f ms/query", best.label(), target.k, best.recall,
             *best.ci, mb(best.resident_bytes), best.query_ms)
    return vi


# ---- after the build ------------------------------------------------------------------------------
def needs_retune(manifest: dict, n_now: int, modality: str = "images", factor: float = RETUNE_FACTOR) -> bool:
    """Whether the ``modality`` side of an index directory should be tuned again now that it holds
    ``n_now`` vectors: it was tuned (``--factory auto``) at a size that ``n_now`` has outgrown (or
    shrunk below) by ``factor``. Re-tune with ``tune_index(vectors, Target(**tuning["target"]))``."""
    tuning = ((manifest.get("indexes") or {}).get(modality) or {}).get("tuning")
    if not tuning or not tuning.get("n"):
        return False
    ratio = n_now / tuning["n"]
    return ratio >= factor or ratio <= 1 / factor


def remeasure(index: VectorIndex, vectors: np.ndarray, *, k: int = 10, queries: int = 1000, seed: int = 7) -> dict:
    """Recall@k of a finished index on corpus rows as queries (each row's own match left out of both
    lists), with its 95 % interval and the time per query of the batch."""
    vectors = np.asarray(vectors)
    n = len(vectors)
    nq = max(2, min(queries, n // 10))
    q_ids = np.sort(np.random.default_rng(seed).choice(n, nq, replace=False))
    q = np.ascontiguousarray(vectors[q_ids], np.float32)
    truth_ex = exact_topk(vectors, q, k + 1)
    truth = np.array([[i for i in row if i != s][:k] for row, s in zip(truth_ex, q_ids)])
    t = time.perf_counter()
    _, got = index.search(q, k + 1)
    ms = 1000 * (time.perf_counter() - t) / nq
    got = np.array([[i for i in row if i != s][:k] for row, s in zip(got, q_ids)])
    r, ci = summarise(per_query_recall(got, truth))
    return {"recall": round(r, 4), "recall_ci95": [round(ci[0], 4), round(ci[1], 4)], "queries": int(nq),
            "query_ms": round(ms, 4), "k": k}
