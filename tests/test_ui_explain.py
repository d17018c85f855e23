"""The UI's explanations without a browser: the attribution panel in Compare (ui/explain_render.py,
ui/tabs/compare.py), the Explorer's words and map views (ui/tabs/explorer.py), and the URL state that
makes a comparison shareable (ui/share.py)."""
from __future__ import annotations

import html as htmllib
import re
from types import SimpleNamespace

import pytest

from app.api.routers.deps import thumbnail_url
from search import SearchService
from ui import share
from ui.explain_render import words_html
from ui.tabs import compare as cmp
from ui.tabs import explorer as ex


def THUMBS(image_id: int, model: str | None, size: int) -> str:
    return thumbnail_url(image_id, model or "", size)


@pytest.fixture(scope="module")
def svc(pair_service) -> SearchService:
    return pair_service


@pytest.fixture(scope="module")
def caption(svc) -> dict:
    return svc.sample_captions("bl", 1, seed=7)[0]


def _attributes(html: str) -> set[str]:
    """Every attribute name of every tag the browser would build from ``html``."""
    from html.parser import HTMLParser

    names: set[str] = set()

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            names.update(a for a, _ in attrs)

    P().feed(html)
    return names


# ---- Compare: word attributions -----------------------------------------------------------------
def test_attribution_panel_shades_every_word_per_model(svc, caption):
    html, shown = cmp.explain_panel(svc, "bl", "ltd", {"caption_id": caption.id}, THUMBS)
    exp = svc.explainer.explain(["bl", "ltd"], caption_id=caption.id)
    assert shown == caption.image_id and htmllib.escape("the caption's own image") in html
    rows = html.split('<div class="ltd-attr-row">')[1:]
    assert len(rows) == 2 and ">bl<" in rows[0] and ">ltd<" in rows[1]
    for row, m in zip(rows, exp.results):
        deltas = [float(x) for x in re.findall(r'data-delta-score="([-0-9.]+)"', row)]
        assert deltas == pytest.approx([w.delta_score for w in m.words], abs=1e-5)
        assert [int(x) for x in re.findall(r'data-delta-rank="(-?\d+)"', row)] == [w.delta_rank for w in m.words]
        assert f"rank <b>{m.rank:,}</b> of {m.of:,}" in row
    # one shared colour scale: the word with the largest |Δscore| of both models is the darkest
    alphas = [float(a) for a in re.findall(r"background:rgba\(\d+,\d+,\d+,([0-9.]+)\)", html)]
    assert max(alphas) == pytest.approx(0.85)
    for sentence in exp.summary:
        assert htmllib.escape(sentence.split("*")[0]) in html


def test_free_text_explains_model_a_top_result_or_a_clicked_image(svc):
    q = {"query": "a big blue circle on a dotted background"}
    html, shown = cmp.explain_panel(svc, "ltd", "bl", q, THUMBS)
    assert shown == svc.search_text("ltd", query=q["query"], k=1).hits[0].id and htmllib.escape("ltd's top result") in html
    other = int(svc.registry.entries["bl"].index.images.ids[-1])
    html, shown = cmp.explain_panel(svc, "ltd", "bl", q, THUMBS, other)
    assert shown == other and "picked from the results" in html
    assert cmp.explain_panel(svc, "bl", "ltd", {"image_id": other}, THUMBS) == ("", None)  # image queries: none


def test_attribution_panel_escapes_and_says_why_when_there_are_no_words(svc):
    hostile = '<img src=x onerror=alert(1)> "quoted" & more'
    html, _ = cmp.explain_panel(svc, "bl", "ltd", {"query": hostile}, THUMBS)
    assert "<img src=x" not in html and "&lt;" in html and _attributes(html).isdisjoint({"onerror"})
    html, _ = cmp.explain_panel(svc, "bl", "ltd", {"query": "dog"}, THUMBS)
    assert "one-word query" in html and "ltd-attr-row" in html
    html, _ = cmp.explain_panel(svc, "bl", "ltd", {"query": " ".join(["a"] * 80)}, THUMBS)
    assert "at most 64" in html and "ltd-notice" in html


def test_compare_view_returns_results_attributions_and_url_state(svc, caption):
    html, attr, state = cmp.compare_view(svc, cmp.Pair("bl", "ltd", 5), {"caption_id": caption.id}, THUMBS)
    assert html.count('<section class="ltd-col">') == 2 and "ltd-attr" in attr
    assert share.read(state, ["bl", "ltd"], [5, 10]) == share.UIState(
        tab="compare", a="bl", b="ltd", k=5, cid=caption.id, ex=caption.image_id,
        ga=share.pin(svc, "bl"), gb=share.pin(svc, "ltd"))  # the index state each model served


