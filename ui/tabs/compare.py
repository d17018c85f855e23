"""The Compare tab: one query on two models side by side, ground truth ✓ green / ✗ red, the first
ground-truth rank, P@5 and nDCG per model, and ◆ on what only one model retrieved. Above the
rankings, for a text query: its words shaded by what each contributes to one image under each model
(the caption's own image, model A's top result, or a result image the user clicks), and a sentence
on the word the two models treat most differently. Both rankings are within the filter bar's filter
(one slice of the index); every image card has "more like this". What is shown is mirrored in the page
URL, with the filter and the index generation each model served (ui/share.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from search import BadRequest, DatasetCaption, NotReady, SearchError, SearchService
from ui import inputs, share, widgets
from ui.context import UIContext
from ui.explain_render import attribution_html
from ui.render import (
    ACTIONS_JS,
    SLICE_METRICS,
    ThumbSrc,
    caption_list_html,
    esc,
    image_grid_html,
    legend_html,
    metrics_html,
    model_label,
    need_two_notice,
    notice,
    query_html,
)


@dataclass(frozen=True)
class Pair:
    """What one comparison is of besides its query, as every Compare event passes it along: the two
    models ``a`` and ``b``, the top ``k`` (as the dropdown or a shared link gives it) and the filter bar's
    filter ``flt`` (None: the whole index)."""

    a: str
    b: str
    k: Any = 10
    flt: dict | None = None


EMPTY_COMPARE = ('<div class="ltd-empty">One query, two models side by side. Pick a caption or an image above, '
                 'or click a row in the <b>Explorer</b> tab.</div>')


@inputs.guarded
def compare(service: SearchService, a: str, b: str, query: dict, k: Any, thumbs: ThumbSrc,
            flt: dict | None = None) -> str:
    """Two models side by side on one query (``query``: one of query/caption_id/image_id/image_bytes),
    each ranking within ``flt``."""
    if len(service.registry.names) < 2:
        return need_two_notice(service) or ""
    if not a or not b or a == b:
        raise BadRequest("Pick two different models to compare.")
    out = service.compare([a, b], k=inputs.parse_k(k), filter=flt, **query)
    ra, rb = out.results
    shared = set(out.overlap_ids)
    n = max(len(ra.hits), len(rb.hits), 1)
    overlap = (f'<div class="ltd-overlap"><b>{out.overlap}</b> of top-{n} shared '
               f'<span class="ltd-overlap-bar"><span style="width:{100 * out.overlap / n:.0f}%"></span></span>'
               + ('<span class="ltd-muted">◆ only that model retrieved it</span>' if out.overlap < n else "")
               + "</div>")
    def render(r, thumbs, shared):
        if out.direction == "t2i":
            return image_grid_html(r, thumbs, shared, actions=("similar",))
        return caption_list_html(r, thumbs, shared)

    cols = []
    for i, (r, other) in enumerate(((ra, rb), (rb, ra))):
        lb = model_label(service, r.model)
        det = f" · {esc(lb['detail'])}" if lb["detail"] else ""
        cols.append(f'<section class="ltd-col"><div class="ltd-col-head ltd-m{i}"><h3>{esc(r.model)}</h3>'
                    f'<span class="ltd-muted">{esc(lb["kind"])}{det}</span></div>'
                    f'{metrics_html(r, other)}{render(r, thumbs, shared)}</section>')
    return (f'<div class="ltd-result">{query_html(service, a, ra, thumbs, query.get("image_bytes"))}'
            f'<div class="ltd-bar">{overlap}{legend_html(out.direction, ra.metrics is not None)}'
            f'{SLICE_METRICS if flt is not None and ra.metrics is not None else ""}</div>'
            f'<div class="ltd-cols">{"".join(cols)}</div></div>')


def explain_panel(service: SearchService, a: str, b: str, query: dict, thumbs: ThumbSrc,
                  image_id: int | None = None, flt: dict | None = None) -> tuple[str, int | None]:
    """(HTML, explained image id) of the word attributions of a text query under both models: for the
    image ``image_id`` (a clicked result), else the caption's own image, else model a's top result
    (within ``flt``)."""
    if "query" not in query and "caption_id" not in query or len(service.registry.names) < 2 or not a or not b or a == b:
        return "", None
    try:
        why = "picked from the results"
        if image_id is None and "query" in query:
            top = service.search_text(a, query=query["query"], k=1, filter=flt).hits
            if not top:
                return "", None
            image_id, why = top[0].id, f"{a}'s top result"
        elif image_id is None:
            why = "the caption's own image"
        ex = service.explainer.explain([a, b], image_id=image_id, **query)
        if "caption_id" in query and ex.image_id == service.caption(a, query["caption_id"]).image_id:
            why = "the caption's own image"
        kinds = {n: model_label(service, n)["kind"] for n in (a, b)}
        return attribution_html(ex, thumbs, kinds=kinds, why=why), ex.image_id
    except NotReady as e:
        return notice(f"Models are still loading: {e.detail}.", "loading"), None
    except SearchError as e:
        return notice(f"No word attributions: {e.detail}", "info"), None


def compare_view(service: SearchService, p: Pair, query: dict | None, thumbs: ThumbSrc,
                 explain_image: int | None = None) -> tuple[str, str, str]:
    """(results HTML, attributions HTML, URL state) of one comparison within ``p.flt``; ``query`` None shows
    the notice of why there is none."""
    pins = share.pins(service, p.a, p.b)
    if query is None:
        return EMPTY_COMPARE, "", share.compare_state(p.a, p.b, p.k, None, flt=p.flt, pins=pins)
    html = compare(service, p.a, p.b, query, p.k, thumbs, p.flt)
    attr, shown = explain_panel(service, p.a, p.b, query, thumbs, explain_image, p.flt)
    return html, attr, share.compare_state(p.a, p.b, inputs.parse_k(p.k), query, shown, flt=p.flt, pins=pins)


def compare_text(ctx: UIContext, p: Pair, text: str | None, picked: DatasetCaption | None,
                 image: int | None = None) -> tuple:
    """(results, attributions, URL state) for the text box (a picked dataset caption while the box holds its
    text, free text otherwise); a bad input is a notice and leaves the URL state as it is."""
    try:
        q = inputs.text_query(text, picked)
    except SearchError as e:
        return notice(e.detail, "error"), "", gr.skip()
    return compare_view(ctx.service, p, q, ctx.thumbs, image)


def compare_image(ctx: UIContext, p: Pair, image_id: Any, upload: str | None) -> tuple:
    """(results, attributions, URL state) for the image inputs: an upload (within the upload limit) wins
    over a dataset image id."""
    try:
        q = inputs.image_query(image_id, upload, ctx.limits.max_upload_bytes)
    except SearchError as e:
        return notice(e.detail, "error"), "", gr.skip()
    return compare_view(ctx.service, p, q, ctx.thumbs)


@dataclass
class CompareTab:
    """What the page's load event fills, and what the Explorer sets when it opens a query here."""

    a: gr.Dropdown
    b: gr.Dropdown
    k: gr.Dropdown
    kind: gr.Radio
    text_panel: gr.Column
    img_panel: gr.Row
    text: gr.Textbox
    picked: gr.State
    img_id: gr.Textbox
    upload: gr.Image
    out: gr.HTML
    examples: gr.Dataset
    examples_state: gr.State
    gallery: gr.Gallery
    gallery_ids: gr.State
    explain_out: gr.HTML
    share: gr.Textbox  # the URL state of what is shown (ui/share.py); hidden

    def open_targets(self, tabs: gr.Tabs) -> list:
        """Every component ``opened`` may set."""
        return [tabs, self.a, self.b, self.k, self.kind, self.text_panel, self.img_panel, self.text, self.picked,
                self.img_id, self.upload, self.out, self.explain_out, self.share]


