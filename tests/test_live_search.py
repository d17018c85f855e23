"""search.live_views.LiveSearch against a brute-force reference: with a filter, removed rows and added
rows, every path (exact scan of the allowed rows, FAISS candidates widened, the fall-back to every
allowed row when an IVF index's probed lists hold too few) returns the true top k of the allowed live
rows, never fewer than k when k exist.
"""
from __future__ import annotations

import numpy as np
import pytest

from indexer.vector_index import VectorIndex
from search import live_views
from search.live_views import LiveSearch


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(20, 16))
    base = _unit(centres[rng.integers(0, 20, 4000)] + 0.3 * rng.normal(size=(4000, 16)))
    added = _unit(rng.normal(size=(50, 16)))
    queries = _unit(rng.normal(size=(8, 16)))
    return base, added, queries, rng


def _reference(base, added, dead, allowed, q, k):
    vecs = np.concatenate([base, added])
    ok = ~dead if allowed is None else allowed & ~dead
    rows = np.flatnonzero(ok)
    s = vecs[rows] @ q
    order = np.lexsort((rows, -s))[:k]
    return rows[order]


@pytest.mark.parametrize("factory", ["Flat", "IVF32,Flat"])
@pytest.mark.parametrize("share", [0.002, 0.05, 0.6])
def test_filtered_live_search_is_the_exact_top_k_of_the_allowed_rows(corpus, factory, share, monkeypatch):
    base, added, queries, rng = corpus
    monkeypatch.setattr(live_views, "EXACT_CANDIDATES", 20)  # force the FAISS paths on a small corpus
    monkeypatch.setattr(live_views, "EXACT_SHARE", 0.0)
    index = VectorIndex.build(base, factory, seed=0, nprobe=1)
    n = len(base) + len(added)
    dead = rng.random(n) < 0.05
    allowed = rng.random(n) < share
    live = LiveSearch(index, base, added, dead)
    k = 25
    scores, rows = live.search(queries, k, allowed=allowed)
    for i, q in enumerate(queries):
        want = _reference(base, added, dead, allowed, q, k)
        got = rows[i][rows[i] >= 0]
        assert len(got) == len(want) == min(k, int((allowed & ~dead).sum()))
        assert not dead[got].any() and allowed[got].all()
        vecs = np.concatenate([base, added])
        np.testing.assert_allclose(scores[i][: len(got)], vecs[got] @ q, rtol=1e-5, atol=1e-6)  # exact scores
        assert (np.diff(scores[i][: len(got)]) <= 1e-7).all()
        if factory == "Flat" or share < 0.1:
            # exact: a Flat index, or few enough allowed rows that the probed lists fall short and every
            # allowed row is scored (an IVF index at nprobe 1 included)
            assert set(got) == set(want)
        else:
            # many allowed rows: FAISS's candidates (approximate, as an unfiltered search is), re-ranked
            assert len(set(got) & set(want)) / k >= 0.5


@pytest.mark.parametrize("share", [0.002, 0.05, 0.15])
def test_a_small_share_of_many_rows_is_scored_exactly(corpus, share, monkeypatch):
    """Past EXACT_CANDIDATES but under EXACT_SHARE of the rows, an IVF index answers the exact top k (the
    widened FAISS path would miss allowed neighbours that lie deep in its unfiltered ranking)."""
    base, added, queries, rng = corpus
    monkeypatch.setattr(live_views, "EXACT_CANDIDATES", 5)
    index = VectorIndex.build(base, "IVF32,Flat", seed=0, nprobe=1)
    n = len(base) + len(added)
    dead = np.zeros(n, bool)
    allowed = rng.random(n) < share
    calls = []
    monkeypatch.setattr(index, "search", lambda *a, **kw: calls.append(a) or VectorIndex.search(index, *a, **kw))
    scores, rows = LiveSearch(index, base, added, dead).search(queries, 10, allowed=allowed)
    assert not calls  # FAISS was not asked
    for i, q in enumerate(queries):
        want = _reference(base, added, dead, allowed, q, 10)
        np.testing.assert_array_equal(rows[i][: len(want)], want)


@pytest.mark.parametrize("vectors", ["c-contiguous", "memory-mapped", "strided", "float64"])
def test_exact_scores_read_rows_in_place_or_gathered(tmp_path, vectors, monkeypatch):
    """exact_scores equals numpy's gathered product for any array, in the rows' order, split in parts too."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5000, 24)).astype(np.float32)
    if vectors == "memory-mapped":
        np.save(tmp_path / "x.npy", x)
        x = np.load(tmp_path / "x.npy", mmap_mode="r")
    elif vectors == "strided":
        x = np.asarray(rng.normal(size=(5000, 48)).astype(np.float32))[:, ::2]
    elif vectors == "float64":
        x = x.astype(np.float64)
    monkeypatch.setattr(live_views, "PARALLEL_ROWS", 100)  # several parts on a machine with several threads
    monkeypatch.setattr(live_views, "IN_PLACE_ROWS", 1000)
    v = rng.normal(size=24).astype(np.float32)
    rows = rng.permutation(5000)[:1234]
    want = np.asarray(x, np.float32)[rows] @ v
    np.testing.assert_allclose(live_views.exact_scores(x, v, rows), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(live_views.exact_scores(x, v, rows[:999]), want[:999], rtol=1e-5, atol=1e-5)
    assert live_views.exact_scores(x, v, rows[:0]).shape == (0,)
