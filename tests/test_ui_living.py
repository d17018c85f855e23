"""Issue 55's UI, in process (no browser): photos added and items removed from the page through the same
writes as the REST routes, "more like this" on every image card, filter chips built from the models'
metadata and applied to every tab, and shared links that pin the index state they were made on.

Each module serves its own writable copies of the tiny pair (writes never touch the shared fixture).
"""
from __future__ import annotations

import io
import json
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import pair_settings
from PIL import Image

from app.api.routers.deps import thumbnail_url
from indexer import image_roots
from indexer.index import read_manifest
from search import BadRequest, CaptionService
from ui import filterbar, filters, items, share
from ui.context import UIContext
from ui.tabs import compare as cmp
from ui.tabs import explorer as ex
from ui.tabs import search as srch

HOSTILE = '<img src=x onerror=alert(1)>"\'&'


def THUMBS(image_id: int, model: str | None, size: int) -> str:
    return thumbnail_url(image_id, model or "", size)


def view(service) -> UIContext:
    """A read-only page context over ``service`` (cards offer "more like this" only)."""
    return UIContext(service, CaptionService(service), THUMBS)


def png(seed: int, size: int = 64) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def copies(tiny_index_pair, tmp_path_factory) -> dict[str, str]:
    """Writable copies of the tiny pair: {name: index dir}."""
    root = tmp_path_factory.mktemp("ui_living")
    models = {}
    for name in ("bl", "ltd"):
        index = shutil.copytree(tiny_index_pair[name], root / name)
        image_roots.record(index, read_manifest(index)["image_roots"])  # as `ltd index` would have
        models[name] = str(index)
    return models


@pytest.fixture(scope="module")
def svc(tiny_index_pair, copies):
    s = pair_settings(tiny_index_pair, models=copies, writable=True, max_items_per_add=3).search_service()
    s.registry.load()
    yield s
    s.close()


@pytest.fixture(scope="module")
def ctx(svc) -> UIContext:
    return UIContext(svc, CaptionService(svc), THUMBS, writes=True)


@pytest.fixture
def upload_dir():
    """A folder inside Gradio's upload folder, where the browser's uploads land."""
    from gradio.utils import get_upload_folder

    d = Path(get_upload_folder()) / f"ltd-test-{uuid.uuid4().hex}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def dropped(upload_dir: Path, seeds: list[int], name: str = "p{}.png") -> list[str]:
    paths = []
    for s in seeds:
        p = upload_dir / name.format(s)
        p.write_bytes(png(s))
        paths.append(str(p))
    return paths


def ids_in(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<figure class="ltd-card[^"]*"[^>]*data-image-id="(\d+)"', html)]


def album(svc, model: str, value: str) -> list[int]:
    return [it["id"] for it in svc.writes.list(model, filter={"field": "album", "eq": value})["items"]]


# ---- adding and removing from the page -------------------------------------------------------------
def test_dropped_photos_are_added_with_their_metadata_and_found_at_once(ctx, svc, upload_dir):
    html = items.add_photos(ctx, "ltd", dropped(upload_dir, [1, 2]), '{"album": "drop-1"}')
    added = album(svc, "ltd", "drop-1")
    assert "Added 2 photos to model ltd" in html and len(added) == 2 and ids_in(html) == added
    assert html.count('data-act="similar"') == 2  # each new card has "more like this"
    again = items.add_photos(ctx, "ltd", dropped(upload_dir, [1]), '{"album": "drop-1"}')
    assert "Added 0 photos" in again and "1 was already there" in again and ids_in(again) == added[:1]
    for i in added:  # read-your-writes: each is its own top image → image hit
        assert ids_in(srch.search_similar(view(svc), "ltd", i, None, 3))[0] == i


