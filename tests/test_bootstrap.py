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
            "t2i_ndcg": rng.random((n_seeds, n_cap)),
            "t2i_image": np.tile(np.arange(n_cap) % n_img, (n_seeds, 1))}


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


def _reference_images(a, b, n_resamples, seed, chunk):
    """The image bootstrap as plain loops: draw images, take each one's image query and all its captions."""
    n_seeds, n_i = a["i2t_first_rank"].shape
    img = a["t2i_image"][0]

    def pts(rank):
        return 100.0 * sum(1.0 for k in (1, 5, 10) if rank <= k)

    def delta(key, q, f):
        return sum(f(b[key][s][q]) - f(a[key][s][q]) for s in range(n_seeds)) / n_seeds
    rng = np.random.default_rng(seed)
    rs, nd = [], []
    for start in range(0, n_resamples, chunk):
        c = min(chunk, n_resamples - start)
        ii = rng.integers(0, n_i, size=(c, n_i))
        for r in range(c):
            caps = [q for i in ii[r] for q in np.flatnonzero(img == i)]
            rs.append(sum(delta("i2t_first_rank", i, pts) for i in ii[r]) / n_i
                      + sum(delta("t2i_first_rank", q, pts) for q in caps) / len(caps))
            nd.append(sum(delta("t2i_ndcg", q, float) for q in caps) / len(caps))
    return np.percentile(rs, [2.5, 97.5]), np.percentile(nd, [2.5, 97.5])


def test_image_bootstrap_matches_slow_reference(monkeypatch):
    rng = np.random.default_rng(5)
    a, b = _fake(rng, 2, 12, 30), _fake(rng, 2, 12, 30, shift=3)
    perm = rng.permutation(30)  # captions in any order, 2 or 3 per image
    for m in (a, b):
        m["t2i_image"] = m["t2i_image"][:, perm]
    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", 12 * 7)  # several chunks, the last one partial
    got = paired_bootstrap(a, b, n_resamples=50, seed=4)
    ci_rs, ci_nd = _reference_images(a, b, 50, 4, chunk=7)
    assert got["resampling"] == "images"
    assert [got["rsum"]["lo"], got["rsum"]["hi"]] == pytest.approx(list(ci_rs))
    assert [got["t2i_ndcg"]["lo"], got["t2i_ndcg"]["hi"]] == pytest.approx(list(ci_nd))
    obs_rs, _, obs_nd, _ = _reference(a, b, 1, 0, chunk=1)
    assert got["rsum"]["delta"] == pytest.approx(obs_rs) and got["t2i_ndcg"]["delta"] == pytest.approx(obs_nd)


@pytest.mark.slow
def test_caption_level_resampling_is_too_narrow_when_an_images_captions_move_together():
    """The referee's case: a model change that helps or hurts *images* (all five captions of an image
    together, and its own image query). Resampling the 5,000 captions as independent draws pretends
    to five times the information there is: its interval is ~√5 too narrow. The image bootstrap's
    width matches the standard error of a mean over images."""
    rng = np.random.default_rng(0)
    n_i, per = 400, 5
    img = np.repeat(np.arange(n_i), per)
    good = rng.random(n_i) < 0.5  # images the new model places (all their captions rise together)
    base_t = rng.integers(3, 12, size=n_i * per).astype(float)
    a = {"i2t_first_rank": rng.integers(3, 12, size=n_i).astype(float), "t2i_first_rank": base_t,
         "t2i_ndcg": rng.random(n_i * per) * 0.1, "t2i_image": img}
    b = {"i2t_first_rank": np.where(good, 1.0, 20.0), "t2i_first_rank": np.where(good[img], 1.0, 20.0),
         "t2i_ndcg": a["t2i_ndcg"] + np.where(good[img], 0.2, -0.2), "t2i_image": img}
    by_img = paired_bootstrap(a, b, n_resamples=4000, seed=1)
    by_q = paired_bootstrap(a, b, n_resamples=4000, seed=1, by="queries")
    assert by_img["rsum"]["delta"] == pytest.approx(by_q["rsum"]["delta"])
    w_img = by_img["rsum"]["hi"] - by_img["rsum"]["lo"]
    w_q = by_q["rsum"]["hi"] - by_q["rsum"]["lo"]
    # visibly wider: √(4 / 1.2) ≈ 1.8 here (the image query moves with its captions, so the two halves
    # of rsum add up in the image bootstrap and only in quadrature, with 5 captions' worth of
    # independent draws, in the caption-level one)
    assert w_img > 1.6 * w_q
    nd_img = by_img["t2i_ndcg"]["hi"] - by_img["t2i_ndcg"]["lo"]
    nd_q = by_q["t2i_ndcg"]["hi"] - by_q["t2i_ndcg"]["lo"]
    assert nd_img > 2.0 * nd_q  # captions only: √5
    # the image interval is the normal one for a mean over images of each image's (i2t + mean t2i) Δ
    d_i = recall_points(b["i2t_first_rank"]) - recall_points(a["i2t_first_rank"])
    d_t = (recall_points(b["t2i_first_rank"]) - recall_points(a["t2i_first_rank"])).reshape(n_i, per).mean(1)
    assert w_img == pytest.approx(2 * 1.96 * (d_i + d_t).std() / np.sqrt(n_i), rel=0.08)
    with pytest.raises(ValueError, match="t2i_image"):
        paired_bootstrap({k: v for k, v in a.items() if k != "t2i_image"}, b)


