"""indexer.metrics against pytrec_eval, against its own per-query reference loop, and by hand.

What is compared with pytrec_eval (trec_eval 9), per query, on seeded random score matrices:

- ``hit@k``       <-> ``success_k``   (a positive within the top k)
- ``1/first_rank`` <-> ``recip_rank`` (reciprocal rank of the first positive)
- ``p@5``         <-> ``P_5``
- ``rprec``       <-> ``Rprec``
- ``ndcg@25`` with ``gain="linear"`` <-> ``ndcg_cut_25`` (trec_eval's gain is the qrels grade).
- ``ndcg@25`` with the default exponential gain 2^rel - 1 (TERN) <-> ``ndcg_cut_25`` on qrels whose
  grades are replaced by 2^rel - 1. For integer grades this is exact: the gain of the new grade is
  2^rel - 1, and the ideal ordering is unchanged because the map is increasing. Real-valued grades
  (e.g. ROUGE-L) are covered by the brute-force reference loop instead.

trec_eval sorts ties by descending document id (a string); document ids are chosen so that this
is ascending item index, our tie rule, and the tie-heavy cases (integer scores) must still agree.
"""

from __future__ import annotations

import numpy as np
import pytest

pytrec_eval = pytest.importorskip("pytrec_eval")

from bench._metrics_reference import reference_query_metrics, reference_retrieval_metrics  # noqa: E402
from indexer.metrics import ExtraPositives, MetricsSpec, query_metrics, ranks_of, retrieval_metrics, topk  # noqa: E402


def _doc(i: int) -> str:
    # Larger item index -> lexically smaller id, so trec_eval's tie order is ascending index.
    return f"{10**7 - i:08d}"


def _trec(scores: np.ndarray, qrels_rows: list[dict[int, int]], measures: set[str]) -> dict[int, dict]:
    qrels = {str(q): {_doc(i): int(g) for i, g in row.items()} for q, row in enumerate(qrels_rows) if row}
    run = {str(q): {_doc(i): float(s) for i, s in enumerate(scores[q])} for q in range(scores.shape[0])}
    res = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    return {int(q): v for q, v in res.items()}


def _random_case(rng: np.random.Generator, n_q: int, n: int, ties: bool):
    if ties:  # few distinct values: most rankings are decided by the tie rule
        scores = rng.integers(0, 4, size=(n_q, n)).astype(np.float32)
    else:
        scores = rng.standard_normal((n_q, n)).astype(np.float32)
    positives = [rng.choice(n, size=rng.integers(0, 8), replace=False) for _ in range(n_q)]
    return scores, positives