def opened(t: CompareTab, tabs: gr.Tabs, ctx: UIContext, p: Pair, query: dict, explain_image: int | None = None) -> dict:
    """Updates that switch to Compare with ``query`` filled in and already compared within ``p.flt`` (Explorer
    clicks, shared links)."""
    html, attr, state = compare_view(ctx.service, p, query, ctx.thumbs, explain_image)
    text_mode = "image_id" not in query
    upd = {tabs: gr.Tabs(selected="compare"), t.a: p.a, t.b: p.b, t.k: inputs.parse_k(p.k),
           t.kind: "text" if text_mode else "image",
           t.text_panel: gr.Column(visible=text_mode), t.img_panel: gr.Row(visible=not text_mode),
           t.out: html, t.explain_out: attr, t.share: state}
    if "caption_id" in query:
        try:
            picked = ctx.service.caption(p.a, query["caption_id"])
        except SearchError:
            picked = DatasetCaption(id=query["caption_id"], text="", image_id=None)
        upd |= {t.text: picked.text, t.picked: picked}
    elif "query" in query:
        upd |= {t.text: query["query"], t.picked: None}
    else:
        upd |= {t.img_id: str(query["image_id"]), t.upload: None}
    return upd


CARD_JS = """element.addEventListener('click', (ev) => {
  if (ev.target.closest('.ltd-act')) return;
  const card = ev.target.closest('.ltd-card[data-image-id]');
  if (card) trigger('pick', {iid: card.dataset.imageId});
});"""
"""A click on a result image (text → image) explains that image instead (its buttons do what they say:
``ACTIONS_JS``)."""