def test_matches_slow_reference(monkeypatch):
    rng = np.random.default_rng(3)
    a, b = _fake(rng, 3, 12, 30), _fake(rng, 3, 12, 30, shift=3)
    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", 30 * 7)  # several chunks, the last one partial
    got = paired_bootstrap(a, b, n_resamples=50, seed=11, by="queries")
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
    got = paired_bootstrap(a, b, n_resamples=4000, seed=0, by="queries")

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
    for by in ("images", "queries"):
        got = paired_bootstrap(a, a, n_resamples=100, by=by)
        assert got["rsum"] == {"delta": 0.0, "lo": 0.0, "hi": 0.0, "p_le_0": 1.0}
    with pytest.raises(ValueError, match="same shape"):
        paired_bootstrap(a, _fake(rng, 3, 10, 20), by="queries")
    other = {**a, "t2i_image": a["t2i_image"][:, ::-1]}
    with pytest.raises(ValueError, match="different images"):
        paired_bootstrap(a, other)


def test_per_query_results_reproduce_the_report(tiny_index_pair):
    from indexer.evaluate import EvalOptions, evaluate_index, load_per_query, write_report
    from indexer.index import load_index_dir

    ix = load_index_dir(tiny_index_pair["bl"])
    rep = evaluate_index(ix, EvalOptions(per_query=True))
    pq = rep["per_query"]
    i2t, t2i = recall_points(pq["i2t_first_rank"]).mean(), recall_points(pq["t2i_first_rank"]).mean()
    assert i2t + t2i == pytest.approx(rep["rsum"], abs=1e-3)
    assert pq["t2i_ndcg"].mean() == pytest.approx(rep["t2i_nDCG@25_rougeL"], abs=1e-4)
    write_report(ix, rep)
    assert "per_query" not in rep
    np.testing.assert_array_equal(load_per_query(ix.path)["t2i_first_rank"], pq["t2i_first_rank"])
    from indexer.evaluate import ground_truth
    c2i, mask = ground_truth(ix)
    np.testing.assert_array_equal(load_per_query(ix.path)["t2i_image"], c2i[mask])  # the image bootstrap's clusters


def test_an_evaluation_record_without_its_index_still_bootstraps(tiny_index_pair, tmp_path):
    """What docs/results/ keeps of a run (report.json and the per-query file, no index): the arrays of
    the generation its report describes, and none when that generation's file is not there."""
    import json
    import shutil

    from indexer.evaluate import EvalOptions, evaluate_index, load_per_query, write_report
    from indexer.index import load_index_dir

    ix = load_index_dir(tiny_index_pair["bl"])
    write_report(ix, evaluate_index(ix, EvalOptions(per_query=True)))
    record = tmp_path / "record"
    record.mkdir()
    for p in ix.path.glob("per_query.*.npz"):
        shutil.copy(p, record / p.name)
    shutil.copy(ix.path / "report.json", record / "report.json")
    want = load_per_query(ix.path)
    got = load_per_query(record)
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    rep = json.loads((record / "report.json").read_text())
    rep["meta"]["index_generation"] += 1  # a report of a generation whose arrays were not kept
    (record / "report.json").write_text(json.dumps(rep))
    assert load_per_query(record) is None
