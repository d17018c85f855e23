"""Paired bootstrap over test queries (indexer/bootstrap.py) against a slow reference, and its wiring
into `ltd eval` per-query results."""
from __future__ import annotations

import numpy as np
import pytest

from indexer import bootstrap
from indexer.bootstrap import paired_bootstrap, recall_points


def _fake(rng, n_seeds, n_img, n_cap, shift=0):
    return {"i2t_first_rank": rng.integers(1, 30, size=(n_seeds, n_img)).astype(float),
            "t2i_first_rank": np.maximum(1, rng.integers(1, 40, size=(n_seeds, n_cap)) - shift).astype(float),
            "t2i_ndcg": rng.random((n_seeds, n_cap))}


def _reference(a, b, n_resamples, seed, chunk):
    """The same resamples written as plain loops over queries and seeds."""
    n_seeds, n_i = a["i2t_first_rank"].shape
    n_t = a["t2i_first_rank"].shape[1]

    def pts(rank):
        return 100.0 * sum(1.0 for k in (1, 5, 10) if rank <= k)

    def delta(key, q, points):
        f = pts if points else float
        return sum(f(b[key][s][q]) - f(a[key][s][q]) for s in range(n_seeds)) / n_seeds
    rng = np.random.default_rng(seed)
    rs, nd = [], []
    for start in range(0, n_resamples, chunk):
        c = min(chunk, n_resamples - start)
        ii, it = rng.integers(0, n_i, size=(c, n_i)), rng.integers(0, n_t, size=(c, n_t))
        for r in range(c):
            i2t = sum(delta("i2t_first_rank", q, True) for q in ii[r]) / n_i
            t2i = sum(delta("t2i_first_rank", q, True) for q in it[r]) / n_t
            rs.append(i2t + t2i)
            nd.append(sum(delta("t2i_ndcg", q, False) for q in it[r]) / n_t)
    obs_rs = (sum(delta("i2t_first_rank", q, True) for q in range(n_i)) / n_i
              + sum(delta("t2i_first_rank", q, True) for q in range(n_t)) / n_t)
    obs_nd = sum(delta("t2i_ndcg", q, False) for q in range(n_t)) / n_t
    return obs_rs, np.percentile(rs, [2.5, 97.5]), obs_nd, np.percentile(nd, [2.5, 97.5])


def test_matches_slow_reference(monkeypatch):
    rng = np.random.default_rng(3)
    a, b = _fake(rng, 3, 12, 30), _fake(rng, 3, 12, 30, shift=3)
    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", 30 * 7)  # several chunks, the last one partial
    got = paired_bootstrap(a, b, n_resamples=50, seed=11)
    obs_rs, ci_rs, obs_nd, ci_nd = _reference(a, b, 50, 11, chunk=7)
    assert got["rsum"]["delta"] == pytest.approx(obs_rs)
    assert [got["rsum"]["lo"], got["rsum"]["hi"]] == pytest.approx(list(ci_rs))
    assert got["t2i_ndcg"]["delta"] == pytest.approx(obs_nd)
    assert [got["t2i_ndcg"]["lo"], got["t2i_ndcg"]["hi"]] == pytest.approx(list(ci_nd))
    assert got["n_seeds"] == 3 and got["n_images"] == 12 and got["n_captions"] == 30


def test_delta_is_the_rsum_difference_and_interval_has_normal_width():
    rng = np.random.default_rng(0)
    a = _fake(rng, 1, 400, 2000)
    b = _fake(rng, 1, 400, 2000, shift=2)
    got = paired_bootstrap(a, b, n_resamples=4000, seed=0)

    def rsum(m):
        return recall_points(m["i2t_first_rank"][0]).mean() + recall_points(m["t2i_first_rank"][0]).mean()
    assert got["rsum"]["delta"] == pytest.approx(rsum(b) - rsum(a))
    d_i = recall_points(b["i2t_first_rank"][0]) - recall_points(a["i2t_first_rank"][0])
    d_t = recall_points(b["t2i_first_rank"][0]) - recall_points(a["t2i_first_rank"][0])
    se = np.sqrt(d_i.var() / len(d_i) + d_t.var() / len(d_t))
    width = got["rsum"]["hi"] - got["rsum"]["lo"]
    assert width == pytest.approx(2 * 1.96 * se, rel=0.08)
    assert got["rsum"]["lo"] < got["rsum"]["delta"] < got["rsum"]["hi"]


def test_identical_models_give_a_zero_interval_and_mismatch_raises():
    rng = np.random.default_rng(1)
    a = _fake(rng, 2, 10, 20)
    got = paired_bootstrap(a, a, n_resamples=100)
    assert got["rsum"] == {"delta": 0.0, "lo": 0.0, "hi": 0.0, "p_le_0": 1.0}
    with pytest.raises(ValueError, match="same shape"):
        paired_bootstrap(a, _fake(rng, 3, 10, 20))


def test_per_query_results_reproduce_the_report(tiny_index_pair):
    from indexer.evaluate import evaluate_index, load_per_query, write_report
    from indexer.index import load_index_dir

    ix = load_index_dir(tiny_index_pair["bl"])
    rep = evaluate_index(ix, show_progress=False, per_query=True)
    pq = rep["per_query"]
    i2t, t2i = recall_points(pq["i2t_first_rank"]).mean(), recall_points(pq["t2i_first_rank"]).mean()
    assert i2t + t2i == pytest.approx(rep["rsum"], abs=1e-3)
    assert pq["t2i_ndcg"].mean() == pytest.approx(rep["t2i_nDCG@25_rougeL"], abs=1e-4)
    write_report(ix, rep)
    assert "per_query" not in rep
    np.testing.assert_array_equal(load_per_query(ix.path)["t2i_first_rank"], pq["t2i_first_rank"])
