"""The split-wide word occlusion (search/word_usage.py) against a plain one-caption-at-a-time loop, its
per-word comparison of two models, its cache next to the index (search/derived.py), and the
embedding map's PCA (search/embedmap.py) against scikit-learn's."""
from __future__ import annotations

import numpy as np
import pytest
from _killer import killer_script

from search import SearchService, derived
from search.attribution import split_words, without
from search.derived import cached_arrays
from search.embedmap import captions_with_word, images_with_word, pca_2d
from search.occlusion_gru import GRUOcclusion
from search.word_usage import UsageOptions, compare_usage, occlude_split, text_variants, usage_markdown


@pytest.fixture(scope="module")
def svc(pair_service) -> SearchService:
    return pair_service


def _reference(svc: SearchService, name: str) -> dict[tuple[int, int], tuple[float, int, int]]:
    """(caption row, word position) → (Δscore, Δrank, full rank): one text at a time, ranks by sorting."""
    e = svc.registry.entries[name]
    ix, encode = e.index, svc.explainer.encode(e)
    imgs = np.asarray(ix.images.vectors)
    out = {}
    for row, (text, img) in enumerate(zip(ix.captions.meta["texts"], ix.captions.meta["image"])):
        words = split_words(text)
        if img < 0 or len(words) < 2:
            continue

        def score_rank(vec, img=img):  # this caption's image (bound now, not at the loop's end)
            s = imgs @ vec
            order = sorted(range(len(s)), key=lambda j: (-s[j], j == img))
            return float(s[img]), order.index(img) + 1

        s_full, r_full = score_rank(np.asarray(ix.captions.vectors[row]))
        for k, w in enumerate(words):
            s, r = score_rank(encode([without(text, w)])[0])
            out[(row, k)] = (s_full - s, r - r_full, r_full)
    return out


@pytest.mark.parametrize("per_batch, shared_states", [(3, True), (1000, True), (7, False)])
def test_split_occlusion_equals_a_plain_loop(svc, per_batch, shared_states):
    e = svc.registry.entries["ltd"]
    encode = svc.explainer.encode_variants(e) if shared_states else text_variants(svc.explainer.encode(e))
    assert isinstance(encode, GRUOcclusion) == shared_states
    table = occlude_split(e.index, encode, captions_per_batch=per_batch)
    ref = _reference(svc, "ltd")
    assert len(table["word"]) == len(ref)
    for i in range(len(table["word"])):
        ds, dr, r = ref[(int(table["caption_row"][i]), int(table["position"][i]))]
        assert table["delta_score"][i] == pytest.approx(ds, abs=1e-5)
        assert (table["delta_rank"][i], table["rank"][i]) == (dr, r)
    texts = e.index.captions.meta["texts"]
    assert all(w == split_words(texts[r])[p].text.lower()
               for w, r, p in zip(table["word"], table["caption_row"], table["position"]))


TRICKY = ["é dog", "naïve café_bar dog's tail", "a " * 45 + "end", "two words", "x y", "!! a -- b !!",
          "red-haired girl", "a dog", "the dog the dog the dog"]


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_shared_gru_states_equal_encoding_every_variant(svc, pool):
    """The GRU shortcut against encoding each variant as a text, on real captions and awkward ones
    (no-token words, words of two tokens, a caption past max_len, variants left with no token)."""
    import torch

    from search.attribution import occlusion_variants
    from training.config import ModelConfig
    from training.device import to_device
    from training.models.text_encoder import GRUTextEncoder

    src = svc.registry.entries["bl"].model.text
    torch.manual_seed(0)
    shape = ModelConfig(word_dim=src.embed.embedding_dim, text_hidden=24, embed_dim=16, head_hidden=32, text_pool=pool)
    enc = GRUTextEncoder(src.vocab, shape, max_len=src.max_len).eval()

    def encode(texts):
        with torch.inference_mode():
            return enc(to_device(enc.prepare(texts), "cpu")).numpy()

    texts = [t for t in list(svc.registry.entries["bl"].index.captions.meta["texts"]) + TRICKY if occlusion_variants(t)[1]]
    words = [occlusion_variants(t)[0] for t in texts]
    np.testing.assert_allclose(GRUOcclusion(enc, encode)(texts, words), text_variants(encode)(texts, words), atol=2e-6)