@pytest.mark.parametrize("case, message", [
    ("not an image", "not an image of an accepted type"), ("too many", "at most 3 photos"), ("outside", "uploaded through this page"),
    ("bad metadata", "metadata must be a JSON object"), ("bad field", "is not a field name"), ("none", "Drop one or more photos"),
])
def test_bad_adds_are_messages_and_add_nothing(ctx, svc, upload_dir, case, message):
    before = svc.writes.list("ltd", limit=1000)["total"]
    bad = upload_dir / "x.png"
    bad.write_bytes(b"this is not a PNG" * 20)
    paths, md = dropped(upload_dir, [50]), ""
    if case == "not an image":
        paths = [str(bad)]
    elif case == "too many":
        paths = dropped(upload_dir, [51, 52, 53, 54])
    elif case == "outside":
        paths = [str(svc.image_path(int(svc.registry.get("ltd").index.images.ids[0]), "ltd")), "/etc/passwd"]
    elif case == "bad metadata":
        md = "[1, 2]"
    elif case == "bad field":
        md = json.dumps({"bad name!": 1})
    elif case == "none":
        paths = []
    html = items.add_photos(ctx, "ltd", paths, md)
    assert "ltd-error" in html and message in html and "Traceback" not in html, html
    assert svc.writes.list("ltd", limit=1000)["total"] == before


def test_writes_off_the_page_changes_nothing(svc, upload_dir, caption_id):
    off = UIContext(svc, CaptionService(svc), THUMBS, writes=False)
    before = svc.writes.list("ltd", limit=1000)["total"]
    assert "ltd serve --writable" in items.add_photos(off, "ltd", dropped(upload_dir, [60]), "")
    iid = svc.caption("ltd", caption_id).image_id
    assert "ltd serve --writable" in items.remove_item(off, {"iid": str(iid), "model": "ltd"})
    assert svc.writes.list("ltd", limit=1000)["total"] == before
    assert off.card_actions == ("similar",)
    assert 'data-act="remove"' not in srch.search_text(off, "ltd", "a shape", None, 5)


@pytest.fixture(scope="module")
def caption_id(svc) -> int:
    return svc.sample_captions("ltd", 1, seed=5)[0].id


def test_remove_from_a_card_takes_the_item_out_of_every_answer(ctx, svc, upload_dir):
    items.add_photos(ctx, "ltd", dropped(upload_dir, [70]), '{"album": "to-remove"}')
    (iid,) = album(svc, "ltd", "to-remove")
    html = srch.search_similar(ctx, "ltd", iid, None, 5)
    assert f'data-act="remove" data-iid="{iid}" data-model="ltd"' in html
    for bad in ({"iid": "abc", "model": "ltd"}, {"iid": str(iid), "model": "nope"}, [iid], None, {"iid": "-1", "model": "ltd"}):
        assert "ltd-error" in items.remove_item(ctx, bad), bad
    assert album(svc, "ltd", "to-remove") == [iid]  # none of those removed anything
    assert "Removed image" in items.remove_item(ctx, {"iid": str(iid), "model": "ltd"})
    assert album(svc, "ltd", "to-remove") == []
    assert iid not in ids_in(srch.search_text(view(svc), "ltd", "a photo", None, 200))
    assert "not in" in items.remove_item(ctx, {"iid": str(iid), "model": "ltd"})  # twice: a message
    names = {f.name: f for f in svc.metadata_fields("ltd")}
    assert "to-remove" not in dict(names["album"].strings)  # a removed item's values are never offered


# ---- "more like this" ------------------------------------------------------------------------------
def test_more_like_this_on_every_image_card(ctx, svc, caption_id):
    c = svc.caption("ltd", caption_id)
    t2i = srch.search_text(ctx, "ltd", c.text, c, 5)
    cards = ids_in(t2i)
    assert len(cards) == 5 and t2i.count('data-act="similar"') == 5 and t2i.count('data-act="remove"') == 5
    first = cards[0]
    i2i = srch.search_similar(view(svc), "ltd", first, None, 4)
    assert ids_in(i2i)[0] == first and len(ids_in(i2i)) == 4  # the image itself ranks first
    both = cmp.compare(svc, "bl", "ltd", {"caption_id": caption_id}, 5, THUMBS)
    assert both.count('data-act="similar"') == 10 and 'data-act="remove"' not in both  # Compare: look, not write
    assert 'data-model="bl"' in both and 'data-model="ltd"' in both


