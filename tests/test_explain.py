"""Word attributions (search/attribution.py), checked against the search API itself: each word's Δscore and
Δrank equal the difference of two text searches, with and without the word; the batched encoding of
the variants equals encoding them one by one; ranks by counting equal ranks by sorting."""
from __future__ import annotations

import numpy as np
import pytest

from search import BadRequest, NotFound, SearchService
from search.attribution import _signed, occlusion_variants, ranks_of, split_words, without


@pytest.fixture(scope="module")
def svc(pair_service) -> SearchService:
    return pair_service


def _api_score_rank(svc: SearchService, model: str, image_id: int, **query) -> tuple[float, int]:
    """The image's score and rank from the search API, ranking every image of the index."""
    n = len(svc.registry.entries[model].index.images.ids)
    hits = svc.search_text(model, k=n, **query).hits
    hit = next(h for h in hits if h.id == image_id)
    return hit.score, hit.rank


# ---- words and variants --------------------------------------------------------------------------
def test_words_and_their_removal():
    text = "A dog's red-haired owner, on grass."
    assert [w.text for w in split_words(text)] == ["A", "dog's", "red", "haired", "owner", "on", "grass"]
    ws = split_words(text)
    assert without(text, ws[0]) == "dog's red-haired owner, on grass."
    assert without(text, ws[3]) == "A dog's red- owner, on grass."
    assert without(text, ws[-1]) == "A dog's red-haired owner, on ."
    words, variants = occlusion_variants("a big dog")
    assert variants == ["big dog", "a dog", "a big"]


def test_score_changes_in_sentences_never_read_minus_zero():
    assert [_signed(x) for x in (0.01234, -0.01234, -0.00004, 0.00004, 0.0)] == [
        "+0.0123", "-0.0123", "0.0000", "0.0000", "0.0000"]


def test_nothing_or_too_much_to_occlude():
    assert occlusion_variants("dog") == (split_words("dog"), []) and occlusion_variants("!!! ...") == ([], [])
    with pytest.raises(BadRequest, match="at most 64"):
        occlusion_variants(" ".join(["a"] * 65))


@pytest.mark.parametrize("query, note", [("dog", "one-word query ('dog')"), ("!!! …", "no words")])
def test_fewer_than_two_words_still_score_and_say_why(svc, query, note):
    image_id = int(svc.registry.entries["bl"].index.images.ids[0])
    ex = svc.explainer.explain(["bl", "ltd"], query=query, image_id=image_id)
    for m in ex.results:
        assert m.words == [] and note in m.note
        assert (m.score, m.rank) == pytest.approx(_api_score_rank(svc, m.model, image_id, query=query), abs=1e-5)
    assert len(ex.summary) == 1 and note in ex.summary[0]


def test_ranks_by_counting_equal_ranks_by_sorting():
    """The reference: sort every image by score (ties: the image last among equals) and find its place."""
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=(40, 300)), 1).astype(np.float32)  # rounded: many ties
    rows = rng.integers(0, 300, size=40)
    own = scores[np.arange(40), rows]
    got = ranks_of(scores, own, in_index=True)
    for q in range(40):
        order = sorted(range(300), key=lambda j: (-scores[q, j], j == rows[q]))  # ties ahead of the image
        assert got[q] == order.index(rows[q]) + 1
    outside = rng.normal(size=40).astype(np.float32)
    assert list(ranks_of(scores, outside, in_index=False)) == [1 + int((scores[q] >= outside[q]).sum()) for q in range(40)]


# ---- against the search API -----------------------------------------------------------------------
def _check_against_search(svc, ex, image_id, full_query: dict):
    for m in ex.results:
        score, rank = _api_score_rank(svc, m.model, image_id, **full_query)
        assert m.score == pytest.approx(score, abs=1e-5) and m.rank == rank
        assert m.of == len(svc.registry.entries[m.model].index.images.ids)
        for w in m.words:
            s_wo, r_wo = _api_score_rank(svc, m.model, image_id, query=w.text_without)
            assert w.delta_score == pytest.approx(score - s_wo, abs=1e-5), (m.model, w.word)
            assert w.delta_rank == r_wo - rank, (m.model, w.word)