def explain_picked(ctx: UIContext, p: Pair, text: str, picked: dict | None, kind: str, data: dict) -> tuple:
    """(attributions, URL state) after a click on a result image (``data``: the browser's {"iid": …}): the
    text query explained for that image."""
    try:
        iid = inputs.parse_id(data.get("iid"), "image id")
        q = inputs.text_query(text, picked)
    except (SearchError, AttributeError):
        return gr.skip(), gr.skip()
    if kind != "text" or iid is None:
        return gr.skip(), gr.skip()
    attr, shown = explain_panel(ctx.service, p.a, p.b, q, ctx.thumbs, iid, p.flt)
    return attr, share.compare_state(p.a, p.b, inputs.parse_k(p.k), q, shown, flt=p.flt,
                                     pins=share.pins(ctx.service, p.a, p.b))


def build(ctx: UIContext, flt: gr.State) -> CompareTab:
    names, pair = ctx.names, ctx.pair
    a0, b0 = ctx.first_pair
    with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
        if not pair:
            gr.HTML(need_two_notice(ctx.service))
        picked, examples_state, gallery_ids = gr.State(None), gr.State([]), gr.State([])
        share_box = gr.Textbox(visible=False, elem_id="compare-share")
        with gr.Row(elem_classes="ltd-controls", visible=bool(pair)):
            a = gr.Dropdown(names, value=a0, label="Model A", scale=2, min_width=120)
            swap = gr.Button("⇄", scale=0, min_width=48, elem_id="compare-swap", elem_classes="ltd-swap")
            b = gr.Dropdown(names, value=b0, label="Model B", scale=2, min_width=120)
            k = gr.Dropdown(ctx.k_choices, value=ctx.k_default, label="Top k", scale=1, min_width=90)
            kind = gr.Radio([("Caption / text", "text"), ("Image", "image")], value="text", label="Query", scale=2,
                            elem_id="compare-kind")
        with gr.Column(visible=bool(pair)) as text_panel:
            text, go, rand, examples = widgets.caption_row("compare", "Compare", "type a caption, or pick a dataset caption",
                                                           ctx.limits.max_query_chars)
        with gr.Row(visible=False) as img_panel:
            with gr.Column(scale=1, min_width=220):
                img_id, img_go = widgets.image_id_row("compare", "Compare")
                upload = widgets.upload_box(150)
            gallery = gr.Gallery(label="…or click a dataset image", columns=8, height=None, scale=3,
                                 allow_preview=False, object_fit="cover", elem_classes="ltd-picker",
                                 elem_id="compare-gallery")
        explain_out = gr.HTML("", elem_id="compare-explain")
        out = gr.HTML(EMPTY_COMPARE if pair else "", elem_id="compare-results", js_on_load=CARD_JS + "\n" + ACTIONS_JS)
    tab = CompareTab(a, b, k, kind, text_panel, img_panel, text, picked, img_id, upload, out, examples,
                     examples_state, gallery, gallery_ids, explain_out, share_box)
    _wire(ctx, tab, flt, go, rand, img_go, swap)
    return tab


