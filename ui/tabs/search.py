"""The Search tab: text → images (a grid, ground truth outlined for dataset captions) and image →
captions (a ranked list) for one model."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import gradio as gr

from search import DatasetCaption, SearchError, SearchService
from ui import inputs, widgets
from ui.context import UIContext, UILimits
from ui.render import (
    ThumbSrc,
    caption_list_html,
    image_grid_html,
    notice,
    query_html,
    result_html,
)

EMPTY_TEXT = ('<div class="ltd-empty">Type a caption and press Enter, or take a <b>⚄ random dataset caption</b> '
              '(or one of the examples): dataset captions come with ground truth, shown <b>✓ green</b> / <b>✗ red</b>.</div>')
EMPTY_IMAGE = ('<div class="ltd-empty">Click a dataset image, type its id, or upload a picture: '
               'the captions the model ranks highest appear here.</div>')


@inputs.guarded
def search_text(service: SearchService, model: str, text: str | None, picked: DatasetCaption | None, k: Any,
                thumbs: ThumbSrc) -> str:
    """Text → images: a grid of thumbnails, ground truth outlined when the query is a dataset caption."""
    res = service.search_text(model, k=inputs.parse_k(k), **inputs.text_query(text, picked))
    return result_html(query_html(service, model, res, thumbs), res, "t2i", image_grid_html(res, thumbs))


@inputs.guarded
def search_image(service: SearchService, model: str, image_id: Any, upload_path: str | None, k: Any,
                 thumbs: ThumbSrc, max_bytes: int = UILimits.max_upload_bytes) -> str:
    """Image → captions: a ranked list, ground-truth captions marked when the image is a dataset image."""
    q = inputs.image_query(image_id, upload_path, max_bytes)
    res = service.search_image(model, k=inputs.parse_k(k), **q)
    return result_html(query_html(service, model, res, thumbs, q.get("image_bytes")), res, "i2t",
                       caption_list_html(res, thumbs))


@dataclass
class SearchTab:
    """The components the page's load event fills (examples and the image picker)."""

    model: gr.Dropdown
    examples: gr.Dataset
    examples_state: gr.State
    gallery: gr.Gallery
    gallery_ids: gr.State


def build(ctx: UIContext) -> SearchTab:
    names = ctx.names
    with gr.Tab("Search", id="search", elem_id="tab-search"):
        with gr.Row(elem_classes="ltd-controls"):
            model = gr.Dropdown(names, value=names[0], label="Model", scale=2, min_width=140)
            k = gr.Dropdown(inputs.K_CHOICES, value=10, label="Top k", scale=1, min_width=90)
            direction = gr.Radio([("Text → images", "t2i"), ("Image → captions", "i2t")], value="t2i",
                                 label="Search direction", scale=3, elem_id="search-direction")
        picked, examples_state, gallery_ids = gr.State(None), gr.State([]), gr.State([])
        with gr.Column(visible=True) as text_panel:
            text, go, rand, examples = widgets.caption_row("search", "Search", "type a caption and press Enter",
                                                           ctx.limits.max_query_chars)
            text_out = gr.HTML(EMPTY_TEXT, elem_id="search-text-results")
        with gr.Row(visible=False) as img_panel:
            with gr.Column(scale=2, min_width=280):
                img_id, img_go = widgets.image_id_row("search", "Search")
                gallery = gr.Gallery(label="…or click a dataset image", columns=4, height=300, allow_preview=False,
                                     object_fit="cover", elem_classes="ltd-picker", elem_id="search-gallery")
                shuffle_btn = gr.Button("↻ Show other images", size="sm")
                upload = widgets.upload_box(160)
            with gr.Column(scale=5):
                img_out = gr.HTML(EMPTY_IMAGE, elem_id="search-image-results")
    _wire_text(ctx, model, k, text, picked, go, rand, examples, examples_state, text_out)
    _wire_image(ctx, model, k, img_id, img_go, gallery, gallery_ids, shuffle_btn, upload, img_out)
    direction.change(lambda d: (gr.Column(visible=d == "t2i"), gr.Row(visible=d == "i2t")), direction,
                     [text_panel, img_panel])
    return SearchTab(model, examples, examples_state, gallery, gallery_ids)


def _wire_text(ctx: UIContext, model, k, text, picked, go, rand, examples, examples_state, out) -> None:
    svc, src = ctx.service, ctx.thumbs

    def run_text(model, text, picked, k):
        return search_text(svc, model, text, picked, k, src)

    def rand_text(model, k, current):
        try:
            c = inputs.random_caption(svc, model, exclude=current)
        except SearchError as e:
            return gr.skip(), gr.skip(), notice(e.detail, "error")
        return c.text, c, search_text(svc, model, c.text, c, k, src)

    def example_text(idx, examples, model, k):
        if idx is None or not 0 <= idx < len(examples):
            return gr.skip(), gr.skip(), gr.skip()
        c = examples[idx]
        return c.text, c, search_text(svc, model, c.text, c, k, src)

    def rerun_text(model, text, picked, k):
        return run_text(model, text, picked, k) if (text or "").strip() else gr.skip()

    go.click(run_text, [model, text, picked, k], out)
    text.submit(run_text, [model, text, picked, k], out)
    rand.click(rand_text, [model, k, picked], [text, picked, out])
    examples.click(example_text, [examples, examples_state, model, k], [text, picked, out])
    model.change(rerun_text, [model, text, picked, k], out)
    k.change(rerun_text, [model, text, picked, k], out)


def _wire_image(ctx: UIContext, model, k, img_id, img_go, gallery, gallery_ids, shuffle_btn, upload, out) -> None:
    svc, src, max_bytes = ctx.service, ctx.thumbs, ctx.limits.max_upload_bytes

    def run_image(model, image_id, upload, k):
        return search_image(svc, model, image_id, upload, k, src, max_bytes)

    def pick_image(ids, model, k, evt: gr.SelectData):
        if evt.index is None or not 0 <= evt.index < len(ids):
            return gr.skip(), gr.skip(), gr.skip()
        return ids[evt.index], None, run_image(model, ids[evt.index], None, k)

    def upload_image(model, upload, k):
        if not upload:
            return gr.skip(), gr.skip()
        return None, run_image(model, None, upload, k)

    def shuffle(model):
        return inputs.image_picker(svc, model, seed=random.randrange(1 << 30))

    def rerun_image(model, image_id, upload, k):
        return run_image(model, image_id, upload, k) if (upload or (image_id or "").strip()) else gr.skip()

    img_go.click(run_image, [model, img_id, upload, k], out)
    img_id.submit(lambda m, i, k: (None, run_image(m, i, None, k)), [model, img_id, k], [upload, out])
    gallery.select(pick_image, [gallery_ids, model, k], [img_id, upload, out])
    upload.upload(upload_image, [model, upload, k], [img_id, out])
    shuffle_btn.click(shuffle, model, [gallery, gallery_ids])
    model.change(rerun_image, [model, img_id, upload, k], out)
    k.change(rerun_image, [model, img_id, upload, k], out)
