"""The UI's tabs (ui/tabs/*.py) and rendering (ui/render.py) on two tiny trained models, without a
browser, and the Blocks app (ui/app.py): its tabs, and events wired to the right inputs and outputs."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from app.api.routers.deps import thumbnail_url
from search import CaptionService, SearchError, SearchService
from ui import inputs, render
from ui.context import UIContext
from ui.tabs import compare as cmp
from ui.tabs import explorer as ex
from ui.tabs import search as srch
from ui.tabs import training as trn


def THUMBS(image_id: int, model: str | None, size: int) -> str:
    return thumbnail_url(image_id, model or "", size)


def view(service: SearchService) -> UIContext:
    """The page's context over ``service`` (read-only: cards offer "more like this" only)."""
    return UIContext(service, CaptionService(service), THUMBS)


@pytest.fixture(scope="module")
def svc(pair_service) -> SearchService:
    return pair_service


@pytest.fixture(scope="module")
def one(tiny_index_pair) -> SearchService:
    s = SearchService({"bl": tiny_index_pair["bl"]})
    s.registry.load()
    return s


@pytest.fixture(scope="module")
def loading(tiny_index_pair) -> SearchService:
    return SearchService({"bl": tiny_index_pair["bl"], "ltd": tiny_index_pair["ltd"]})  # never loaded


@pytest.fixture(scope="module")
def limited(svc) -> SearchService:
    """The same loaded models under other limits (a server sets them once, in the service's config)."""
    out = copy.copy(svc)
    out.config = svc.config.model_copy(update={"max_upload_bytes": 1234, "max_query_chars": 77, "max_k": 20})
    return out


@pytest.fixture(scope="module")
def caption(svc) -> dict:
    return svc.sample_captions("bl", 1, seed=3)[0]


def n_class(html: str, cls: str) -> int:
    """How many elements carry exactly this class list start, e.g. 'ltd-card gt'."""
    return len(re.findall(rf'class="{re.escape(cls)}"', html))


# ---- Search ------------------------------------------------------------------------------------
def test_text_search_with_dataset_caption_marks_ground_truth(svc, caption):
    html = srch.search_text(view(svc), "bl", caption.text, caption, 10)
    n_images = svc.model_info("bl").counts["images"]
    assert html.count('<figure class="ltd-card') == min(10, n_images)
    assert n_class(html, "ltd-card gt") == 1  # one ground-truth image per caption
    assert n_class(html, "ltd-card miss") == min(10, n_images) - 1
    assert f"dataset caption #{caption.id}" in html
    assert "1st GT rank" in html and "P@" in html and "nDCG@" in html
    assert f"/api/images/{caption.image_id}/thumbnail?" in html  # ground truth shown in the banner


def test_text_search_free_text_has_no_ground_truth(svc):
    html = srch.search_text(view(svc), "ltd", "a red square on a striped background", None, 5)
    assert html.count('<figure class="ltd-card neutral"') == 5
    assert "ltd-card gt" not in html and "ltd-card miss" not in html
    assert "free text" in html and "no ground truth" in html


def test_edited_caption_becomes_free_text(svc, caption):
    assert inputs.text_query(caption.text, caption) == {"caption_id": caption.id}
    assert inputs.text_query("  " + caption.text.upper() + "  ", caption) == {"query": caption.text.upper()}
    assert inputs.text_query(caption.text + " ", caption) == {"caption_id": caption.id}


@pytest.mark.parametrize("text", ["", "   ", None])
def test_empty_text_query_gives_a_message(svc, text):
    html = srch.search_text(view(svc), "bl", text, None, 10)
    assert "ltd-error" in html and "Type a query" in html
    assert "Traceback" not in html


