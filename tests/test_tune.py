"""Indexes built to a target (indexer/tune.py): the tuner's choice meets its recall within its memory
on fresh queries, an impossible target is refused in one line naming the closest candidate, and the
record it leaves in the manifest survives a save, a load, an append and `ltd eval`'s re-measurement."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from indexer.index import Modality, append_to_index_dir, load_index_dir, open_for_append, save_index_dir
from indexer.tune import (
    NoIndexMeetsTarget,
    Target,
    auto_factory,
    needs_retune,
    parse_auto,
    parse_bytes,
    remeasure,
    tune_index,
)
from indexer.tune_candidates import exact_topk, per_query_recall
from indexer.vector_index import VectorIndex, rerank_exact

N, D = 12_000, 32
FLAT_BYTES = N * D * 4


def _mixture(seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((120, D)).astype(np.float32)

    def draw(n):
        x = centres[rng.integers(0, len(centres), n)] + 0.7 * rng.standard_normal((n, D)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    return draw


@pytest.fixture(scope="module")
def corpus():
    draw = _mixture()
    return draw(N), draw(1000)  # the corpus, and fresh queries from the same mixture


@pytest.fixture(scope="module")
def tuned(corpus):
    x, _ = corpus
    return tune_index(x, Target(recall=0.95, max_memory=FLAT_BYTES // 2))


@pytest.mark.slow
def test_the_choice_meets_its_target_on_fresh_queries(corpus, tuned):
    x, fresh = corpus
    chosen = tuned.tuning["chosen"]
    assert tuned.factory not in ("Flat", "HNSW32") and "Flat" not in tuned.factory  # excluded by the memory limit
    assert chosen["resident_bytes"] <= FLAT_BYTES // 2 and chosen["recall_ci95"][0] >= 0.95
    assert tuned.ntotal == N and tuned.nprobe == chosen["nprobe"] and tuned.rerank == chosen["rerank"]
    got = per_query_recall(tuned.search(fresh, 10)[1], exact_topk(x, fresh, 10)).mean()
    assert got >= 0.94 and abs(got - chosen["recall"]) <= 0.02, (got, chosen)
    held_out = tuned.tuning["queries"]
    assert held_out == 1000
    _, ids = tuned.search(x[:50], 1)  # ids are corpus rows, the held-out rows (added last) included
    assert (ids[:, 0] == np.arange(50)).mean() >= 0.9


@pytest.mark.slow
def test_an_impossible_target_is_refused_in_one_line_naming_the_closest(corpus):
    x, _ = corpus
    with pytest.raises(NoIndexMeetsTarget) as err:
        tune_index(x, Target(recall=0.95, max_memory=FLAT_BYTES // 2, max_query_ms=1e-6))
    msg = str(err.value)
    assert "\n" not in msg and "no index meets recall@10 ≥ 0.95" in msg
    assert "the closest is " in msg and ("IVF" in msg) and "recall 0." in msg
    with pytest.raises(NoIndexMeetsTarget, match=r"the smallest candidate, \S*IVF\S*PQ4, needs about 0\.2 MB"):
        tune_index(x, Target(recall=0.9, max_memory=1000))


def test_small_corpora_stay_exact_without_measuring():
    x = _mixture(3)(2000)
    vi = tune_index(x, Target(recall=0.99))
    assert vi.factory == "Flat" and vi.tuning["chosen"]["recall"] == 1.0 and vi.ntotal == 2000


@pytest.mark.slow
def test_the_record_survives_save_load_append_and_is_remeasured(tmp_path, corpus, tuned):
    from indexer.evaluate import retuned_recalls

    x, _ = corpus
    caps = x[:300]
    save_index_dir(tmp_path / "ix", {"name": "t", "factory": "auto:recall=0.95", "ground_truth": False},
                   Modality(tuned, x, {"ids": list(range(N))}),
                   Modality(VectorIndex.build(caps, "Flat"), caps, {"ids": list(range(300))}))
    ix = load_index_dir(tmp_path / "ix", mmap=True)
    spec = ix.manifest["indexes"]["images"]
    assert spec["tuning"]["chosen"] == tuned.tuning["chosen"] and spec["tuning"]["n"] == N
    np.testing.assert_array_equal(ix.images.index.search(x[:20], 10)[1], tuned.search(x[:20], 10)[1])
    checks = retuned_recalls(ix)
    assert set(checks) == {"images"} and abs(checks["images"]["now"]["recall"] - checks["images"]["built"]) <= 0.03
    new = _mixture(0)(20)
    ix2 = append_to_index_dir(open_for_append(tmp_path / "ix"), (new, {"ids": list(range(N, N + 20))}), None)
    assert ix2.manifest["indexes"]["images"]["tuning"]["n"] == N  # tuned at N, now N + 20
    assert ix2.images.index.search(new[:5], 1)[1][:, 0].tolist() == list(range(N, N + 5))
    assert not needs_retune(ix2.manifest, N + 20) and needs_retune(ix2.manifest, 2 * N)


def test_needs_retune_by_factor():
    mf = {"indexes": {"images": {"tuning": {"n": 1000}}, "captions": {"factory": "Flat"}}}
    assert not needs_retune(mf, 1999) and needs_retune(mf, 2000) and needs_retune(mf, 499)
    assert needs_retune(mf, 1500, factor=1.5) and not needs_retune(mf, 10**6, modality="captions")
    assert not needs_retune({}, 10**6)


def test_idmapped_indexes_continue_row_ids_when_added_to():
    x = _mixture(4)(600)
    index = faiss.IndexIDMap(faiss.IndexHNSWFlat(D, 16, faiss.METRIC_INNER_PRODUCT))
    index.add_with_ids(x[:500], np.arange(500, dtype=np.int64))
    vi = VectorIndex(index, "HNSW16")
    vi.add(x[500:])
    assert vi.search(x[550:555], 1)[1][:, 0].tolist() == [550, 551, 552, 553, 554]
    assert vi.describe()["efSearch"] == vi.ef_search


def test_rerank_matches_a_plain_loop():
    rng = np.random.default_rng(5)
    exact, q = rng.standard_normal((300, 8)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    cand = np.stack([rng.choice(300, 30, replace=False) for _ in range(40)])  # FAISS lists hold no duplicates
    cand[rng.random(cand.shape) < 0.2] = -1  # and pad with -1 when short
    cand[0] = -1
    scores, ids = rerank_exact(cand, exact, q, 5)
    for i in range(40):
        row = np.sort(cand[i][cand[i] >= 0])
        s = exact[row] @ q[i]
        top = np.argsort(-s, kind="stable")[:5]
        np.testing.assert_array_equal(ids[i, : len(top)], row[top])
        np.testing.assert_allclose(scores[i, : len(top)], s[top], rtol=1e-5)
        assert (ids[i, len(top):] == -1).all()


def test_targets_parse_and_print():
    assert parse_bytes("1GB") == 10**9 and parse_bytes("512MiB") == 2**29 and parse_bytes(800) == 800
    with pytest.raises(ValueError, match="cannot read"):
        parse_bytes("lots")
    f = auto_factory(0.9, "2GB", 3)
    assert f == "auto:recall=0.9,memory=2000000000,ms=3" and parse_auto(f) == Target(0.9, 2 * 10**9, 3.0)
    assert auto_factory() == "auto" and parse_auto("auto") == Target() and parse_auto("HNSW32") is None
    with pytest.raises(ValueError, match="--recall"):
        auto_factory(1.5)


def test_remeasure_leaves_each_query_out_of_its_own_answers():
    x = _mixture(6)(3000)
    flat = VectorIndex.build(x, "Flat")
    r = remeasure(flat, x, queries=200)
    assert r["recall"] == 1.0 and r["queries"] == 200  # an exact index, its queries' self-matches dropped


def test_the_cli_flags_ask_for_a_tuned_index():
    from app.cli.index import index_factory
    from app.cli.parser import build_parser

    def factory(*flags):
        args = build_parser()[0].parse_args(["index", "--checkpoint", "c.pt", "--out", "o", *flags])
        return index_factory(args)
    assert factory() == "Flat" and factory("--factory", "HNSW32") == "HNSW32" and factory("--factory", "auto") == "auto"
    assert factory("--recall", "0.95", "--max-memory", "1GB") == "auto:recall=0.95,memory=1000000000"
    assert parse_auto(factory("--factory", "auto", "--max-query-ms", "2")) == Target(max_query_ms=2.0)
    with pytest.raises(ValueError, match="cannot be combined with --factory HNSW32"):
        factory("--factory", "HNSW32", "--recall", "0.9")
    with pytest.raises(ValueError, match="--max-memory: cannot read"):
        factory("--max-memory", "a lot")


def test_compaction_keeps_the_tuned_index_until_the_corpus_outgrows_it(monkeypatch):
    import indexer.compact as compact

    x = _mixture(3)(4000)
    tuned = tune_index(x[:2000], Target(recall=0.95))
    mf = {"factory": "auto:recall=0.95", "indexes": {"images": {"factory": tuned.factory, "tuning": tuned.tuning}}}
    calls = []
    real = compact.build_vector_index
    monkeypatch.setattr(compact, "build_vector_index", lambda v, f, **kw: calls.append((len(v), f)) or real(v, f, **kw))
    kept = compact.side_index(mf, "images", x[:2500])  # grown by 1.25×: the tuner's choice, built again
    assert not calls and kept.factory == tuned.tuning["chosen"]["factory"] and kept.tuning == tuned.tuning
    assert kept.search(x[2400:2410], 1)[1][:, 0].tolist() == list(range(2400, 2410))
    compact.side_index(mf, "images", x)  # 2×: tuned again for the new size
    assert calls == [(4000, "auto:recall=0.95")]
    compact.side_index({"factory": "Flat"}, "images", x[:10])  # a named factory is rebuilt as named
    assert calls[-1] == (10, "Flat")


@pytest.mark.slow
def test_compaction_rebuilds_a_tuned_ivf_index_with_its_chosen_parameters(corpus, tuned):
    import indexer.compact as compact

    x, fresh = corpus
    chosen = tuned.tuning["chosen"]
    mf = {"factory": "auto:recall=0.95", "indexes": {"images": {"factory": tuned.factory, "tuning": tuned.tuning}}}
    grown = np.concatenate([x, fresh[:500]])
    vi = compact.side_index(mf, "images", grown)
    assert vi.factory == chosen["factory"] and vi.nprobe == chosen.get("nprobe") and vi.rerank == chosen.get("rerank", 0)
    truth = exact_topk(grown, fresh[500:], 10)
    recall = per_query_recall(vi.search(fresh[500:], 10)[1], truth).mean()
    assert recall >= chosen["recall"] - 0.03  # the choice still holds at 1.04× the size it was tuned at
