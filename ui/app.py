"""The Gradio Blocks app: a header, the filter bar (ui/filterbar.py) and five tabs (ui/tabs/) over one
``SearchService`` and the ``CaptionService`` beside it.

The FastAPI app mounts it and hands it everything it needs (it imports neither ``app`` nor
``training``)::

    blocks = build_ui(service, captions, thumb_url=lambda image_id, model, size: "/api/…")
    gr.mount_gradio_app(app, blocks, path="/ui", theme=THEME, css=CSS)

While the models load, a timer polls every 2 s and fills the header, the filter chips, the example
captions and the image pickers as soon as they are ready. The page's URL carries what is shown
(ui/share.py): a link to it reopens the same tab, models, query, k and filter, and says when the index
changed since it was made. ``writes``: the page may add and remove items (ui/items.py).
"""
from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from search import CaptionService, SearchService
from ui import filterbar, inputs, share
from ui.context import UIContext
from ui.render import header_html, inline_thumbs
from ui.tabs import caption, compare, explorer, search, training
from ui.theme import CSS

__all__ = ["build_ui"]


def build_ui(service: SearchService, captions: CaptionService | None = None, *,
             thumb_url: Callable[[int, str, int], str] | None = None, title: str = "LTD retrieval",
             embed_css: bool = True, writes: bool | None = None) -> gr.Blocks:
    """The UI over ``service`` and ``captions`` (None: a caption service without captioners, whose tab
    says how to add one). ``thumb_url(image_id, model, size)`` gives the URL of a thumbnail (the
    REST route); without it thumbnails are embedded as data URIs. ``embed_css``: also ship the style
    sheet inside the page, so the result cards keep their look when the mount passes no ``css``.
    ``writes``: photos may be added and items removed from the page (default: the service is writable;
    the app that mounts it says no when its writes need a token the page does not have)."""
    thumbs = (lambda i, m, s: thumb_url(int(i), m or "", int(s))) if thumb_url else inline_thumbs(service)
    writes = service.config.writable if writes is None else bool(writes and service.config.writable)
    ctx = UIContext(service, captions or CaptionService(service), thumbs, writes)
    models = service.registry
    with gr.Blocks(title=title, analytics_enabled=False, fill_width=True) as demo:
        if embed_css:
            gr.HTML(f"<style>{CSS}</style>", elem_id="ltd-style", padding=False, container=False)
        header = gr.HTML(header_html(service), elem_id="ltd-header")
        timer = gr.Timer(2.0, active=not models.ready.is_set())
        bar = filterbar.build(ctx, header)
        pin = gr.HTML("", elem_id="ltd-pin", elem_classes="ltd-pin")  # a shared link's index changed since
        with gr.Tabs(elem_id="ltd-tabs") as tabs:
            s = search.build(ctx, bar, tabs)
            c = compare.build(ctx, bar.state)
            x = explorer.build(ctx, c, tabs, bar.state)
            cap_gallery, cap_ids = caption.build(ctx)
            training.build(ctx)

        def on_load(model, cmodel, seed=0):
            """Header, filter chips, example captions and image pickers; the timer polls until the models
            are ready."""
            ready = models.ready.is_set()
            out = [header_html(service), gr.Timer(active=not ready)]
            if not ready:
                return out + [gr.skip()] * 12
            s_ex, c_ex = (inputs.example_captions(service, m, n=12) for m in (model, cmodel))
            return out + [*filterbar.offered(ctx), gr.Dataset(samples=[[e.text] for e in s_ex]), s_ex,
                          gr.Dataset(samples=[[e.text] for e in c_ex]), c_ex,
                          *inputs.image_picker(service, model, seed=seed),
                          *inputs.image_picker(service, cmodel, n=16, seed=seed + 1),
                          *inputs.image_picker(service, models.default_name_with_ground_truth, n=16, seed=seed + 2)]

        outputs = [header, timer, bar.chips, bar.range_field, s.examples, s.examples_state, c.examples, c.examples_state,
                   s.gallery, s.gallery_ids, c.gallery, c.gallery_ids, cap_gallery, cap_ids]
        demo.load(on_load, [s.model, c.a], outputs)
        timer.tick(on_load, [s.model, c.a], outputs)

        def similar_from_compare(k, flt, evt: gr.EventData):
            """"More like this" on a Compare card: the Search tab, image → images, on that card's model."""
            return search.opened_similar(ctx, s, tabs, getattr(evt, "_data", None), k, flt)

        c.out.similar(similar_from_compare, [s.k, bar.state], s.similar_targets(tabs))
        _share(ctx, demo, tabs, c, x, bar, pin)
    return demo


def _share(ctx: UIContext, demo: gr.Blocks, tabs: gr.Tabs, c: compare.CompareTab, x: explorer.ExplorerTab,
           bar: filterbar.FilterBar, pin: gr.HTML) -> None:
    """A shared link reopens what it names (ui/share.py): the page hands its query string over on load;
    its filter fills the filter bar, and a notice says when the index changed since the link was made."""
    url = gr.Textbox(visible=False, elem_id="ltd-url")

    def open_url(search: str):
        state = share.read(search, ctx.names, ctx.k_choices)
        if state.tab is None:
            return {tabs: gr.skip()}  # (an empty dict would be read as one output value)
        upd = {tabs: gr.Tabs(selected=state.tab)}
        if not ctx.service.registry.ready.wait(timeout=120):
            return upd
        upd |= filterbar.restored(bar, ctx, state.f)
        if ctx.pair is None or state.tab not in ("compare", "explorer"):
            return upd
        a, b = state.a or ctx.first_pair[0], state.b or ctx.first_pair[1]
        upd[pin] = share.pin_note(ctx.service, state, a, b)
        if state.tab == "explorer":
            return upd | explorer.restored(ctx, x, c.share, a, b, state)
        q = state.query()
        if q is None:
            return upd | {c.a: a, c.b: b, c.k: state.k or 10}
        return upd | compare.opened(c, tabs, ctx, compare.Pair(a, b, state.k or 10, state.f), q, state.ex)

    restore = [*bar.values, bar.state, bar.status, pin]
    targets = list(dict.fromkeys([*c.open_targets(tabs), *x.restore_targets(c.share), *restore]))
    demo.load(open_url, [url], targets, js=share.READ_JS)
    tabs.select(None, None, None, js=share.TAB_JS)