def test_query_text_is_escaped(svc):
    html = srch.search_text(view(svc), "bl", '<script>alert("x")</script> dog', None, 3)
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_image_search_by_dataset_id_marks_ground_truth_captions(svc, caption):
    html = srch.search_image(view(svc), "bl", caption.image_id, None, 10)
    assert html.count('<li class="ltd-cap') == 10
    assert n_class(html, "ltd-cap gt") >= 1
    assert f"dataset image #{caption.image_id}" in html
    assert "ground-truth captions" in html  # the query's own captions are listed
    same = srch.search_image(view(svc), "bl", str(caption.image_id), None, 10)  # a textbox value
    assert re.sub(r"\d+ ms", "", same) == re.sub(r"\d+ ms", "", html)


@pytest.fixture
def upload_dir():
    """A folder inside Gradio's upload folder, where the browser's uploads land."""
    import shutil
    import uuid

    from gradio.utils import get_upload_folder

    d = Path(get_upload_folder()) / f"ltd-test-{uuid.uuid4().hex}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_image_search_by_upload(svc, tiny_index_pair, upload_dir, caption):
    path = upload_dir / "photo.jpg"
    path.write_bytes(svc.image_path(caption.image_id, "bl").read_bytes())
    html = srch.search_image(view(svc), "bl", None, str(path), 5)
    assert html.count('<li class="ltd-cap neutral"') == 5
    assert "uploaded image" in html and "data:image/jpeg;base64," in html  # a preview of the upload


def test_only_files_uploaded_through_the_ui_are_read(svc, limited, caption, upload_dir, tmp_path):
    """A file path that did not come from the UI's upload folder is never opened: not a dataset image,
    not /etc/passwd, not a device, not a link out of the folder, not a file over the size limit."""
    outside = svc.image_path(caption.image_id, "bl")
    link = upload_dir / "link.jpg"
    link.symlink_to(outside)
    big = upload_dir / "big.png"
    big.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 2048)
    for p in (outside, "/etc/passwd", "/dev/zero", link, upload_dir):
        html = srch.search_image(view(svc), "bl", None, str(p), 5)
        assert "only images uploaded through this page" in html, p
    assert "exceeds the limit of 1,234 bytes" in srch.search_image(view(limited), "bl", None, str(big), 5)


@pytest.mark.parametrize("image_id, upload, message", [
    (999_999, None, "not in"),
    ("abc", None, "whole number"),
    (None, None, "Pick a dataset image"),
    ("", None, "Pick a dataset image"),
])
def test_image_search_bad_input_gives_a_message(svc, image_id, upload, message):
    html = srch.search_image(view(svc), "bl", image_id, upload, 10)
    assert "ltd-error" in html and message in html
    assert "Traceback" not in html


def test_bad_and_empty_uploads_give_a_message(svc, upload_dir):
    bad = upload_dir / "not_an_image.jpg"
    bad.write_bytes(b"this is not a JPEG" * 10)
    empty = upload_dir / "empty.png"
    empty.write_bytes(b"")
    for p in (bad, empty):
        html = srch.search_image(view(svc), "bl", None, str(p), 10)
        assert "ltd-error" in html, html
        assert "Traceback" not in html
    assert "empty" in srch.search_image(view(svc), "bl", None, str(empty), 10)


def test_unknown_model_gives_a_message(svc):
    html = srch.search_text(view(svc), "nope", "a dog", None, 10)
    assert "ltd-error" in html and "unknown model" in html


def test_random_caption_and_examples(svc):
    c = inputs.random_caption(svc, "bl", seed=1)
    assert c == svc.caption("bl", c.id) and c.text and c.image_id is not None  # a caption of the index, as served
    assert inputs.random_caption(svc, "bl", seed=1) == c  # deterministic with a seed
    assert inputs.random_caption(svc, "bl", seed=1, exclude=c).id != c.id
    ex = inputs.example_captions(svc, "bl", n=5)
    assert len(ex) == 5 and len({e.id for e in ex}) == 5