def test_attributions_equal_two_search_calls_for_a_caption(svc):
    cap = svc.sample_captions("bl", 1, seed=5)[0]
    ex = svc.explainer.explain(["bl", "ltd"], caption_id=cap.id)
    assert ex.image_id == cap.image_id and ex.text == cap.text and not ex.upload
    assert [m.model for m in ex.results] == ["bl", "ltd"]
    assert [w.word for w in ex.results[0].words] == [w.text for w in split_words(cap.text)]
    _check_against_search(svc, ex, cap.image_id, {"caption_id": cap.id})
    assert ex.summary and all(s.endswith(".") for s in ex.summary)


def test_attributions_equal_two_search_calls_for_free_text_and_another_image(svc):
    e = svc.registry.entries["bl"]
    image_id = int(e.index.images.ids[-1])
    ex = svc.explainer.explain(["ltd", "bl"], query="a big red circle on a striped background", image_id=image_id)
    assert ex.caption_id is None and ex.image_id == image_id
    _check_against_search(svc, ex, image_id, {"query": "a big red circle on a striped background"})
    # some word must matter somewhere: the check above is not comparing zeros with zeros
    assert any(abs(w.delta_score) > 1e-4 for m in ex.results for w in m.words)


def test_batched_encoding_equals_one_by_one(svc):
    e = svc.registry.entries["ltd"]
    _, variants = occlusion_variants("a small green triangle in the top left corner of a dotted background")
    batched = svc.explainer.encode(e)(variants)
    one_by_one = np.stack([svc.encode_text("ltd", v) for v in variants])  # the search API's path (cache, batcher)
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)


def test_an_upload_is_ranked_as_one_more_image(svc, tiny_index_pair):
    e = svc.registry.entries["bl"]
    path = e.index.images.meta["paths"][0]
    data = open(path, "rb").read()
    ex = svc.explainer.explain(["bl"], query="a blue square on a white background", image_bytes=data)
    m = ex.results[0]
    assert ex.upload and ex.image_id is None and m.of == len(e.index.images.ids) + 1
    vec = svc.encode_image_bytes("bl", data)
    q = svc.encode_text("bl", "a blue square on a white background")
    assert m.score == pytest.approx(float(vec @ q), abs=1e-5)
    assert m.rank == 1 + int((np.asarray(e.index.images.vectors) @ q >= m.score).sum())


@pytest.mark.parametrize("kwargs, error, message", [
    ({"query": "dog"}, BadRequest, "image"),
    ({"query": "   ", "image_id": 0}, BadRequest, "empty"),
    ({"query": " ".join(["ab"] * 400), "image_id": 0}, BadRequest, "characters"),
    ({"query": " ".join(["a"] * 100), "image_id": 0}, BadRequest, "at most 64"),
    ({"caption_id": 10**9}, NotFound, "caption id"),
    ({"query": "a red dog", "image_id": 10**9}, NotFound, "image id"),
    ({"query": "a red dog", "caption_id": 1, "image_id": 0}, BadRequest, "exactly one"),
    ({}, BadRequest, "exactly one"),
])
def test_bad_inputs_are_clear_errors(svc, kwargs, error, message):
    image = kwargs.pop("image_id", None)
    if image == 0:
        image = int(svc.registry.entries["bl"].index.images.ids[0])
    with pytest.raises(error, match=message):
        svc.explainer.explain(["bl", "ltd"], image_id=image, **kwargs)


@pytest.mark.parametrize("names", [[], ["bl", "bl"], ["bl", "ltd", "bl"], ["a", "b", "c", "d", "e"]])
def test_model_lists_are_checked(svc, names):
    with pytest.raises(BadRequest):
        svc.explainer.explain(names, query="a red dog", image_id=int(svc.registry.entries["bl"].index.images.ids[0]))
    with pytest.raises(NotFound):
        svc.explainer.explain(["bl", "nope"], query="a red dog", image_id=int(svc.registry.entries["bl"].index.images.ids[0]))