def _wire(ctx: UIContext, t: CompareTab, flt: gr.State, go, rand, img_go, swap) -> None:
    """Events. The Query radio says which input the shown result came from, so changing a model, k or
    the filter re-runs it. Every event that changes what is shown also writes its URL state (``t.share``)."""
    svc = ctx.service

    def cmp_text(a, b, text, picked, k, flt=None):
        return compare_text(ctx, Pair(a, b, k, flt), text, picked)

    def cmp_image(a, b, image_id, upload, k, flt=None):
        return compare_image(ctx, Pair(a, b, k, flt), image_id, upload)

    def cmp_rand(a, b, k, current, flt):
        try:
            c = inputs.random_caption(svc, a, exclude=current)
        except SearchError as e:
            return gr.skip(), gr.skip(), notice(e.detail, "error"), "", gr.skip()
        return c.text, c, *cmp_text(a, b, c.text, c, k, flt)

    def cmp_example(idx, examples, a, b, k, flt):
        if idx is None or not 0 <= idx < len(examples):
            return (gr.skip(),) * 5
        c = examples[idx]
        return c.text, c, *cmp_text(a, b, c.text, c, k, flt)

    def cmp_pick(ids, a, b, k, flt, evt: gr.SelectData):
        if evt.index is None or not 0 <= evt.index < len(ids):
            return (gr.skip(),) * 5
        return str(ids[evt.index]), None, *cmp_image(a, b, ids[evt.index], None, k, flt)

    def cmp_upload(a, b, upload, k, flt):
        if not upload:
            return (gr.skip(),) * 4
        return "", *cmp_image(a, b, None, upload, k, flt)

    def cmp_last(v: dict):
        """Re-run the shown compare after a model/k/filter change, if there is one (``v``: the values of
        ``last_inputs``, by component)."""
        text, image_id, upload, kind = v[t.text], v[t.img_id], v[t.upload], v[t.kind]
        if kind == "text" and (text or "").strip():
            return cmp_text(v[t.a], v[t.b], text, v[t.picked], v[t.k], v[flt])
        if kind == "image" and (upload or (image_id or "").strip()):
            return cmp_image(v[t.a], v[t.b], image_id, upload, v[t.k], v[flt])
        return gr.skip(), gr.skip(), gr.skip()

    def cmp_swap(v: dict):
        return v[t.b], v[t.a], *cmp_last(v | {t.a: v[t.b], t.b: v[t.a]})

    def explain_clicked(v: dict, evt: gr.EventData):
        return explain_picked(ctx, Pair(v[t.a], v[t.b], v[t.k], v[flt]), v[t.text], v[t.picked], v[t.kind],
                              getattr(evt, "_data", None) or {})

    shown = [t.out, t.explain_out, t.share]
    t.kind.change(lambda kind: (gr.Column(visible=kind == "text"), gr.Row(visible=kind == "image")), t.kind,
                  [t.text_panel, t.img_panel])
    go.click(cmp_text, [t.a, t.b, t.text, t.picked, t.k, flt], shown)
    t.text.submit(cmp_text, [t.a, t.b, t.text, t.picked, t.k, flt], shown)
    rand.click(cmp_rand, [t.a, t.b, t.k, t.picked, flt], [t.text, t.picked, *shown])
    t.examples.click(cmp_example, [t.examples, t.examples_state, t.a, t.b, t.k, flt], [t.text, t.picked, *shown])
    img_go.click(cmp_image, [t.a, t.b, t.img_id, t.upload, t.k, flt], shown)
    t.img_id.submit(lambda a, b, i, k, f: (None, *cmp_image(a, b, i, None, k, f)), [t.a, t.b, t.img_id, t.k, flt],
                    [t.upload, *shown])
    t.gallery.select(cmp_pick, [t.gallery_ids, t.a, t.b, t.k, flt], [t.img_id, t.upload, *shown])
    t.upload.upload(cmp_upload, [t.a, t.b, t.upload, t.k, flt], [t.img_id, *shown])
    last_inputs = {t.a, t.b, t.text, t.picked, t.img_id, t.upload, t.k, t.kind, flt}  # a set: one dict of values
    for comp in (t.a, t.b, t.k):
        comp.input(cmp_last, last_inputs, shown)
    flt.change(cmp_last, last_inputs, shown)
    swap.click(cmp_swap, last_inputs, [t.a, t.b, *shown])
    t.out.pick(explain_clicked, {t.a, t.b, t.text, t.picked, t.k, t.kind, flt}, [t.explain_out, t.share])
    t.share.change(None, t.share, None, js=share.SYNC_JS)