def test_image_picker_gives_thumbnail_files(svc, tmp_path, monkeypatch):
    monkeypatch.setattr(svc.thumbnails, "folder", tmp_path / "thumbs")
    items, ids = inputs.image_picker(svc, "bl", n=4, seed=0)
    assert 1 <= len(items) <= 4 and len(ids) == len(items)
    for (path, label), i in zip(items, ids):
        assert label == f"#{i}"
        assert open(path, "rb").read(2) == b"\xff\xd8"  # JPEG
        assert Path(path).parent == tmp_path / "thumbs"


def test_inline_thumbnails(svc, caption):
    src = render.inline_thumbs(svc)(caption.image_id, "bl", 64)
    assert src.startswith("data:image/jpeg;base64,")
    assert render.inline_thumbs(svc)(999_999, "bl", 64) == ""


# ---- Compare -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ctx(svc) -> UIContext:
    return UIContext(svc, CaptionService(svc), THUMBS)


def compare_text(ctx: UIContext, a: str, b: str, text: str | None, picked, k) -> str:
    """The results HTML of the Compare tab's text event."""
    return cmp.compare_text(ctx, cmp.Pair(a, b, k), text, picked)[0]


def compare_image(ctx: UIContext, a: str, b: str, image_id, upload, k) -> str:
    return cmp.compare_image(ctx, cmp.Pair(a, b, k), image_id, upload)[0]


def test_compare_dataset_caption_side_by_side(ctx, caption):
    html = compare_text(ctx, "bl", "ltd", caption.text, caption, 5)
    heads = re.findall(r'<div class="ltd-col-head ltd-m\d"><h3>([^<]+)</h3>', html)
    assert heads == ["bl", "ltd"]
    assert html.count('<section class="ltd-col">') == 2
    assert html.count("1st GT rank") == 2  # metrics per model
    out = ctx.service.compare(["bl", "ltd"], caption_id=caption.id, k=5)
    assert f"<b>{out.overlap}</b> of top-5 shared" in html
    # every card of a model that the other did not retrieve carries the ◆ marker
    assert html.count('class="ltd-only"') == 2 * 5 - 2 * out.overlap


def test_compare_dataset_image(ctx, caption):
    html = compare_image(ctx, "bl", "ltd", caption.image_id, None, 10)
    assert html.count('<section class="ltd-col">') == 2
    assert html.count('<li class="ltd-cap') == 20
    assert "ground-truth caption" in html


def test_compare_free_text_has_no_ground_truth(ctx):
    html = compare_text(ctx, "bl", "ltd", "two big shapes", None, 5)
    assert html.count("no ground truth for this query") == 2
    assert "ltd-card gt" not in html


def test_compare_messages(ctx, one):
    assert "Type a query" in compare_text(ctx, "bl", "ltd", " ", None, 10)
    assert "two different models" in compare_text(ctx, "bl", "bl", "a dog", None, 10)
    assert "Pick a dataset image" in compare_image(ctx, "bl", "ltd", None, None, 10)
    msg = compare_text(UIContext(one, CaptionService(one), THUMBS), "bl", "bl", "a dog", None, 10)
    assert "needs two models" in msg and "ltd serve" in msg


# ---- Explorer ----------------------------------------------------------------------------------
def test_explorer_sorted_by_disagreement(svc):
    table, rows, summary = ex.explorer(svc, ex.Queries("bl", "ltd"))
    assert len(table) == len(rows) > 0
    assert len(table[0]) == len(ex.explorer_headers("bl", "ltd"))
    dis = [r["disagreement"] for r in rows]
    assert dis == sorted(dis, reverse=True)
    assert "ranks the ground truth higher" in summary
    n = {w: sum(r["winner"] == w for r in rows) for w in ("a", "b", "tie")}
    assert f"for <b>{n['b']}</b>" in summary


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
def test_explorer_direction_filter(svc, direction):
    table, rows, _ = ex.explorer(svc, ex.Queries("bl", "ltd", direction=direction))
    assert rows and all(r["direction"] == direction for r in rows)
    assert all(t[0] == direction for t in table)


