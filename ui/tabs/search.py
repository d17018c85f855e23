"""The Search tab: text → images (a grid, ground truth outlined for dataset captions), image →
captions (a ranked list) and image → images ("more like this") for one model, each within the filter
bar's filter (ui/filterbar.py). Every image card has "more like this"; when the UI may write, photos
dropped on the "Add photos" panel are added to the model's index and a card's "remove" takes its
image out (ui/items.py)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import gradio as gr

from search import DatasetCaption, SearchError
from ui import filterbar, inputs, items, widgets
from ui.context import UIContext
from ui.render import (
    ACTIONS_JS,
    SLICE_METRICS,
    caption_list_html,
    image_grid_html,
    notice,
    query_html,
    result_html,
)

EMPTY_TEXT = ('<div class="ltd-empty">Type a caption and press Enter, or take a <b>⚄ random dataset caption</b> '
              '(or one of the examples): dataset captions come with ground truth, shown <b>✓ green</b> / <b>✗ red</b>.</div>')
EMPTY_IMAGE = ('<div class="ltd-empty">Click a dataset image, type its id, or upload a picture: '
               'the captions the model ranks highest appear here (or, for image → images, the images most like it: '
               '"more like this" on any card does the same).</div>')
DIRECTIONS = [("Text → images", "t2i"), ("Image → captions", "i2t"), ("Image → images", "i2i")]


@inputs.guarded
def search_text(ctx: UIContext, model: str, text: str | None, picked: DatasetCaption | None, k: Any,
                flt: dict | None = None) -> str:
    """Text → images within ``flt``: a grid of thumbnails (each with the context's card actions), ground
    truth outlined when the query is a dataset caption."""
    service, thumbs = ctx.service, ctx.thumbs
    res = service.search_text(model, k=inputs.parse_k(k), filter=flt, **inputs.text_query(text, picked))
    return result_html(query_html(service, model, res, thumbs), res, "t2i",
                       image_grid_html(res, thumbs, actions=ctx.card_actions),
                       note=SLICE_METRICS if flt is not None and res.metrics is not None else "")


@inputs.guarded
def search_image(ctx: UIContext, model: str, image_id: Any, upload_path: str | None, k: Any,
                 flt: dict | None = None) -> str:
    """Image → captions within ``flt``: a ranked list, ground-truth captions marked when the image is a
    dataset image."""
    service, thumbs = ctx.service, ctx.thumbs
    q = inputs.image_query(image_id, upload_path, service.config.max_upload_bytes)
    res = service.search_image(model, k=inputs.parse_k(k), filter=flt, **q)
    return result_html(query_html(service, model, res, thumbs, q.get("image_bytes")), res, "i2t",
                       caption_list_html(res, thumbs), note=SLICE_METRICS if flt is not None and res.metrics is not None else "")


@inputs.guarded
def search_similar(ctx: UIContext, model: str, image_id: Any, upload_path: str | None, k: Any,
                   flt: dict | None = None) -> str:
    """Image → images within ``flt``, "more like this": a served image (it ranks first) or an upload; each
    card with the context's card actions."""
    service, thumbs = ctx.service, ctx.thumbs
    q = inputs.image_query(image_id, upload_path, service.config.max_upload_bytes)
    res = service.similar_images(model, k=inputs.parse_k(k), filter=flt, **q)
    return result_html(query_html(service, model, res, thumbs, q.get("image_bytes")), res, "i2i",
                       image_grid_html(res, thumbs, actions=ctx.card_actions))


@dataclass
class SearchTab:
    """What the page's load event fills (examples and the image picker), and what "more like this" sets."""

    model: gr.Dropdown
    k: gr.Dropdown
    direction: gr.Radio
    text_panel: gr.Column
    img_panel: gr.Row
    img_id: gr.Textbox
    upload: gr.Image
    text_out: gr.HTML
    img_out: gr.HTML
    examples: gr.Dataset
    examples_state: gr.State
    gallery: gr.Gallery
    gallery_ids: gr.State
    add_out: gr.HTML | None = None  # the "Add photos" answer (None when the UI may not write)

    def similar_targets(self, tabs: gr.Tabs) -> list:
        """Every component ``opened_similar`` sets."""
        return [tabs, self.model, self.direction, self.text_panel, self.img_panel, self.img_id, self.upload, self.img_out]


def opened_similar(ctx: UIContext, t: SearchTab, tabs: gr.Tabs, data: Any, k: Any, flt: dict | None) -> dict:
    """Updates that show "more like this" of a card's image (``data``: the browser's {"iid", "model"}) in
    the Search tab, image → images, within the filter."""
    try:
        model, iid = items.card_target(ctx, data)
    except SearchError as e:
        return {t.img_out: notice(e.detail, "error")}
    html = search_similar(ctx, model, iid, None, k, flt)
    return {tabs: gr.Tabs(selected="search"), t.model: model, t.direction: "i2i", t.text_panel: gr.Column(visible=False),
            t.img_panel: gr.Row(visible=True), t.img_id: str(iid), t.upload: None, t.img_out: html}


def _add_panel(ctx: UIContext):
    """The "Add photos" panel: (files, metadata box, answer) when the UI may write, else (None, None, None)."""
    with gr.Accordion("+ Add photos to the index", open=ctx.writes, elem_id="search-add"):
        if not ctx.writes:
            gr.HTML(notice(items.WRITES_OFF, "info"))
            return None, None, None
        with gr.Row(equal_height=False):
            files = gr.File(label="Photos: added at once", file_count="multiple", file_types=["image"],
                            type="filepath", height=130, scale=3, elem_id="add-files")
            md = gr.Textbox(label="Metadata of the photos (a JSON object, optional)", placeholder='{"album": "2025"}',
                            lines=3, max_length=items.MAX_METADATA_CHARS, scale=2, elem_id="add-metadata")
        out = gr.HTML("", elem_id="add-results", js_on_load=ACTIONS_JS)
    return files, md, out


def build(ctx: UIContext, bar: filterbar.FilterBar, tabs: gr.Tabs) -> SearchTab:
    names = ctx.names
    with gr.Tab("Search", id="search", elem_id="tab-search"):
        with gr.Row(elem_classes="ltd-controls"):
            model = gr.Dropdown(names, value=names[0], label="Model", scale=2, min_width=140)
            k = gr.Dropdown(ctx.k_choices, value=ctx.k_default, label="Top k", scale=1, min_width=90)
            direction = gr.Radio(DIRECTIONS, value="t2i", label="Search direction", scale=4, elem_id="search-direction")
        add_files, add_md, add_out = _add_panel(ctx)
        picked, examples_state, gallery_ids = gr.State(None), gr.State([]), gr.State([])
        with gr.Column(visible=True) as text_panel:
            text, go, rand, examples = widgets.caption_row("search", "Search", "type a caption and press Enter",
                                                           ctx.limits.max_query_chars)
            text_out = gr.HTML(EMPTY_TEXT, elem_id="search-text-results", js_on_load=ACTIONS_JS)
        with gr.Row(visible=False) as img_panel:
            with gr.Column(scale=2, min_width=280):
                img_id, img_go = widgets.image_id_row("search", "Search")
                gallery = gr.Gallery(label="…or click a dataset image", columns=4, height=300, allow_preview=False,
                                     object_fit="cover", elem_classes="ltd-picker", elem_id="search-gallery")
                shuffle_btn = gr.Button("↻ Show other images", size="sm")
                upload = widgets.upload_box(160)
            with gr.Column(scale=5):
                img_out = gr.HTML(EMPTY_IMAGE, elem_id="search-image-results", js_on_load=ACTIONS_JS)
    t = SearchTab(model, k, direction, text_panel, img_panel, img_id, upload, text_out, img_out, examples,
                  examples_state, gallery, gallery_ids, add_out)
    _wire_text(ctx, t, bar, text, picked, go, rand)
    _wire_image(ctx, t, bar, img_go, shuffle_btn)
    _wire_cards(ctx, t, bar, tabs, text, picked)
    if add_files is not None:
        def add(model, files, md, chips, flt):
            return None, items.add_photos(ctx, model, files, md), *filterbar.filled(ctx, chips, flt)

        add_files.upload(add, [model, add_files, add_md, bar.chips, bar.state], [add_files, add_out, *bar.fill_targets])
    direction.change(lambda d: (gr.Column(visible=d == "t2i"), gr.Row(visible=d != "t2i")), direction,
                     [text_panel, img_panel])
    return t


def _wire_text(ctx: UIContext, t: SearchTab, bar: filterbar.FilterBar, text, picked, go, rand) -> None:
    svc = ctx.service
    out, flt = t.text_out, bar.state

    def run_text(model, text, picked, k, flt=None):
        return search_text(ctx, model, text, picked, k, flt)

    def rand_text(model, k, current, flt):
        try:
            c = inputs.random_caption(svc, model, exclude=current)
        except SearchError as e:
            return gr.skip(), gr.skip(), notice(e.detail, "error")
        return c.text, c, search_text(ctx, model, c.text, c, k, flt)

    def example_text(idx, examples, model, k, flt):
        if idx is None or not 0 <= idx < len(examples):
            return gr.skip(), gr.skip(), gr.skip()
        c = examples[idx]
        return c.text, c, search_text(ctx, model, c.text, c, k, flt)

    def rerun_text(model, text, picked, k, flt):
        return run_text(model, text, picked, k, flt) if (text or "").strip() else gr.skip()

    args = [t.model, text, picked, t.k, flt]
    go.click(run_text, args, out)
    text.submit(run_text, args, out)
    rand.click(rand_text, [t.model, t.k, picked, flt], [text, picked, out])
    t.examples.click(example_text, [t.examples, t.examples_state, t.model, t.k, flt], [text, picked, out])
    for comp in (t.model, t.k, flt):
        comp.change(rerun_text, args, out)


def _wire_image(ctx: UIContext, t: SearchTab, bar: filterbar.FilterBar, img_go, shuffle_btn) -> None:
    svc = ctx.service
    out, flt = t.img_out, bar.state

    def run_image(model, direction, image_id, upload, k, flt):
        if direction == "i2i":
            return search_similar(ctx, model, image_id, upload, k, flt)
        return search_image(ctx, model, image_id, upload, k, flt)

    def pick_image(ids, model, direction, k, flt, evt: gr.SelectData):
        if evt.index is None or not 0 <= evt.index < len(ids):
            return gr.skip(), gr.skip(), gr.skip()
        return ids[evt.index], None, run_image(model, direction, ids[evt.index], None, k, flt)

    def upload_image(model, direction, upload, k, flt):
        if not upload:
            return gr.skip(), gr.skip()
        return None, run_image(model, direction, None, upload, k, flt)

    def shuffle(model):
        return inputs.image_picker(svc, model, seed=random.randrange(1 << 30))

    def rerun_image(model, direction, image_id, upload, k, flt):
        if direction == "t2i" or not (upload or (image_id or "").strip()):
            return gr.skip()
        return run_image(model, direction, image_id, upload, k, flt)

    args = [t.model, t.direction, t.img_id, t.upload, t.k, flt]
    img_go.click(run_image, args, out)
    t.img_id.submit(lambda m, d, i, k, f: (None, run_image(m, d, i, None, k, f)),
                    [t.model, t.direction, t.img_id, t.k, flt], [t.upload, out])
    t.gallery.select(pick_image, [t.gallery_ids, t.model, t.direction, t.k, flt], [t.img_id, t.upload, out])
    t.upload.upload(upload_image, [t.model, t.direction, t.upload, t.k, flt], [t.img_id, out])
    shuffle_btn.click(shuffle, t.model, [t.gallery, t.gallery_ids])
    for comp in (t.model, t.k, flt):
        comp.change(rerun_image, args, out)
    t.direction.input(rerun_image, args, out)


def _wire_cards(ctx: UIContext, t: SearchTab, bar: filterbar.FilterBar, tabs: gr.Tabs, text, picked) -> None:
    """The cards' buttons: "more like this" (every result grid of this tab) and "remove" (when the UI
    may write: the item goes, the ranking is shown again without it, the chips are refreshed)."""
    def similar(k, flt, evt: gr.EventData):
        return opened_similar(ctx, t, tabs, getattr(evt, "_data", None), k, flt)

    def removed_text(model, text, picked, k, flt, chips, evt: gr.EventData):
        done = items.remove_item(ctx, getattr(evt, "_data", None))
        again = search_text(ctx, model, text, picked, k, flt) if (text or "").strip() else ""
        return done + again, *filterbar.filled(ctx, chips, flt)

    def removed_image(model, direction, image_id, k, flt, chips, evt: gr.EventData):
        data = getattr(evt, "_data", None)
        done = items.remove_item(ctx, data)
        gone = str(data.get("iid")) if isinstance(data, dict) else ""
        again = ""
        if (image_id or "").strip() and str(image_id).strip() != gone:  # the query itself is gone: nothing to show
            again = search_similar(ctx, model, image_id, None, k, flt) if direction == "i2i" else \
                search_image(ctx, model, image_id, None, k, flt)
        return done + again, *filterbar.filled(ctx, chips, flt)

    for out in (t.text_out, t.img_out, *([t.add_out] if t.add_out is not None else [])):
        out.similar(similar, [t.k, bar.state], t.similar_targets(tabs))
    if ctx.writes:
        t.text_out.unindex(removed_text, [t.model, text, picked, t.k, bar.state, bar.chips],
                           [t.text_out, *bar.fill_targets])
        t.img_out.unindex(removed_image, [t.model, t.direction, t.img_id, t.k, bar.state, bar.chips],
                          [t.img_out, *bar.fill_targets])
