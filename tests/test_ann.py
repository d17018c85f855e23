"""Indexes past RAM: the fixed choice by corpus size (`--factory fixed`), IVF-PQ re-ranked on the exact vectors,
and index directories served with their IVF lists and exact vectors memory-mapped."""
from __future__ import annotations

import numpy as np
import pytest

from indexer import ann
from indexer.ann import build_vector_index, choose_index
from indexer.index import Modality, load_index_dir, save_index_dir


def _clustered(n, d, seed=0, clusters=200):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, d)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + 0.7 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _recall(ids, base, q, k=10):
    ref = np.argsort(-(q @ base.T), axis=1)[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, ref)]))


def test_auto_is_exact_for_small_corpora_and_ivfpq_for_large():
    assert choose_index(ann.FLAT_MAX, 256).factory == "Flat"
    plan = choose_index(1_000_000, 256)
    assert plan.factory == "IVF2048,PQ32" and plan.rerank == ann.RERANK and plan.nprobe == 64
    assert plan.train_size == 131_072  # 64 training vectors per list
    assert choose_index(600_000, 1024).factory.endswith(",PQ128")  # COCO's captions at the presets' 1024-d


@pytest.mark.slow
def test_reranking_recovers_the_recall_that_pq_codes_lose(monkeypatch):
    base, q = _clustered(8000, 32, 0, clusters=50), _clustered(100, 32, 1, clusters=50)
    monkeypatch.setattr(ann, "FLAT_MAX", 1000)  # make "fixed" choose IVF-PQ at this test's size
    plan = choose_index(len(base), 32)
    assert plan.factory == "IVF128,PQ4" and plan.nprobe == 8
    reranked = build_vector_index(base, "fixed")
    plain = build_vector_index(base, plan.factory)
    plain.index.nprobe = reranked.nprobe
    r_plain = _recall(plain.search(q, 10)[1], base, q)
    r_rerank = _recall(reranked.search(q, 10)[1], base, q)
    assert r_rerank >= 0.8 and r_rerank > r_plain + 0.2, (r_plain, r_rerank)
    scores, ids = reranked.search(q[:3], 5)  # scores are the exact inner products, sorted
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", q[:3], base[ids]), rtol=1e-5, atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-7).all()


@pytest.mark.slow
def test_ivfpq_index_dir_is_served_memory_mapped(tmp_path, monkeypatch):
    """Saved, reopened with mmap (the server's path), the index gives the same results as in memory,
    its IVF lists come from the file (OnDiskInvertedLists) and its exact vectors are a memmap."""
    import faiss

    monkeypatch.setattr(ann, "FLAT_MAX", 1000)
    img, cap = _clustered(5000, 32, 0), _clustered(300, 32, 1)
    mods = (Modality(build_vector_index(img, "fixed"), img, {"ids": list(range(5000))}),
            Modality(build_vector_index(cap, "fixed"), cap, {"ids": list(range(300))}))
    save_index_dir(tmp_path / "ix", {"name": "x", "factory": "fixed", "ground_truth": False}, *mods)
    ix = load_index_dir(tmp_path / "ix", mmap=True, verify="counts")
    spec = ix.manifest["indexes"]
    assert spec["images"]["factory"].startswith("IVF") and spec["images"]["rerank"] == ann.RERANK
    assert spec["captions"] == {"factory": "Flat", "nprobe": None, "rerank": 0}
    inv = faiss.extract_index_ivf(ix.images.index.index).invlists
    assert type(faiss.downcast_InvertedLists(inv)).__name__ == "OnDiskInvertedLists"
    assert isinstance(ix.images.index.exact, np.memmap) or isinstance(getattr(ix.images.index.exact, "base", None), np.memmap)
    q = _clustered(20, 32, 2)
    want = mods[0].index.search(q, 10)
    got = ix.images.index.search(q, 10)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert ix.images.index.nprobe == mods[0].index.nprobe


def test_append_reranks_the_new_rows_too(tmp_path, monkeypatch):
    from indexer.index import append_to_index_dir, open_for_append

    monkeypatch.setattr(ann, "FLAT_MAX", 1000)
    img = _clustered(4000, 32, 0)
    mods = (Modality(build_vector_index(img, "fixed"), img, {"ids": list(range(4000))}),
            Modality(build_vector_index(img[:0], "fixed"), img[:0], {"ids": []}))
    save_index_dir(tmp_path / "ix", {"name": "x", "factory": "fixed", "ground_truth": False}, *mods)
    new = _clustered(50, 32, 9)
    ix = append_to_index_dir(open_for_append(tmp_path / "ix"), (new, {"ids": list(range(4000, 4050))}), None)
    _, ids = ix.images.index.search(new[:5], 1)
    assert ids[:, 0].tolist() == [4000, 4001, 4002, 4003, 4004]  # each new vector finds itself
    again = load_index_dir(tmp_path / "ix", mmap=True)
    assert again.images.index.search(new[:5], 1)[1][:, 0].tolist() == [4000, 4001, 4002, 4003, 4004]


@pytest.mark.parametrize("factory", ["Flat", "HNSW32"])
def test_named_factories_are_built_as_given(factory):
    base = _clustered(500, 16)
    vi = build_vector_index(base, factory)
    assert vi.factory == factory and vi.rerank == 0