# ---- filters ----------------------------------------------------------------------------------------
def test_chips_and_ranges_come_from_the_metadata_and_build_filters():
    fields = [filters.FieldValues("split", 6, (("test", 6),)), filters.FieldValues("ok", 2, bools=((True, 2),)),
              filters.FieldValues("exif_date", 3, (("2024-05-01", 2), ("2023-01-02", 1)), dates=("2023-01-02", "2024-05-01")),
              filters.FieldValues("width", 6, numbers=(64.0, 512.0))]
    chips = filters.chip_choices(fields)
    assert chips == [("split: test · 6", '["split", "test"]'), ("ok: true · 2", '["ok", true]')]  # no chip per date
    assert [v for _, v in filters.range_choices(fields)] == ["", "exif_date", "width"]
    flt = filters.build_filter(['["split", "test"]', '["album", "a"]', '["album", "b"]'], "exif_date", "2024-01-01",
                               "2024-05-01", " red  car ")
    assert flt == {"and": [{"field": "split", "eq": "test"}, {"field": "album", "in": ["a", "b"]},
                           {"field": "exif_date", "gte": "2024-01-01", "lt": "2024-05-02"},  # "to" includes its day
                           {"text": "red car"}]}
    assert filters.bar_values(flt) == (['["split", "test"]', '["album", "a"]', '["album", "b"]'], "exif_date",
                                       "2024-01-01", "2024-05-01", "red car")
    assert filters.build_filter([], "width", "100", "", "") == {"field": "width", "gte": 100}
    assert filters.build_filter(None, "", "", "", "") is None
    assert filters.describe(flt) == 'split = test · album in {a, b} · exif_date 2024-01-01 to 2024-05-01 · words "red car"'
    for bad in (["split"], ['{"a": 1}'], ['["x", 1]'], ["[" * 5000], [7], ['["bad name!", "v"]']):
        with pytest.raises(BadRequest):
            filters.build_filter(bad)
    with pytest.raises(BadRequest, match="numbers or dates"):
        filters.build_filter([], "width", "ten", "", "")
    with pytest.raises(BadRequest):
        filters.build_filter([], "width", "", "", "!!!")  # words with no word in them
    assert filters.bar_values({"or": [{"field": "a", "eq": 1}]}) is None  # not a filter the bar builds
    assert filters.chip_choices([], keep=['["album", "gone"]', "junk"]) == [("album: gone · 0", '["album", "gone"]')]


def test_the_filter_restricts_every_tab(ctx, svc, upload_dir, caption_id):
    for model in ("bl", "ltd"):
        items.add_photos(ctx, model, dropped(upload_dir, [80, 81]), '{"album": "slice"}')
    flt = filters.build_filter(['["album", "slice"]'])
    fields = {f.name: f for f in svc.metadata_fields("ltd")}
    assert dict(fields["album"].strings)["slice"] == 2 and fields["split"].strings  # what the chips offer
    html = srch.search_text(view(svc), "ltd", "a red square", None, 10, flt)
    assert sorted(ids_in(html)) == sorted(album(svc, "ltd", "slice"))  # k = 10, two match: both, only them
    assert sorted(ids_in(srch.search_similar(view(svc), "ltd", album(svc, "ltd", "slice")[0], None, 10, flt))) == \
        sorted(album(svc, "ltd", "slice"))
    both = cmp.compare(svc, "bl", "ltd", {"query": "a red square"}, 10, THUMBS, flt)
    assert set(ids_in(both)) == set(album(svc, "bl", "slice")) | set(album(svc, "ltd", "slice"))
    _, _, state = cmp.compare_view(svc, cmp.Pair("bl", "ltd", 5, flt), {"caption_id": caption_id}, THUMBS)
    assert share.read(state, ["bl", "ltd"], [5, 10]).f == flt  # the link carries the filter
    c, split = svc.caption("ltd", caption_id), filters.build_filter(['["split", "test"]'])
    assert "metrics: within the filter" in srch.search_text(view(svc), "ltd", c.text, c, 5, split)  # said so
    assert "within the filter" not in srch.search_text(view(svc), "ltd", c.text, c, 5)
    status = filterbar.status_html(ctx, flt)
    assert "album = slice" in status and "<b>2</b> of" in status
    # the Explorer on one slice: only the queries of the images the filter keeps, and who wins there
    e = svc.registry.get("bl")
    some = [int(i) for i in e.index.images.ids[:2]]
    one_slice = {"field": "image_id", "in": some}
    _, rows, summary = ex.explorer(svc, ex.Queries("bl", "ltd", flt=one_slice))
    _, every, _ = ex.explorer(svc, ex.Queries("bl", "ltd"))
    img_rows = {e.image_pos[i] for i in some}
    want = [r for r in every if (r["query_index"] in img_rows if r["direction"] == "i2t"
                                 else e.caption_image[r["query_index"]] in img_rows)]
    assert rows == want and 0 < len(rows) < len(every)
    wins = {w: sum(r["winner"] == w for r in rows) for w in ("a", "b", "tie")}
    assert f"for <b>{wins['b']}</b>" in summary and f"of {len(rows)} queries in the slice" in summary
    _, none, summary = ex.explorer(svc, ex.Queries("bl", "ltd", flt={"field": "album", "eq": "no such album"}))
    assert none == [] and "keeps no query" in summary
    _, rows, summary = ex.explorer(svc, ex.Queries("ltd", "bl"))  # a pair first asked for after the writes: the shared items
    assert rows and "ltd-error" not in summary


