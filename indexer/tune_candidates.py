"""The candidate indexes the tuner (``indexer/tune.py``) measures, and how each is built and swept.

Candidates for ``n`` vectors of dimension ``d`` (each kept only if its resident memory fits):

- ``Flat``: exact; ``4·n·d`` bytes.
- ``HNSW32``: a graph over the float32 vectors, ``n·(4d + ~270)`` bytes; swept over efSearch. Left out
  above ``HNSW_MAX`` vectors: its build is ``O(n log n)`` and, on a few cores, the slowest of all.
- ``IVF{nlist},Flat``: ``n·(4d + 8)`` bytes; swept over nprobe.
- ``IVF{nlist},PQ{m}`` and, from d = 64 up, ``OPQ{m},IVF{nlist},PQ{m}`` (a learnt rotation before the
  codes) with ``m`` = d/8 bytes per code: ``n·(m + 8)`` bytes plus the quantizers; and ``IVF{nlist},SQ8`` (one byte per
  dimension): ``n·(d + 8)``; each swept over nprobe × re-rank factor, the top ``k × rerank`` candidates
  re-scored on the exact vectors. (Shorter PQ sub-vectors than 8 dimensions are left out: FAISS's
  k-means trains them 10–20× slower, and SQ8 is the more precise code at the next size up.)

Every IVF candidate shares one coarse quantizer, trained once by spherical k-means on a sample (the OPQ
candidate gets the same centroids, rotated: an orthogonal rotation keeps inner products, so the lists
are the same); ``nlist`` ≈ 2·√n, a power of two, at most ``NLIST_MAX`` (beyond that the lists grow
instead, so assigning the corpus to lists stays linear in ``n``). Vectors are added in batches of
``ADD_BATCH`` (FAISS spreads each batch over the cores) with their corpus row as id, so a candidate
measured without its held-out queries becomes the final index once they are added.

A sweep searches the held-out queries once per nprobe with ``k × max(RERANKS)`` candidates: the top
``k × r`` of that list are what a search for ``k × r`` returns, so the recall of every re-rank factor
comes from one search. Only the cheapest setting that meets the target at each nprobe is timed.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import faiss
import numpy as np

from indexer.vector_index import rerank_exact
from training.progress import progress

log = logging.getLogger(__name__)

HNSW_M = 32
HNSW_MAX = 300_000  # above, its O(n log n) build (the slowest step on a few cores) is left out
NLIST_MAX = 4096
ADD_BATCH = 65_536
RERANKS = (0, 2, 3, 5, 10, 20, 40)  # 0: the compressed index's own order, no re-ranking
EF_SEARCH = (16, 32, 64, 128, 256, 512, 1024)
PQ_MIN_TRAIN = 256 * 39  # FAISS's minimum for 256 centroids per sub-quantizer
OPQ_MIN_DIM = 64  # below, 4-8 sub-vectors leave a rotation little to balance, and it trains 3x longer than PQ
OPQ_ITERATIONS = 10


@dataclass(frozen=True)
class Candidate:
    """One index structure to build: its factory string, kind and estimated resident bytes."""

    factory: str
    kind: str  # "flat" | "hnsw" | "ivf"
    est_bytes: int
    codec: str = "Flat"  # what an IVF list stores: "Flat" (float32), "PQ" (m bytes) or "SQ8" (d bytes)
    m: int = 0  # PQ bytes per code
    opq: bool = False


@dataclass
class Point:
    """One operating point of a candidate: search parameters and what was measured with them."""

    factory: str
    params: dict
    recall: float
    ci: tuple[float, float]
    resident_bytes: int
    query_ms: float | None = None  # mean time per query in one batch of all held-out queries
    read_per_query: int = 0  # exact-vector bytes read per query for re-ranking (page cache of the .npy)

    def label(self) -> str:
        p = ", ".join(f"{k} {v}" for k, v in self.params.items() if v)
        return self.factory + (f" ({p})" if p else "")

    def record(self) -> dict:
        return {"factory": self.factory, **self.params, "recall": round(self.recall, 4),
                "recall_ci95": [round(self.ci[0], 4), round(self.ci[1], 4)], "resident_bytes": int(self.resident_bytes),
                "query_ms": None if self.query_ms is None else round(self.query_ms, 4),
                "rerank_read_bytes_per_query": int(self.read_per_query)}


@dataclass
class Holdout:
    """Queries drawn from the corpus, removed from it while candidates are measured, with their exact
    top-k among the remaining rows (``truth``: corpus row ids)."""

    vectors: np.ndarray
    q_ids: np.ndarray
    base_ids: np.ndarray
    truth: np.ndarray
    k: int
    queries: np.ndarray = field(init=False)

    def __post_init__(self):
        self.queries = np.ascontiguousarray(self.vectors[self.q_ids])


def nlist_for(n: int) -> int:
    return min(NLIST_MAX, 1 << max(4, round(math.log2(max(1.0, 2 * math.sqrt(n))))))


def train_size(n: int, nlist: int) -> int:
    return min(n, max(100_000, 64 * nlist))


def candidates(n: int, d: int) -> list[Candidate]:
    """Every candidate for ``n`` × ``d`` vectors (memory not yet checked), in the order they are measured:
    Flat first (cheap to build; its time bounds every sweep after it), OPQ last (the costliest to train,
    skipped when plain PQ at the same size was clearly slower than the best so far)."""
    nlist = nlist_for(n)
    lists = nlist * d * 4  # the coarse centroids
    m = d // 8
    out = [Candidate("Flat", "flat", n * d * 4)]
    ivf = n >= 4 * nlist
    if ivf:
        out.append(Candidate(f"IVF{nlist},SQ8", "ivf", n * (d + 8) + lists + 2 * d * 4, codec="SQ8"))
    pq = n * (m + 8) + lists + 256 * d * 4
    with_pq = ivf and m >= 1 and d % m == 0 and train_size(n, nlist) >= PQ_MIN_TRAIN
    if with_pq:
        out.append(Candidate(f"IVF{nlist},PQ{m}", "ivf", pq, codec="PQ", m=m))
    if ivf:
        out.append(Candidate(f"IVF{nlist},Flat", "ivf", n * (4 * d + 8) + lists))
    if n <= HNSW_MAX:
        out.append(Candidate(f"HNSW{HNSW_M}", "hnsw", n * (4 * d + 8 * HNSW_M + 24)))
    if with_pq and d >= OPQ_MIN_DIM:
        out.append(Candidate(f"OPQ{m},IVF{nlist},PQ{m}", "ivf", pq + d * d * 4, codec="PQ", m=m, opq=True))
    return out


# ---- measuring -------------------------------------------------------------------------------------
def exact_topk(vectors: np.ndarray, queries: np.ndarray, k: int, exclude: np.ndarray | None = None,
               chunk: int = 16_384) -> np.ndarray:
    """Row ids of each query's exact top-k by inner product, leaving out the rows ``exclude``; in
    chunks of rows, so nothing of size n × queries is ever held."""
    nq = len(queries)
    best_s = np.full((nq, k), -np.inf, np.float32)
    best_i = np.full((nq, k), -1, np.int64)
    skip = np.zeros(len(vectors), bool)
    if exclude is not None:
        skip[exclude] = True
    for a in range(0, len(vectors), chunk):
        s = queries @ np.asarray(vectors[a:a + chunk], np.float32).T
        s[:, skip[a:a + chunk]] = -np.inf
        kk = min(k, s.shape[1])
        top = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        cs = np.concatenate([best_s, np.take_along_axis(s, top, 1)], 1)
        ci = np.concatenate([best_i, top + a], 1)
        keep = np.argsort(-cs, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(cs, keep, 1), np.take_along_axis(ci, keep, 1)
    return best_i


def per_query_recall(ids: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """|ids ∩ truth| / k for each query row."""
    return (ids[:, :, None] == truth[:, None, :]).any(-1).sum(1) / truth.shape[1]


def summarise(r: np.ndarray) -> tuple[float, tuple[float, float]]:
    """Mean of per-query recalls and its 95 % normal interval (queries are independent draws)."""
    m = float(r.mean())
    half = 1.96 * float(r.std(ddof=1)) / math.sqrt(len(r)) if len(r) > 1 else 0.0
    return m, (max(0.0, m - half), min(1.0, m + half))


def time_search(index, queries: np.ndarray, k: int, repeats: int = 2) -> float:
    """Best of ``repeats`` wall times of one batched search, in ms per query."""
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        index.search(queries, k)
        best = min(best, time.perf_counter() - t)
    return 1000 * best / len(queries)


def reranked_ids(cand: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int, r: int) -> np.ndarray:
    """Top-k after re-scoring the first ``k × r`` candidates on the exact vectors (r = 0: as given)."""
    return cand[:, :k] if r == 0 else rerank_exact(cand[:, : k * r], vectors, queries, k)[1]


# ---- building --------------------------------------------------------------------------------------
def _add(index: faiss.Index, h: Holdout, ids: np.ndarray, desc: str) -> None:
    """Add the rows ``ids`` with their row numbers as ids, ``ADD_BATCH`` at a time."""
    with progress(total=len(ids), desc=desc, unit="vec") as bar:
        for a in range(0, len(ids), ADD_BATCH):
            part = ids[a:a + ADD_BATCH]
            index.add_with_ids(np.ascontiguousarray(h.vectors[part], np.float32), part.astype(np.int64))
            bar.update(len(part))


class Builder:
    """Builds the candidates of one corpus, training the shared coarse quantizer once."""

    def __init__(self, h: Holdout, *, seed: int = 0):
        self.h, self.seed = h, seed
        self.d = h.vectors.shape[1]
        self.nlist = nlist_for(len(h.vectors))
        rng = np.random.default_rng(seed)
        n_train = min(len(h.base_ids), train_size(len(h.vectors), self.nlist))
        self.sample = np.ascontiguousarray(h.vectors[np.sort(rng.choice(h.base_ids, n_train, replace=False))])
        self._centroids: np.ndarray | None = None
        self.seconds: dict[str, float] = {}

    def centroids(self) -> np.ndarray:
        if self._centroids is None:
            t = time.perf_counter()
            cl = faiss.Clustering(self.d, self.nlist)
            cl.spherical, cl.seed, cl.niter = True, self.seed, 20  # spherical: what FAISS's IVF does for inner product
            q = faiss.IndexFlatIP(self.d)
            cl.train(self.sample, q)
            self._centroids = faiss.vector_to_array(cl.centroids).reshape(self.nlist, self.d)
            self.seconds["coarse k-means"] = time.perf_counter() - t
        return self._centroids

    def build(self, c: Candidate) -> faiss.Index:
        """The candidate, trained and holding the corpus without the held-out queries."""
        if c.kind == "ivf":
            self.centroids()  # timed on its own, once
        t = time.perf_counter()
        index = self._flat(c) if c.kind == "flat" else self._hnsw() if c.kind == "hnsw" else self._ivf(c)
        self.seconds[f"{c.factory}: train"] = self.seconds.get(f"{c.factory}: train", 0.0)
        self.seconds[f"{c.factory}: add"] = time.perf_counter() - t - self.seconds[f"{c.factory}: train"]
        return index

    def _flat(self, c: Candidate) -> faiss.Index:
        index = faiss.IndexIDMap(faiss.IndexFlatIP(self.d))
        _add(index, self.h, self.h.base_ids, f"{c.factory}: add")
        return index

    def _hnsw(self) -> faiss.Index:
        index = faiss.IndexIDMap(faiss.IndexHNSWFlat(self.d, HNSW_M, faiss.METRIC_INNER_PRODUCT))
        _add(index, self.h, self.h.base_ids, f"HNSW{HNSW_M}: add")
        return index

    def _ivf(self, c: Candidate) -> faiss.Index:
        cent = self.centroids()
        t = time.perf_counter()
        opq = None
        sample = self.sample
        if c.opq:
            opq = faiss.OPQMatrix(self.d, c.m)
            opq.niter = OPQ_ITERATIONS
            opq.train(sample)
            cent, sample = opq.apply(cent), opq.apply(sample)
        q = faiss.IndexFlatIP(self.d)
        q.add(np.ascontiguousarray(cent, np.float32))
        if c.codec == "PQ":
            ivf = faiss.IndexIVFPQ(q, self.d, self.nlist, c.m, 8, faiss.METRIC_INNER_PRODUCT)
            ivf.do_polysemous_training = False  # only Hamming-filtered search uses it
        elif c.codec == "SQ8":
            ivf = faiss.IndexIVFScalarQuantizer(q, self.d, self.nlist, faiss.ScalarQuantizer.QT_8bit,
                                                faiss.METRIC_INNER_PRODUCT)
        else:
            ivf = faiss.IndexIVFFlat(q, self.d, self.nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.own_fields = False
        ivf.train(sample)  # the quantizer already holds nlist centroids: only the codes are trained here
        index = faiss.IndexPreTransform(opq, ivf) if opq is not None else ivf
        self.seconds[f"{c.factory}: train"] = time.perf_counter() - t
        _add(index, self.h, self.h.base_ids, f"{c.factory}: add")
        return index


def resident_bytes(index: faiss.Index) -> int:
    """What a built index holds in memory: codes and ids of the lists, quantizers and rotation, or the
    vectors and graph of an HNSW, or the vectors of a Flat index."""
    idx = faiss.downcast_index(index)
    extra = 0
    if isinstance(idx, faiss.IndexIDMap):
        extra, idx = 8 * idx.ntotal, faiss.downcast_index(idx.index)
    if isinstance(idx, faiss.IndexPreTransform):
        extra += idx.d * idx.d * 4  # the rotation matrix
        idx = faiss.downcast_index(idx.index)
    if isinstance(idx, faiss.IndexHNSW):
        g = idx.hnsw
        return extra + idx.ntotal * idx.d * 4 + 4 * g.neighbors.size() + 4 * g.levels.size() + 8 * g.offsets.size()
    ivf = faiss.try_extract_index_ivf(idx)
    if ivf is not None:
        ivf = faiss.downcast_index(ivf)
        pq = 256 * ivf.d * 4 if isinstance(ivf, faiss.IndexIVFPQ) else 2 * ivf.d * 4 if isinstance(
            ivf, faiss.IndexIVFScalarQuantizer) else 0
        return extra + ivf.ntotal * (ivf.code_size + 8) + ivf.quantizer.ntotal * ivf.d * 4 + pq
    return extra + idx.ntotal * idx.d * 4