@pytest.mark.parametrize("winner, name", [("a", "bl"), ("b", "ltd"), ("tie", "tie")])
def test_explorer_winner_filter(svc, winner, name):
    table, rows, _ = ex.explorer(svc, ex.Queries("bl", "ltd", winner=winner))
    assert all(r["winner"] == winner for r in rows)
    assert all(t[9] == name for t in table)


def test_explorer_limit_and_thumbnails(svc):
    table, rows, summary = ex.explorer(svc, ex.Queries("bl", "ltd", direction="i2t", limit=2), thumbs=THUMBS)
    assert len(rows) == 2 and "showing 2" in summary
    assert all(t[2].startswith('<span class="ltd-xq"><img src="/api/images/') for t in table)


def test_explorer_click_maps_to_compare_query(svc):
    table, rows, _ = ex.explorer(svc, ex.Queries("bl", "ltd"))
    t2i = next(i for i, r in enumerate(rows) if r["direction"] == "t2i")
    i2t = next(i for i, r in enumerate(rows) if r["direction"] == "i2t")
    q = ex.explorer_pick(rows, [t2i, 2], None)
    assert q == {"direction": "t2i", "caption_id": rows[t2i]["query_id"], "text": rows[t2i]["query"]}
    assert svc.caption("bl", q["caption_id"]).text == q["text"]
    assert ex.explorer_pick(rows, i2t) == {"direction": "i2t", "image_id": rows[i2t]["query_id"]}
    # the clicked row's values win over its index (the browser may have re-sorted the table)
    assert ex.explorer_pick(rows, [0, 0], table[i2t]) == {"direction": "i2t", "image_id": rows[i2t]["query_id"]}
    with pytest.raises(SearchError):
        ex.explorer_pick(rows, len(rows) + 5)
    # and the compare it opens runs
    html = cmp.compare(svc, "bl", "ltd", {"caption_id": q["caption_id"]}, 10, THUMBS)
    assert html.count('<section class="ltd-col">') == 2


def test_explorer_with_one_model(one):
    table, rows, summary = ex.explorer(one, ex.Queries("bl", "bl"))
    assert table == [] and rows == [] and "needs two models" in summary