def test_hostile_metadata_is_escaped_in_chips_status_and_cards(ctx, svc, upload_dir):
    md = json.dumps({"album": HOSTILE, "note": HOSTILE})
    html = items.add_photos(ctx, "ltd", dropped(upload_dir, [90], name=HOSTILE.replace("/", "") + "{}.png"), md)
    assert "Added 1 photo" in html and "<img src=x" not in html and "&lt;img src=x" in html
    flt = filters.build_filter([filters.chip_value("album", HOSTILE)], "", "", "", "")
    assert album(svc, "ltd", HOSTILE)
    for out in (filterbar.status_html(ctx, flt), srch.search_text(view(svc), "ltd", "a photo", None, 5, flt),
                srch.search_similar(ctx, "ltd", album(svc, "ltd", HOSTILE)[0], None, 5, flt)):
        assert "<img src=x" not in out and "onerror=alert" not in out.replace("onerror=alert(1)&gt;", ""), out
    label = dict((v, lb) for lb, v in filters.chip_choices(svc.metadata_fields("ltd")))[filters.chip_value("album", HOSTILE)]
    assert HOSTILE in label  # a dropdown label is text (Gradio renders it as such), never HTML
    assert "&lt;img" in items.added_html(ctx, HOSTILE, [{"id": 1, "added": True}], [HOSTILE])


# ---- shared links pin the index state ---------------------------------------------------------------
def test_a_link_pins_the_index_state_and_says_when_it_changed(ctx, svc, upload_dir, caption_id):
    _, _, state = cmp.compare_view(svc, cmp.Pair("bl", "ltd", 5), {"caption_id": caption_id}, THUMBS)
    read = share.read(state, ["bl", "ltd"], [5, 10])
    assert read.ga == share.pin(svc, "bl") and read.gb == share.pin(svc, "ltd") and read.ga.count(".") == 1
    assert share.pin_note(svc, read, "bl", "ltd") == ""  # nothing changed since
    items.add_photos(ctx, "ltd", dropped(upload_dir, [95]), "")
    note = share.pin_note(svc, read, "bl", "ltd")
    assert "ltd-warn" in note and "ltd: generation" in note and "items added, removed or edited" in note
    assert "bl:" not in note
    g, w = read.gb.split(".")
    moved = share.read(state.replace(f"gb={g}.{w}", f"gb={int(g) + 7}.{w}"), ["bl", "ltd"], [5, 10])
    assert "compacted or rebuilt" in share.pin_note(svc, moved, "bl", "ltd")
    for bad in ("ga=1.2.3", "ga=abc", "ga=" + "9" * 40 + ".1", "f=%7Bnot json", "f=" + "%5B" * 3000):
        hostile = share.read(bad, ["bl", "ltd"], [5, 10])
        assert hostile.ga is None and hostile.f is None, bad
    assert share.read("f=" + json.dumps({"or": [{"field": "a", "eq": 1}]}), ["bl"], [5]).f is None  # not the bar's


def test_the_page_wires_writes_only_when_it_may(svc):
    from ui.app import build_ui

    def api_names(blocks) -> set[str]:
        return {d.get("api_name") for d in blocks.get_config_file()["dependencies"]}

    on = build_ui(svc, thumb_url=THUMBS, writes=True)
    off = build_ui(svc, thumb_url=THUMBS, writes=False)
    assert {"add", "removed_text", "removed_image", "similar", "similar_from_compare", "apply"} <= api_names(on)
    assert not {"add", "removed_text", "removed_image"} & api_names(off) and "similar" in api_names(off)
    ids = {c.get("props", {}).get("elem_id") for c in on.get_config_file()["components"]}
    assert {"add-files", "filter-chips", "filter-status", "filter-range-field"} <= ids
    assert "add-files" not in {c.get("props", {}).get("elem_id") for c in off.get_config_file()["components"]}