def _tables(words, ra, rb, sa=None, sb=None, rows=None):
    n = len(words)
    rows = np.arange(n) if rows is None else np.asarray(rows)
    def t(r, s):
        return {"caption_row": rows.astype(np.int32), "position": np.arange(n, dtype=np.int32), "word": np.array(words),
                "delta_rank": np.asarray(r, np.int32), "delta_score": np.asarray(s if s is not None else r, np.float32),
                "rank": np.full(n, 4, np.int32)}  # each caption's image at rank 4
    return t(ra, sa), t(rb, sb)


def test_compare_usage_aggregates_by_hand(svc):
    """Six captions (rows 0-5) of the tiny split, each image at rank 4: removing 'red' moves it under b in 3
    of 4 occurrences (to 5, 2, 4, 9) and never under a; 'dog' only under a, once (to 6); 'the' never."""
    ix = svc.registry.entries["bl"].index
    words = ["red", "red", "red", "red", "dog", "the"]
    ta, tb = _tables(words, [0, 0, 0, 0, 2, 0], [1, -2, 0, 5, 0, 0], sa=[0.0, 0.1, 0, 0, 0.2, 0])
    u = compare_usage(ix, ix, ta, tb, UsageOptions(names=("A", "B"), min_count=1))
    by = {w.word: w for w in u.words}
    red, dog = by["red"], by["dog"]
    moves = (np.log2(5 / 4) + 1 + 0 + np.log2(9 / 4)) / 4  # mean |log2(rank without / rank with)|
    assert (red.n, red.a_moves, red.a_changed, red.b_changed) == (4, 0.0, 0.0, 0.75)
    assert red.b_moves == pytest.approx(moves) and red.gap == pytest.approx(moves)
    assert red.b_delta_rank == pytest.approx(1.0) and red.a_delta_score == pytest.approx(0.025)
    assert [x.b_delta_rank for x in red.examples] == [5, -2, 1]  # b moves most where a does not
    assert dog.gap == pytest.approx(-np.log2(6 / 4)) and [x.a_delta_rank for x in dog.examples] == [2]
    assert u.b_uses()[0].word == "red" and u.a_uses()[0].word == "dog" and by["the"].gap == 0
    assert [w.word for w in u.words] == ["red", "the", "dog"]
    assert u.overall.n == 6 and u.overall.b_moves == pytest.approx(4 * moves / 6)
    assert u.overall.a_moves == pytest.approx(np.log2(6 / 4) / 6)
    assert compare_usage(ix, ix, ta, tb, UsageOptions(min_count=2)).words[0].word == "red" and len(
        compare_usage(ix, ix, ta, tb, UsageOptions(min_count=2)).words) == 1
    twice = compare_usage(ix, ix, *_tables(["red", "red", "red"], [0, 0, 0], [4, 3, 1], rows=[0, 0, 1]),
                          UsageOptions(min_count=1)).words[0]
    assert [x.caption_id for x in twice.examples] == [int(ix.captions.ids[0]), int(ix.captions.ids[1])]  # one each
    md = usage_markdown(u)
    assert f"| red | 4 | {red.images} | 0.00 | {moves:.2f} |" in md and "Words B uses and A ignores" in md