# ---- Training ----------------------------------------------------------------------------------
def write_metrics(path, eta=0.5):
    rows = [{"type": "val", "epoch": 0, "step": 0, "rsum": 100.0}]
    for s in range(1, 11):
        rows.append({"type": "step", "epoch": 1, "step": s, "l_con": 4.0 - 0.1 * s, "l_rec": 1.0 - 0.04 * s,
                     "lambda": 1.0 + 0.1 * s, "gap": 0.5, "lr": 1e-3})
    rows += [{"type": "epoch", "epoch": 1, "step": 10, "mean_loss": 3.0},
             {"type": "val", "epoch": 1, "step": 10, "rsum": 150.0}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return rows


def test_training_figure_from_metrics_rows(tmp_path):
    from training.plots import figure_from_rows, label_for, plt

    rows = write_metrics(tmp_path / "metrics.jsonl")
    label, eta = label_for("ltd", {"mode": "constraint", "eta": 0.5})
    assert (label, eta) == ("ltd (η=0.5)", 0.5)
    base = [r for r in rows if "lambda" not in r]
    fig = figure_from_rows([("bl", None, base), (label, eta, rows)], smooth=1)
    try:
        axes = fig.axes
        titles = [a.get_title() for a in axes]
        assert titles == ["Lagrange multiplier λ", "reconstruction loss L_rec (dashed: η)", "contrastive loss L_con",
                          "validation rsum (trained epochs)"]
        lam, rec, con, val = axes
        assert lam.get_yscale() == "log"
        assert [ln.get_label() for ln in lam.lines] == ["ltd (η=0.5)"]
        assert list(lam.lines[0].get_ydata()) == pytest.approx([1.0 + 0.1 * s for s in range(1, 11)])
        eta_lines = [ln for ln in rec.lines if ln.get_linestyle() == "--"]
        assert len(eta_lines) == 1 and list(eta_lines[0].get_ydata()) == [0.5, 0.5]
        assert len(con.lines) == 2  # both runs have L_con
        # the untrained epoch 0 is left out: it would flatten the differences between trained epochs
        assert list(val.lines[1].get_xdata()) == [1] and list(val.lines[1].get_ydata()) == [150.0]
    finally:
        plt.close(fig)


def test_plot_runs_still_works(tiny_index_pair, tmp_path, monkeypatch):
    from training.plots import plot_runs

    runs = tiny_index_pair["runs"]
    (path,) = plot_runs([runs["bl"], runs["ltd"]], tmp_path)
    assert path.is_file() and path.stat().st_size > 10_000 and path.name == "curves.png"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (path,) = plot_runs([runs["bl"], runs["ltd"]])  # several runs: not into either run's folder
    assert path.resolve().parent == elsewhere.resolve() and path.name == "curves_bl_vs_ltd.png"


def test_training_figure_for_loaded_models(svc):
    fig, msg = trn.training_figure(svc, ["bl", "ltd"])
    assert msg == ""
    lam, rec, con, val = fig.axes
    assert [ln.get_label() for ln in val.lines] == ["bl", "ltd (η=0.5)"]
    assert any(ln.get_linestyle() == "--" for ln in rec.lines)  # the η line of the LTD run
    fig2, msg2 = trn.training_figure(svc, [])
    assert fig2 is None and "Select at least one model" in msg2


def test_report_table(svc):
    headers, rows = trn.report_table(svc)
    assert headers[:2] == ["model", "loss"]
    for col in ("i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5", "t2i R@10", "rsum", "i2t R-P", "t2i R-P"):
        assert col in headers
    assert any("nDCG" in c for c in headers)
    assert [r[0] for r in rows] == ["bl", "ltd"]
    assert rows[0][1] == "baseline" and rows[1][1] == "LTDᴹ (η = 0.5)"  # MiniLM targets: the mark
    rsum = headers.index("rsum")
    for r in rows:
        assert r[rsum] == pytest.approx(svc.model_info(r[0]).eval["rsum"], abs=0.05)


# ---- models loading / one model / the Blocks app -----------------------------------------------
def test_not_ready_service_says_models_are_loading(loading):
    assert "loading" in render.header_html(loading)
    assert "ltd-loading" in render.loading_state(loading)
    html = srch.search_text(view(loading), "bl", "a dog", None, 10)
    assert "still loading" in html and "Traceback" not in html
    _, _, summary = ex.explorer(loading, ex.Queries("bl", "ltd"))
    assert "still loading" in summary


def test_header_lists_models_with_rsum(svc):
    html = render.header_html(svc)
    for name in ("bl", "ltd"):
        assert f'<span class="ltd-chip-name">{name}</span>' in html
        assert f"<b>{svc.model_info(name).eval['rsum']:.1f}</b> rsum" in html
    assert "η = 0.5" in html and "test split" in html
    # LTD's targets are MiniLM's (trained on Flickr30k/COCO captions): its chip carries the mark and says why
    assert svc.model_info("ltd").caption_corpora and not svc.model_info("bl").caption_corpora
    assert '<span class="ltd-chip-kind">LTDᴹ · η = 0.5</span>' in html and "Flickr30k/COCO" in html
    assert '<span class="ltd-chip-kind">baseline</span>' in html


def _dependency(blocks, api_name: str):
    cfg = blocks.get_config_file()
    dep = next(d for d in cfg["dependencies"] if d.get("api_name") == api_name)
    by_id = {c["id"]: c for c in cfg["components"]}
    elem = [by_id[i].get("props", {}).get("elem_id") for i in dep["inputs"]]
    out = [by_id[i].get("props", {}).get("elem_id") for i in dep["outputs"]]
    return dep, elem, out, blocks.fns[dep["id"]].fn


def test_build_ui_has_its_tabs_and_wires_each_event(limited, caption, upload_dir):
    """Each tab is there, and its main events take the inputs and fill the outputs they should: the
    function behind the Search button, called with the values the page would send, fills the
    search results; the Compare button's, the compare panel; the Explorer's row click opens Compare."""
    from ui.app import build_ui

    blocks = build_ui(limited, thumb_url=THUMBS)
    cfg = blocks.get_config_file()
    tabs = {c["props"].get("elem_id") for c in cfg["components"] if c["type"] == "tabitem"}
    assert tabs == {"tab-search", "tab-compare", "tab-explorer", "tab-caption", "tab-training"}
    box = next(c for c in cfg["components"] if c.get("props", {}).get("elem_id") == "search-text")
    assert box["props"]["max_length"] == 77  # the server's query limit reaches the UI
    ks = [c["props"]["choices"] for c in cfg["components"] if c.get("props", {}).get("label") == "Top k"]
    assert ks and all([v for _, v in k] == [5, 10, 20] for k in ks)  # and its max_k (20): no choice over it
    dep, ins, outs, fn = _dependency(blocks, "run_text")
    assert ins[1] == "search-text" and outs == ["search-text-results"]
    html = fn("bl", caption.text, caption, 5)
    assert html.count('<figure class="ltd-card') == 5 and "ltd-card gt" in html
    dep, ins, outs, fn = _dependency(blocks, "cmp_text")
    assert "compare-text" in ins and outs == ["compare-results", "compare-explain", "compare-share"]
    html, attr, state = fn("bl", "ltd", caption.text, caption, 5)
    assert html.count('<section class="ltd-col">') == 2 and "ltd-attr" in attr and f"cid={caption.id}" in state
    dep, ins, outs, fn = _dependency(blocks, "upload_image")
    assert fn("bl", "i2t", "/etc/passwd", 5, None)[1].count("only images uploaded through this page") == 1
    big = upload_dir / "big.png"
    big.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 2048)
    assert "exceeds the limit of 1,234 bytes" in fn("bl", "i2i", str(big), 5, None)[1]  # the upload limit, both ways
    dep, ins, outs, _ = _dependency(blocks, "open_in_compare")
    by_id = {c["id"]: c for c in cfg["components"]}
    assert [by_id[t].get("props", {}).get("elem_id") for t, _ in dep["targets"]] == ["explorer-table"]
    assert "compare-results" in outs and "ltd-tabs" in outs  # a click fills Compare and switches to it