def test_the_guard_passes_the_pages_writes_and_only_when_it_may(tiny_index_pair, copies, no_outside_network):
    """Through the mounted app: a writable server's page takes an add's worth of files per upload and its add
    event reads only uploads; with a write token (REST writes need it; the page has none) the page has no
    write event at all and still takes only a search's few files."""
    from fastapi.testclient import TestClient
    from test_ui_guard import _call

    from app.api.main import create_app

    files = [("files", (f"{k}.png", png(k))) for k in range(5)]
    settings = pair_settings(tiny_index_pair, models=copies, writable=True, ui=True, max_items_per_add=5, watch_seconds=0)
    with TestClient(create_app(settings)) as c:
        up = c.post("/ui/gradio_api/upload", files=files)
        assert up.status_code == 200 and len(up.json()) == 5
        six = [("files", (f"{k}.png", png(100 + k))) for k in range(6)]  # other bytes: Gradio names files by content
        assert c.post("/ui/gradio_api/upload", files=six).status_code == 413
        cfg = c.get("/ui/config").json()
        dep = next(d for d in cfg["dependencies"] if d.get("api_name") == "add")
        n = len(dep["inputs"])
        secret = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}
        assert _call(c, "add", ["bl", [secret], "", None, None][:n])[0] == 400  # forbidden_file, before Gradio
        before = c.get("/api/models/bl/items", params={"limit": 1}).json()["total"]
        mine = [{"path": p, "meta": {"_type": "gradio.FileData"}} for p in up.json()[:2]]
        status, text = _call(c, "add", ["bl", mine, '{"album": "via-guard"}', None, None][:n])
        assert status == 200 and "Added 2 photos" in text, text[:300]
        assert c.get("/api/models/bl/items", params={"limit": 1}).json()["total"] == before + 2
    token = pair_settings(tiny_index_pair, models=copies, writable=True, ui=True, write_token="w" * 32, watch_seconds=0)
    with TestClient(create_app(token)) as c:
        names = {d.get("api_name") for d in c.get("/ui/config").json()["dependencies"]}
        assert not {"add", "removed_text", "removed_image"} & names and "similar" in names
        assert _call(c, "add", ["bl", [], ""])[0] == 404 and _call(c, "removed_text", [None] * 6)[0] == 404
        assert c.post("/ui/gradio_api/upload", files=files).status_code == 413  # a search's few files only


def test_more_like_this_from_a_compare_card_opens_the_search_tab(svc, caption_id):
    import gradio as gr

    from ui.app import build_ui

    blocks = build_ui(svc, thumb_url=THUMBS, writes=True)
    dep = next(d for d in blocks.get_config_file()["dependencies"] if d.get("api_name") == "similar_from_compare")
    fn = blocks.fns[dep["id"]].fn
    iid = svc.caption("ltd", caption_id).image_id
    out = {getattr(c, "elem_id", None): v for c, v in fn(5, None, gr.EventData(None, {"iid": str(iid), "model": "ltd"})).items()}
    assert out["search-image-results"].count('<figure class="ltd-card') == 5
    assert ids_in(out["search-image-results"])[0] == iid and out["search-direction"] == "i2i"
    for bad in ({"iid": str(iid), "model": "<b>x</b>"}, {"iid": "1e9x", "model": "ltd"}, "junk", None):
        shown = {getattr(c, "elem_id", None): v for c, v in fn(5, None, gr.EventData(None, bad)).items()}
        assert list(shown) == ["search-image-results"] and "ltd-error" in shown["search-image-results"], bad
        assert "<b>x</b>" not in shown["search-image-results"]


def test_the_header_counts_what_is_served_now(ctx, svc, upload_dir):
    from ui.render import header_html

    e = svc.registry.get("bl")
    live = len(e.index.images.meta["ids"]) - int(e.index.images.index.dead.sum())
    assert f"{live:,} images" in header_html(svc)  # bl is the first model: its counts head the page
    items.add_photos(ctx, "bl", dropped(upload_dir, [110]), "")
    assert f"{live + 1:,} images" in header_html(svc)