# ---- Explorer: words and maps -------------------------------------------------------------------
def test_words_view_lists_both_directions_with_clickable_examples(svc):
    html = ex.words_view(svc, "bl", "ltd", min_count=2, top=5)
    u = svc.explainer.word_usage("bl", "ltd", min_count=2)
    assert "Words ltd uses and bl ignores" in html and "Words bl uses and ltd ignores" in html
    for w in u.b_uses(5) + u.a_uses(5):
        assert f'<b class="ltd-word">{w.word}</b>' in html
        for x in w.examples:
            assert f'data-cid="{x.caption_id}"' in html
    assert "Pick two different models" in ex.words_view(svc, "bl", "bl")
    assert 'data-cid="' in words_html(u) and "<script" not in words_html(u)


def test_map_view_draws_both_models_and_colours_a_word(svc):
    html = ex.map_view(svc, "bl", "ltd")
    ix = svc.registry.entries["bl"].index
    assert html.count("<svg") == 2
    assert html.count("<circle") == 2 * len(ix.captions.ids) and html.count("<rect") == 2 * len(ix.images.ids)
    texts = ix.captions.meta["texts"]
    word = texts[0].split()[-1]
    html = ex.map_view(svc, "bl", "ltd", "word", word)
    with_word = sum(word.lower() in t.lower().split() for t in texts)
    assert html.count('fill="#4f46e5"') == 2 * with_word and f"({with_word:,})" in html
    assert "Pick two different models" in ex.map_view(svc, "ltd", "ltd")


@pytest.mark.parametrize("data, want", [({"cid": "12"}, {"caption_id": 12}), ({"iid": "3"}, {"image_id": 3}),
                                         ({"cid": "x; drop"}, None), ({"cid": "-1"}, None), ({}, None),
                                         ({"cid": None, "iid": "4"}, {"image_id": 4})])
def test_clicks_from_the_browser_are_parsed_defensively(data, want):
    assert ex.clicked_query(SimpleNamespace(_data=data)) == want


# ---- URL state ----------------------------------------------------------------------------------
def test_url_state_round_trip_and_hostile_values():
    s = share.compare_state("bl", "ltd", 20, {"query": "a dog & a cat"}, 7)
    assert s == "tab=compare&a=bl&b=ltd&k=20&q=a+dog+%26+a+cat&ex=7"
    assert share.read(s, ["bl", "ltd"], [5, 10, 20]) == share.UIState(tab="compare", a="bl", b="ltd", k=20,
                                                                     q="a dog & a cat", ex=7)
    bad = share.read("?tab=admin&a=../etc&b=ltd&k=99999&cid=1e9&img=-3&view=<x>&q=" + "a" * 5000 + "&tab=search",
                     ["bl", "ltd"], [5, 10])
    assert (bad.tab, bad.a, bad.b, bad.k, bad.cid, bad.img, bad.view) == (None, None, "ltd", None, None, None, None)
    assert len(bad.q) == share.MAX_VALUE
    assert share.read("", ["bl"], [10]) == share.UIState()
    assert share.UIState(cid=3, q="x").query() == {"caption_id": 3} and share.UIState().query() is None


def test_the_page_reopens_a_shared_url(svc, caption):
    """The load event's function, given a query string, fills Compare as the link says."""
    from ui.app import build_ui

    blocks = build_ui(svc, thumb_url=THUMBS)
    cfg = blocks.get_config_file()
    dep = next(d for d in cfg["dependencies"] if d.get("js") == share.READ_JS)
    by_id = {c["id"]: c for c in cfg["components"]}
    fn = blocks.fns[dep["id"]].fn
    upd = fn(f"?tab=compare&a=ltd&b=bl&k=5&cid={caption.id}")
    by_elem = {getattr(k, "elem_id", None): v for k, v in upd.items()}
    assert "ltd-attr" in by_elem["compare-explain"] and by_elem["compare-results"].count('class="ltd-col"') == 2
    assert f"cid={caption.id}" in by_elem["compare-share"] and "a=ltd&b=bl" in by_elem["compare-share"]
    assert {by_id[i]["props"].get("elem_id") for i in dep["outputs"]} >= {"compare-results", "explorer-words"}
    assert fn("?tab=explorer&a=bl&b=ltd&view=words")  # the words view is filled
    assert list(fn("?nothing=here")) == [next(k for k in upd if getattr(k, "elem_id", None) == "ltd-tabs")]