def test_build_ui_with_one_model_or_while_loading(one, loading):
    import gradio as gr

    from ui.app import build_ui
    from ui.theme import CSS, THEME

    for s in (one, loading):
        cfg = build_ui(s).get_config_file()
        tabs = {c["props"].get("elem_id") for c in cfg["components"] if c["type"] == "tabitem"}
        assert tabs == {"tab-search", "tab-compare", "tab-explorer", "tab-caption", "tab-training"}
        assert any(d.get("api_name") == "run_text" for d in cfg["dependencies"])  # the events are wired
    loading_cfg = build_ui(loading).get_config_file()
    assert any(c["type"] == "timer" and c["props"].get("active") for c in loading_cfg["components"])  # polls until loaded
    assert "needs two models" in str(build_ui(one).get_config_file())
    assert THEME.name == gr.themes.Default().name and ".ltd-card.gt" in CSS


def test_mounted_ui_serves_the_page(svc):
    import gradio as gr
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from ui.app import build_ui
    from ui.theme import CSS, THEME

    app = gr.mount_gradio_app(FastAPI(), build_ui(svc, thumb_url=THUMBS), path="/ui", theme=THEME, css=CSS)
    with TestClient(app) as client:
        r = client.get("/ui/")
        assert r.status_code == 200 and "LTD retrieval" in r.text
        cfg = client.get("/ui/config").json()
        ids = {c.get("props", {}).get("elem_id") for c in cfg["components"]}
        assert {"search-text-results", "compare-results", "explorer-table", "training-plot"} <= ids