def test_the_lists_put_the_surest_differences_first(svc):
    """A large gap seen in one image (no interval) ranks below a smaller one seen across many."""
    ix = svc.registry.entries["bl"].index
    img = np.asarray(ix.captions.meta["image"])
    spread = [int(np.flatnonzero(img == i)[0]) for i in range(5)]
    one = [int(r) for r in np.flatnonzero(img == 5)[:3]]
    ta, tb = _tables(["sure"] * 5 + ["lucky"] * 3, [0] * 8, [1, 1, 1, 1, 1, 12, 12, 12], rows=spread + one)
    u = compare_usage(ix, ix, ta, tb, UsageOptions(min_count=1))
    assert [w.word for w in u.words] == ["lucky", "sure"]  # by gap
    assert [w.word for w in u.b_uses()] == ["sure", "lucky"]  # by the interval's end nearest 0


def test_the_gap_interval_is_clustered_by_image(svc):
    """The same 4 differing occurrences: spread over 4 images they give a finite interval; all in one
    image there is nothing to estimate the spread from (infinite)."""
    ix = svc.registry.entries["bl"].index
    img = np.asarray(ix.captions.meta["image"])
    one_per_image = [int(np.flatnonzero(img == i)[0]) for i in range(4)]
    ta, tb = _tables(["red"] * 4, [0, 0, 0, 1], [1, 1, 0, 1], rows=one_per_image)
    w = compare_usage(ix, ix, ta, tb, UsageOptions(min_count=1)).words[0]
    d = np.array([np.log2(5 / 4), np.log2(5 / 4), 0, 0])
    se = np.sqrt(4 / 3 * ((d - d.mean()) ** 2).sum()) / 4
    assert w.gap == pytest.approx(d.mean()) and w.gap_ci == pytest.approx(1.96 * se)
    same_image = [int(r) for r in np.flatnonzero(img == 0)[:4]]
    ta, tb = _tables(["red"] * 4, [0, 0, 0, 1], [1, 1, 0, 1], rows=same_image)
    assert compare_usage(ix, ix, ta, tb, UsageOptions(min_count=1)).words[0].gap_ci == float("inf")


def test_word_usage_is_cached_next_to_the_index(svc, tiny_index_pair, monkeypatch):
    u = svc.explainer.word_usage("bl", "ltd", min_count=1)
    assert u.occurrences > 0 and u.words
    assert sorted(p.name for p in tiny_index_pair["bl"].glob("word_occlusion.*")) == ["word_occlusion.g0001.npz"]
    fresh = SearchService({"bl": tiny_index_pair["bl"], "ltd": tiny_index_pair["ltd"]})
    fresh.registry.load()
    import search.word_usage as wu

    monkeypatch.setattr(wu, "occlude_split", lambda *a, **k: pytest.fail("computed again despite the cache"))
    assert fresh.explainer.word_usage("bl", "ltd", min_count=1) == u
    fresh.close()


def test_derived_arrays_are_recomputed_when_torn_stale_or_unwritable(svc, monkeypatch):
    ix = svc.registry.entries["bl"].index
    calls = []

    def compute():
        calls.append(1)
        return {"x": np.arange(3)}

    path = ix.derived_path("embedding_map", "npz")
    path.unlink(missing_ok=True)
    assert list(cached_arrays(ix, "embedding_map", 99, compute)["x"]) == [0, 1, 2] and len(calls) == 1
    assert list(cached_arrays(ix, "embedding_map", 99, compute)["x"]) == [0, 1, 2] and len(calls) == 1
    path.write_bytes(path.read_bytes()[:40])  # torn (never by this code; by a disk, a copy)
    cached_arrays(ix, "embedding_map", 99, compute)
    assert len(calls) == 2
    cached_arrays(ix, "embedding_map", 100, compute)  # another format version
    assert len(calls) == 3
    path.unlink()

    def read_only(*a, **k):  # what opening the lock file beside it raises in a read-only folder
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(derived, "exclusive", read_only)
    assert list(cached_arrays(ix, "embedding_map", 99, compute)["x"]) == [0, 1, 2] and not path.exists()