@pytest.mark.parametrize("ties", [False, True])
def test_binary_metrics_match_trec_eval(ties: bool) -> None:
    rng = np.random.default_rng(1 if ties else 0)
    scores, positives = _random_case(rng, 40, 120, ties)
    ours = query_metrics(scores, positives, spec=MetricsSpec(ks=(1, 5, 10), p_at=5))
    measures = {"success.1,5,10", "recip_rank", "P.5", "Rprec"}
    trec = _trec(scores, [{int(i): 1 for i in p} for p in positives], measures)
    assert set(trec) == {q for q, p in enumerate(positives) if len(p)}
    for q in range(len(positives)):
        if q not in trec:  # no positives: nan in every positive-based metric
            assert all(np.isnan(ours[k][q]) for k in ("first_rank", "hit@1", "rprec", "p@5"))
            continue
        for k in (1, 5, 10):
            assert ours[f"hit@{k}"][q] == trec[q][f"success_{k}"]
        assert 1.0 / ours["first_rank"][q] == pytest.approx(trec[q]["recip_rank"], abs=1e-12)
        assert ours["p@5"][q] == pytest.approx(trec[q]["P_5"], abs=1e-12)
        assert ours["rprec"][q] == pytest.approx(trec[q]["Rprec"], abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("gain", ["linear", "exponential"])
def test_ndcg_matches_trec_eval(ties: bool, gain: str) -> None:
    rng = np.random.default_rng(7 + ties)
    n_q, n = 30, 150
    scores, _ = _random_case(rng, n_q, n, ties)
    grades = rng.integers(0, 4, size=(n_q, n)) * (rng.random((n_q, n)) < 0.15)
    grades[0] = 0  # a query with no relevant item: nDCG is 0 (trec_eval skips it)
    ours = query_metrics(scores, [np.flatnonzero(g) for g in grades], relevance=grades,
                         spec=MetricsSpec(ndcg_k=25, gain=gain))
    trec_grades = grades if gain == "linear" else 2**grades - 1
    qrels = [{int(i): int(g[i]) for i in np.flatnonzero(g)} for g in trec_grades]
    trec = _trec(scores, qrels, {"ndcg_cut.25"})
    assert ours["ndcg@25"][0] == 0.0 and 0 not in trec
    for q, v in trec.items():
        assert ours["ndcg@25"][q] == pytest.approx(v["ndcg_cut_25"], abs=1e-9)


@pytest.mark.parametrize("ties", [False, True])
def test_query_metrics_match_reference_loop_real_valued_relevance(ties: bool) -> None:
    rng = np.random.default_rng(3)
    scores, positives = _random_case(rng, 50, 90, ties)
    rel = np.round(rng.random((50, 90)), 1).astype(np.float32)  # ROUGE-like, many equal grades
    fast = query_metrics(scores, positives, relevance=rel, spec=MetricsSpec(chunk=7))
    ref = reference_query_metrics(scores, positives, relevance=rel)
    assert fast.keys() == ref.keys()
    for key in fast:
        np.testing.assert_allclose(fast[key], ref[key], rtol=0, atol=1e-9, err_msg=key)


def test_duplicate_positives_count_once() -> None:
    scores = np.array([[0.9, 0.8, 0.1, 0.0]])
    m = query_metrics(scores, [np.array([2, 2, 1])], spec=MetricsSpec(ks=(1, 2)))
    assert m["first_rank"][0] == 2 and m["rprec"][0] == 0.5 and m["hit@2"][0] == 1


@pytest.mark.parametrize("n, k", [(200, 5), (200, 25), (30, 25), (10, 25), (5000, 25)])
@pytest.mark.parametrize("levels", [0, 2, 50])
def test_topk_matches_stable_argsort(n: int, k: int, levels: int) -> None:
    rng = np.random.default_rng(n + k + levels)
    scores = rng.integers(0, levels, size=(9, n)).astype(np.float64) if levels else rng.random((9, n))
    idx, vals = topk(scores, k, chunk=4)
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(idx, expected)
    np.testing.assert_array_equal(vals, np.take_along_axis(scores, expected, axis=1))


def test_ranks_of() -> None:
    row = np.array([0.5, 0.9, 0.5, 0.1, 0.9])
    np.testing.assert_array_equal(ranks_of(row, np.array([1, 4, 0, 2, 3])), [1, 2, 3, 4, 5])


def _retrieval_case(rng: np.random.Generator, n_img: int, per: int, ties: bool):
    n_cap = n_img * per
    c2i = rng.permutation(np.repeat(np.arange(n_img), per))
    if ties:
        sims = rng.integers(0, 3, size=(n_img, n_cap)).astype(np.float32)
    else:
        sims = rng.standard_normal((n_img, n_cap)).astype(np.float32)
        sims[c2i, np.arange(n_cap)] += 2.0  # ground-truth pairs mostly rank high
    return sims, c2i


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("extras", [False, True])
@pytest.mark.parametrize("with_rel", [False, True])
def test_retrieval_metrics_match_reference(ties: bool, extras: bool, with_rel: bool) -> None:
    rng = np.random.default_rng(11)
    sims, c2i = _retrieval_case(rng, 37, 5, ties)
    n_img, n_cap = sims.shape
    kw = {}
    if extras:  # CxC-like extra positives, sometimes repeating the ground-truth pair
        kw["i2t_positives"] = [rng.choice(n_cap, rng.integers(0, 4), replace=False) for _ in range(n_img)]
        kw["t2i_positives"] = [np.r_[c2i[j], rng.choice(n_img, rng.integers(0, 3))] for j in range(n_cap)]
    if with_rel:
        kw["relevance"] = rng.random((n_cap, n_img)).astype(np.float32)
    extra = ExtraPositives(kw.get("i2t_positives"), kw.get("t2i_positives"))
    fast = retrieval_metrics(sims, c2i, extra=extra, relevance=kw.get("relevance"))
    ref = reference_retrieval_metrics(sims, c2i, **kw)
    assert list(fast) == list(ref)
    for key in fast:
        assert fast[key] == pytest.approx(ref[key], abs=1e-9), key
    expected = {f"{d}_{m}" for d in ("i2t", "t2i") for m in ("R@1", "R@5", "R@10", "medr", "meanr", "R-P")}
    expected |= {"rsum", "n_images", "n_captions"}
    if with_rel:
        expected |= {"i2t_nDCG@25_rougeL", "t2i_nDCG@25_rougeL"}
    assert set(fast) == expected


def test_chunk_size_does_not_change_results() -> None:
    rng = np.random.default_rng(5)
    sims, c2i = _retrieval_case(rng, 23, 5, ties=True)
    rel = rng.random((sims.shape[1], sims.shape[0]))
    results = [retrieval_metrics(sims, c2i, relevance=rel, chunk=c) for c in (1, 3, 22, None)]
    for r in results[1:]:
        assert r == results[0]


def test_identity_like_similarities_are_perfect() -> None:
    c2i = np.repeat(np.arange(4), 2)
    sims = (c2i[None, :] == np.arange(4)[:, None]).astype(np.float32)
    m = retrieval_metrics(sims, c2i)
    for d in ("i2t", "t2i"):
        assert m[f"{d}_R@1"] == m[f"{d}_R@5"] == m[f"{d}_R@10"] == 100.0
        assert m[f"{d}_R-P"] == 100.0 and m[f"{d}_medr"] == 1.0 and m[f"{d}_meanr"] == 1.0
    assert m["rsum"] == 600.0 and m["n_images"] == 4 and m["n_captions"] == 8


def test_hand_computed_case() -> None:
    # 2 images, 4 captions; captions 0,1 belong to image 0 and captions 2,3 to image 1.
    c2i = np.array([0, 0, 1, 1])
    sims = np.array([[0.1, 0.9, 0.8, 0.2], [0.5, 0.5, 0.4, 0.6]], dtype=np.float32)
    m = retrieval_metrics(sims, c2i)
    # i2t: image 0 ranks captions 1,2,3,0 -> first positive at rank 1, 1 of its 2 positives in the
    # top 2 (R-P 50%). Image 1 ranks 3,0,1,2 (0 before 1: tie -> smaller index) -> rank 1, R-P 50%.
    assert m["i2t_R@1"] == 100.0 and m["i2t_R-P"] == 50.0 and m["i2t_meanr"] == 1.0
    # t2i: caption 0 -> images (1, 0): rank 2; caption 1 -> (0, 1) since 0.9 > 0.5: rank 1;
    # caption 2 -> (0, 1): rank 2; caption 3 -> (1, 0): rank 1.
    assert m["t2i_R@1"] == 50.0 and m["t2i_R@5"] == 100.0 and m["t2i_meanr"] == 1.5
    assert m["t2i_medr"] == 1.0  # floor(median([2, 1, 2, 1])) = floor(1.5), the VSE++ convention
    assert m["rsum"] == 100 + 100 + 100 + 50 + 100 + 100


def test_relevance_orientation() -> None:
    # relevance is (n_captions, n_images); image query i grades caption j with relevance[j, i].
    c2i = np.array([0, 1, 2])
    sims = np.eye(3, dtype=np.float32)
    rel = np.zeros((3, 3))
    rel[2, 0] = 1.0  # caption 2 is relevant to image 0 (and image 0 to caption 2)
    m = retrieval_metrics(sims, c2i, relevance=rel, relevance_name="x", ndcg_k=2)
    # i2t image 0 ranks captions (0, 1): caption 2 missing -> 0; images 1, 2 have ideal DCG 0 -> 0.
    assert m["i2t_nDCG@2_x"] == 0.0
    # t2i caption 2 ranks images (2, 0): DCG = 1/log2(3), ideal 1 -> mean over 3 captions.
    assert m["t2i_nDCG@2_x"] == pytest.approx((1 / np.log2(3)) / 3)


def test_queries_without_positives_are_ignored_in_aggregates() -> None:
    c2i = np.array([0, 0, 2])  # image 1 has no caption
    sims = np.array([[1.0, 0.9, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    m = retrieval_metrics(sims, c2i)
    assert m["i2t_R@1"] == 100.0 and m["i2t_meanr"] == 1.0 and m["i2t_R-P"] == 100.0


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError):
        retrieval_metrics(np.zeros((2, 3)), np.array([0, 1]))
    with pytest.raises(ValueError):
        retrieval_metrics(np.zeros((2, 3)), np.array([0, 1, 1]), relevance=np.zeros((2, 3)))
    with pytest.raises(ValueError):
        query_metrics(np.zeros((2, 3)), [np.array([0])])