def test_pca_matches_scikit_learn():
    from sklearn.decomposition import PCA

    x = np.random.default_rng(1).normal(size=(200, 16)) @ np.diag(np.linspace(3, 0.1, 16))
    xy, ratio = pca_2d(x)
    ref = PCA(2).fit(x)
    want = ref.transform(x)
    for k in range(2):
        assert abs(np.corrcoef(xy[:, k], want[:, k])[0, 1]) == pytest.approx(1, abs=1e-6)
    np.testing.assert_allclose(np.abs(xy), np.abs(want), atol=1e-4)
    np.testing.assert_allclose(ratio, ref.explained_variance_ratio_, rtol=1e-5)
    assert np.array_equal(pca_2d(x)[0], pca_2d(x.copy())[0])  # deterministic signs


def test_embedding_map_and_word_masks(svc):
    m = svc.explainer.embedding_map("ltd")
    ix = svc.registry.entries["ltd"].index
    assert m.images.shape == (len(ix.images.ids), 2) and m.captions.shape == (len(ix.captions.ids), 2)
    assert 0 < m.explained[1] <= m.explained[0] < 1
    img, cap = np.asarray(ix.images.vectors), np.asarray(ix.captions.vectors)
    assert m.gap == pytest.approx(float(np.linalg.norm(img.mean(0) - cap.mean(0))), rel=1e-5)
    # each modality centred on its own mean: both clouds sit around the origin (no modality gap on axis 1)
    np.testing.assert_allclose(m.images.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(m.captions.mean(0), 0, atol=1e-5)
    texts = ix.captions.meta["texts"]
    word = split_words(texts[0])[-1].text
    mask = captions_with_word(ix, word.upper())
    assert mask[0] and mask.sum() == sum(word.lower() in [w.text.lower() for w in split_words(t)] for t in texts)
    imgs = images_with_word(ix, mask)
    assert imgs[ix.captions.meta["image"][0]] and imgs.sum() <= mask.sum()


KILLED_WRITER = killer_script(("fsync", "replace", "rename", "unlink"), """
    from pathlib import Path
    from types import SimpleNamespace
    import numpy as np
    from search.derived import cached_arrays

    target = Path(sys.argv[2])
    ix = SimpleNamespace(derived_path=lambda stem, ext: target / f"{stem}.g0001.{ext}", manifest={"checkpoint_sha256": "abc"})
    big = np.arange(3_000_000, dtype=np.float32)
    out = cached_arrays(ix, "word_occlusion", 1, lambda: {"x": big, "word": np.array(["a", "b"])})
    print(count)
""")


@pytest.mark.slow
def test_a_killed_writer_leaves_the_cache_whole_or_absent(tmp_path):
    """SIGKILL before each file operation of the write (fsync of the data, the rename, the folder's
    fsync): afterwards the cache file is absent or whole, and the next run finishes it and leaves no
    temporary behind."""
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    (tmp_path / "probe").mkdir()
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, "0", str(tmp_path / "probe")], env=env,
                          capture_output=True, text=True, check=True)
    n_ops = int(done.stdout.split()[-1])
    assert n_ops >= 3
    for k in range(1, n_ops + 1):
        d = tmp_path / f"k{k}"
        d.mkdir()
        r = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(k), str(d)], env=env, capture_output=True)
        assert r.returncode == -9, (k, r.stderr[-500:])
        final = d / "word_occlusion.g0001.npz"
        if final.exists():  # whole: it loads, with everything in it
            with np.load(final, allow_pickle=False) as z:
                assert z["x"].shape == (3_000_000,) and list(z["word"]) == ["a", "b"]
        ix = SimpleNamespace(derived_path=lambda stem, ext, d=d: d / f"{stem}.g0001.{ext}",
                             manifest={"checkpoint_sha256": "abc"})
        again = cached_arrays(ix, "word_occlusion", 1, lambda: {"x": np.arange(3_000_000, dtype=np.float32),
                                                                 "word": np.array(["a", "b"])})
        assert again["x"][-1] == 2_999_999 and final.is_file()
        assert not [p.name for p in d.iterdir() if ".tmp" in p.name], k
