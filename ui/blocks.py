"""The Gradio Blocks app: Search, Compare, Explorer and Training tabs over one ``SearchService``.

The FastAPI app mounts it (Gradio 6 takes theme/CSS at mount time)::

    from ui.blocks import build_ui
    from ui.theme import THEME, CSS
    gr.mount_gradio_app(app, build_ui(service), path="/ui", theme=THEME, css=CSS)

Event functions here only wire components to ``ui.handlers``, which holds the behaviour.
"""
from __future__ import annotations

import random

import gradio as gr
import pandas as pd

from app.service import SearchService, ServiceError
from ui import handlers as h
from ui.theme import CSS

EMPTY_TEXT = ('<div class="ltd-empty">Type a caption and press Enter, or take a <b>⚄ random dataset caption</b> '
              '(or one of the examples): dataset captions come with ground truth, shown <b>✓ green</b> / <b>✗ red</b>.</div>')
EMPTY_IMAGE = ('<div class="ltd-empty">Click a dataset image, type its id, or upload a picture: '
               'the captions the model ranks highest appear here.</div>')
EMPTY_COMPARE = ('<div class="ltd-empty">One query, two models side by side. Pick a caption or an image above, '
                 'or click a row in the <b>Explorer</b> tab.</div>')


def _thumbs(service: SearchService, thumbs: h.ThumbSrc | str | None) -> h.ThumbSrc:
    if thumbs is None:
        return h.url_thumbs()
    if thumbs == "inline":
        return h.inline_thumbs(service)
    if isinstance(thumbs, str):
        return h.url_thumbs(thumbs)
    return thumbs


def build_ui(service: SearchService, *, thumbs: h.ThumbSrc | str | None = None, title: str = "LTD retrieval",
             embed_css: bool = True, max_upload_bytes: int = h.MAX_UPLOAD_BYTES) -> gr.Blocks:
    """The UI over ``service``. ``thumbs``: how result images reach the browser: None → the REST route
    ``/api/images/{id}/thumbnail?size=…&model=…``; a format string with {id}, {size}, {model} → that
    URL; "inline" → data URIs (no REST API needed); or a callable (image_id, model, size) → src.
    ``embed_css``: also ship ui/style.css inside the page, so that the result cards keep their look
    even when the mounting code does not pass ``css=CSS`` (passing it as well is harmless)."""
    src = _thumbs(service, thumbs)
    names = list(service.names)
    pair = h.two_models(service)
    a0, b0 = pair if pair else (names[0], names[0])

    with gr.Blocks(title=title, analytics_enabled=False, fill_width=True) as demo:
        if embed_css:
            gr.HTML(f"<style>{CSS}</style>", elem_id="ltd-style", padding=False, container=False)
        header = gr.HTML(h.header_html(service), elem_id="ltd-header")
        timer = gr.Timer(2.0, active=not service.ready.is_set())

        with gr.Tabs(elem_id="ltd-tabs") as tabs:
            # ---------------------------------------------------------------- Search
            with gr.Tab("Search", id="search", elem_id="tab-search"):
                with gr.Row(elem_classes="ltd-controls"):
                    s_model = gr.Dropdown(names, value=names[0], label="Model", scale=2, min_width=140)
                    s_k = gr.Dropdown(h.K_CHOICES, value=10, label="Top k", scale=1, min_width=90)
                    s_dir = gr.Radio([("Text → images", "t2i"), ("Image → captions", "i2t")], value="t2i",
                                     label="Search direction", scale=3, elem_id="search-direction")
                s_picked = gr.State(None)
                s_examples_state = gr.State([])
                s_gallery_ids = gr.State([])
                with gr.Column(visible=True) as s_text_panel:
                    with gr.Row(equal_height=False, elem_classes="ltd-qrow"):
                        s_text = gr.Textbox(label="Caption", placeholder="type a caption and press Enter",
                                            scale=6, elem_id="search-text", max_length=1000)
                        s_go = gr.Button("Search", variant="primary", scale=0, min_width=110, elem_id="search-go")
                        s_rand = gr.Button("⚄ Random caption", scale=0, min_width=170, elem_id="search-random")
                    s_examples = gr.Dataset(components=[s_text], samples=[], label="Dataset captions: click one (ground truth known)",
                                            type="index", samples_per_page=8, layout="gallery", elem_classes="ltd-examples")
                    s_text_out = gr.HTML(EMPTY_TEXT, elem_id="search-text-results")
                with gr.Row(visible=False) as s_img_panel:
                    with gr.Column(scale=2, min_width=280):
                        with gr.Row(equal_height=False, elem_classes="ltd-qrow"):
                            s_img_id = gr.Textbox(label="Dataset image id", placeholder="e.g. 52", scale=2,
                                                  elem_id="search-image-id")
                            s_img_go = gr.Button("Search", variant="primary", scale=0, min_width=100)
                        s_gallery = gr.Gallery(label="…or click a dataset image", columns=4, height=300,
                                               allow_preview=False, object_fit="cover", elem_classes="ltd-picker",
                                               elem_id="search-gallery")
                        s_shuffle = gr.Button("↻ Show other images", size="sm")
                        s_upload = gr.Image(label="…or upload an image", type="filepath", image_mode=None,
                                            sources=["upload", "clipboard"], height=160)
                    with gr.Column(scale=5):
                        s_img_out = gr.HTML(EMPTY_IMAGE, elem_id="search-image-results")

            # ---------------------------------------------------------------- Compare
            with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
                if not pair:
                    gr.HTML(h.need_two_notice(service))
                c_picked = gr.State(None)
                c_examples_state = gr.State([])
                c_gallery_ids = gr.State([])
                with gr.Row(elem_classes="ltd-controls", visible=bool(pair)):
                    c_a = gr.Dropdown(names, value=a0, label="Model A", scale=2, min_width=120)
                    c_swap = gr.Button("⇄", scale=0, min_width=48, elem_id="compare-swap", elem_classes="ltd-swap")
                    c_b = gr.Dropdown(names, value=b0, label="Model B", scale=2, min_width=120)
                    c_k = gr.Dropdown(h.K_CHOICES, value=10, label="Top k", scale=1, min_width=90)
                    c_kind = gr.Radio([("Caption / text", "text"), ("Image", "image")], value="text", label="Query",
                                      scale=2, elem_id="compare-kind")
                with gr.Column(visible=bool(pair)) as c_text_panel:
                    with gr.Row(equal_height=False, elem_classes="ltd-qrow"):
                        c_text = gr.Textbox(label="Caption", placeholder="type a caption, or pick a dataset caption",
                                            scale=6, elem_id="compare-text", max_length=1000)
                        c_go = gr.Button("Compare", variant="primary", scale=0, min_width=110, elem_id="compare-go")
                        c_rand = gr.Button("⚄ Random caption", scale=0, min_width=170, elem_id="compare-random")
                    c_examples = gr.Dataset(components=[c_text], samples=[], label="Dataset captions: click one (ground truth known)",
                                            type="index", samples_per_page=8, layout="gallery", elem_classes="ltd-examples")
                with gr.Row(visible=False) as c_img_panel:
                    with gr.Column(scale=1, min_width=220):
                        with gr.Row(equal_height=False, elem_classes="ltd-qrow"):
                            c_img_id = gr.Textbox(label="Dataset image id", placeholder="e.g. 52", scale=2,
                                                  elem_id="compare-image-id")
                            c_img_go = gr.Button("Compare", variant="primary", scale=0, min_width=100)
                        c_upload = gr.Image(label="…or upload an image", type="filepath", image_mode=None,
                                            sources=["upload", "clipboard"], height=150)
                    c_gallery = gr.Gallery(label="…or click a dataset image", columns=8, height=None, scale=3,
                                           allow_preview=False, object_fit="cover", elem_classes="ltd-picker",
                                           elem_id="compare-gallery")
                c_out = gr.HTML(EMPTY_COMPARE if pair else "", elem_id="compare-results")

            # ---------------------------------------------------------------- Explorer
            with gr.Tab("Explorer", id="explorer", elem_id="tab-explorer") as explorer_tab:
                if not pair:
                    gr.HTML(h.need_two_notice(service))
                e_rows = gr.State([])
                with gr.Row(elem_classes="ltd-controls", visible=bool(pair)):
                    e_a = gr.Dropdown(names, value=a0, label="Model A", scale=1, min_width=110)
                    e_b = gr.Dropdown(names, value=b0, label="Model B", scale=1, min_width=110)
                    e_dir = gr.Radio([("both", "both"), ("text → image", "t2i"), ("image → text", "i2t")], value="both",
                                     label="Direction", scale=3, min_width=330)
                    e_win = gr.Radio(_winner_choices(a0, b0), value="any", label="Which model ranks the ground truth higher",
                                     scale=4)
                    e_limit = gr.Dropdown([50, 200, 1000], value=200, label="Rows", scale=1, min_width=80)
                e_sum = gr.HTML("", elem_id="explorer-summary")
                e_table = gr.Dataframe(headers=h.explorer_headers(a0, b0), interactive=False, wrap=True, max_height=560,
                                       elem_id="explorer-table", visible=bool(pair),
                                       datatype=["str", "number", "html"] + ["number"] * 6 + ["str", "number"],
                                       column_widths=["5%", "5%", "39%"] + ["6.5%"] * 6 + ["7%", "5%"])

            # ---------------------------------------------------------------- Training
            with gr.Tab("Training", id="training", elem_id="tab-training") as training_tab:
                with gr.Row(elem_classes="ltd-controls"):
                    t_models = gr.CheckboxGroup(names, value=names, label="Models (overlaid)", scale=3)
                    t_smooth = gr.Slider(1, 50, value=5, step=1, label="Smoothing (steps)", scale=2)
                t_report = gr.Dataframe(label="Evaluation report (test split)", interactive=False, elem_id="training-report")
                t_msg = gr.HTML("")
                t_plot = gr.Plot(label="Training curves", elem_id="training-plot")

        # ================================================================= events
        def on_load(model, cmodel, seed=0):
            """Header, example captions and image pickers; the timer keeps polling until models are ready."""
            ready = service.ready.is_set()
            out = [h.header_html(service), gr.Timer(active=not ready)]
            if not ready:
                return out + [gr.skip()] * 8
            s_ex, c_ex = _examples(model), _examples(cmodel)
            s_items, s_ids = _picker(model, seed)
            c_items, c_ids = _picker(cmodel, seed + 1, n=16)
            return out + [gr.Dataset(samples=[[e["text"]] for e in s_ex]), s_ex,
                          gr.Dataset(samples=[[e["text"]] for e in c_ex]), c_ex, s_items, s_ids, c_items, c_ids]

        def _examples(model):
            try:
                return h.example_captions(service, model, n=12)
            except ServiceError:
                return []

        def _picker(model, seed, n=24):
            try:
                return h.image_picker(service, model, n=n, seed=seed)
            except ServiceError:
                return [], []

        load_outputs = [header, timer, s_examples, s_examples_state, c_examples, c_examples_state,
                        s_gallery, s_gallery_ids, c_gallery, c_gallery_ids]
        demo.load(on_load, [s_model, c_a], load_outputs)
        timer.tick(on_load, [s_model, c_a], load_outputs)

        # ---- Search: text → images
        def run_text(model, text, picked, k):
            return h.search_text(service, model, text, picked, k, src)

        def rand_text(model, k, current):
            try:
                c = h.random_caption(service, model, exclude=(current or {}).get("id"))
            except ServiceError as e:
                return gr.skip(), gr.skip(), h.notice(e.detail, "error")
            return c["text"], c, h.search_text(service, model, c["text"], c, k, src)

        def example_text(idx, examples, model, k):
            if idx is None or not 0 <= idx < len(examples):
                return gr.skip(), gr.skip(), gr.skip()
            c = examples[idx]
            return c["text"], c, h.search_text(service, model, c["text"], c, k, src)

        def rerun_text(model, text, picked, k):
            return run_text(model, text, picked, k) if (text or "").strip() else gr.skip()

        s_go.click(run_text, [s_model, s_text, s_picked, s_k], s_text_out)
        s_text.submit(run_text, [s_model, s_text, s_picked, s_k], s_text_out)
        s_rand.click(rand_text, [s_model, s_k, s_picked], [s_text, s_picked, s_text_out])
        s_examples.click(example_text, [s_examples, s_examples_state, s_model, s_k], [s_text, s_picked, s_text_out])
        s_model.change(rerun_text, [s_model, s_text, s_picked, s_k], s_text_out)
        s_k.change(rerun_text, [s_model, s_text, s_picked, s_k], s_text_out)

        # ---- Search: image → captions
        def run_image(model, image_id, upload, k):
            return h.search_image(service, model, image_id, upload, k, src, max_upload_bytes)

        def pick_image(ids, model, k, evt: gr.SelectData):
            if evt.index is None or not 0 <= evt.index < len(ids):
                return gr.skip(), gr.skip(), gr.skip()
            iid = ids[evt.index]
            return iid, None, h.search_image(service, model, iid, None, k, src)

        def upload_image(model, upload, k):
            if not upload:
                return gr.skip(), gr.skip()
            return None, h.search_image(service, model, None, upload, k, src, max_upload_bytes)

        def shuffle(model):
            return _picker(model, random.randrange(1 << 30))

        def rerun_image(model, image_id, upload, k):
            return run_image(model, image_id, upload, k) if (upload or (image_id or "").strip()) else gr.skip()

        s_img_go.click(run_image, [s_model, s_img_id, s_upload, s_k], s_img_out)
        s_img_id.submit(lambda m, i, k: (None, h.search_image(service, m, i, None, k, src)), [s_model, s_img_id, s_k],
                        [s_upload, s_img_out])
        s_dir.change(lambda d: (gr.Column(visible=d == "t2i"), gr.Row(visible=d == "i2t")), s_dir,
                     [s_text_panel, s_img_panel])
        s_gallery.select(pick_image, [s_gallery_ids, s_model, s_k], [s_img_id, s_upload, s_img_out])
        s_upload.upload(upload_image, [s_model, s_upload, s_k], [s_img_id, s_img_out])
        s_shuffle.click(shuffle, s_model, [s_gallery, s_gallery_ids])
        s_model.change(rerun_image, [s_model, s_img_id, s_upload, s_k], s_img_out)
        s_k.change(rerun_image, [s_model, s_img_id, s_upload, s_k], s_img_out)

        # ---- Compare (the Query radio says which input the shown result came from, so changing a
        # model or k re-runs it)
        def show_kind(kind):
            return gr.Column(visible=kind == "text"), gr.Row(visible=kind == "image")

        def cmp_text(a, b, text, picked, k):
            return h.compare_text(service, a, b, text, picked, k, src)

        def cmp_rand(a, b, k, current):
            try:
                c = h.random_caption(service, a, exclude=(current or {}).get("id"))
            except ServiceError as e:
                return gr.skip(), gr.skip(), h.notice(e.detail, "error")
            return c["text"], c, cmp_text(a, b, c["text"], c, k)

        def cmp_example(idx, examples, a, b, k):
            if idx is None or not 0 <= idx < len(examples):
                return gr.skip(), gr.skip(), gr.skip()
            c = examples[idx]
            return c["text"], c, cmp_text(a, b, c["text"], c, k)

        def cmp_image(a, b, image_id, upload, k):
            return h.compare_image(service, a, b, image_id, upload, k, src, max_upload_bytes)

        def cmp_pick(ids, a, b, k, evt: gr.SelectData):
            if evt.index is None or not 0 <= evt.index < len(ids):
                return gr.skip(), gr.skip(), gr.skip()
            iid = ids[evt.index]
            return str(iid), None, cmp_image(a, b, iid, None, k)

        def cmp_upload(a, b, upload, k):
            if not upload:
                return gr.skip(), gr.skip()
            return "", cmp_image(a, b, None, upload, k)

        def cmp_last(a, b, text, picked, image_id, upload, k, kind):
            """Re-run the shown compare after a model/k change, if there is one."""
            if kind == "text" and (text or "").strip():
                return cmp_text(a, b, text, picked, k)
            if kind == "image" and (upload or (image_id or "").strip()):
                return cmp_image(a, b, image_id, upload, k)
            return gr.skip()

        def cmp_swap(a, b, *rest):
            return b, a, cmp_last(b, a, *rest)

        c_kind.change(show_kind, c_kind, [c_text_panel, c_img_panel])
        c_go.click(cmp_text, [c_a, c_b, c_text, c_picked, c_k], c_out)
        c_text.submit(cmp_text, [c_a, c_b, c_text, c_picked, c_k], c_out)
        c_rand.click(cmp_rand, [c_a, c_b, c_k, c_picked], [c_text, c_picked, c_out])
        c_examples.click(cmp_example, [c_examples, c_examples_state, c_a, c_b, c_k], [c_text, c_picked, c_out])
        c_img_go.click(cmp_image, [c_a, c_b, c_img_id, c_upload, c_k], c_out)
        c_img_id.submit(lambda a, b, i, k: (None, cmp_image(a, b, i, None, k)), [c_a, c_b, c_img_id, c_k], [c_upload, c_out])
        c_gallery.select(cmp_pick, [c_gallery_ids, c_a, c_b, c_k], [c_img_id, c_upload, c_out])
        c_upload.upload(cmp_upload, [c_a, c_b, c_upload, c_k], [c_img_id, c_out])
        last_inputs = [c_a, c_b, c_text, c_picked, c_img_id, c_upload, c_k, c_kind]
        for comp in (c_a, c_b, c_k):
            comp.input(cmp_last, last_inputs, c_out)
        c_swap.click(cmp_swap, last_inputs, [c_a, c_b, c_out])

        # ---- Explorer
        def run_explorer(a, b, direction, winner, limit):
            table, rows, summary = h.explorer(service, a, b, direction, winner, int(limit or 200), thumbs=src)
            df = pd.DataFrame(table, columns=h.explorer_headers(a, b))
            return df, rows, summary

        def explorer_models(a, b, direction, winner, limit):
            df, rows, summary = run_explorer(a, b, direction, winner, limit)
            return gr.Radio(choices=_winner_choices(a, b), value="any" if a == b else winner), df, rows, summary

        def open_in_compare(rows, a, b, k, evt: gr.SelectData):
            """Explorer row → Compare tab, with the query filled in and the comparison already run."""
            try:
                q = h.explorer_pick(rows, evt.index, evt.row_value)
            except (ServiceError, ValueError, TypeError, IndexError) as e:
                detail = e.detail if isinstance(e, ServiceError) else str(e)
                return [gr.skip()] * 10 + [h.notice(detail, "error")]
            if q["direction"] == "t2i":
                picked = {"id": q["caption_id"], "text": q["text"]}
                out = h.compare(service, a, b, {"caption_id": q["caption_id"]}, k, src)
                return (gr.Tabs(selected="compare"), a, b, "text", gr.Column(visible=True), gr.Row(visible=False),
                        q["text"], picked, gr.skip(), gr.skip(), out)
            out = h.compare(service, a, b, {"image_id": q["image_id"]}, k, src)
            return (gr.Tabs(selected="compare"), a, b, "image", gr.Column(visible=False), gr.Row(visible=True),
                    gr.skip(), gr.skip(), str(q["image_id"]), None, out)

        ex_inputs = [e_a, e_b, e_dir, e_win, e_limit]
        explorer_tab.select(run_explorer, ex_inputs, [e_table, e_rows, e_sum])
        for comp in (e_dir, e_win, e_limit):
            comp.input(run_explorer, ex_inputs, [e_table, e_rows, e_sum])
        for comp in (e_a, e_b):
            comp.input(explorer_models, ex_inputs, [e_win, e_table, e_rows, e_sum])
        e_table.select(open_in_compare, [e_rows, e_a, e_b, c_k],
                       [tabs, c_a, c_b, c_kind, c_text_panel, c_img_panel, c_text, c_picked, c_img_id, c_upload, c_out])

        # ---- Training
        def run_training(models, smooth):
            if not service.ready.is_set():
                note = h.loading_state(service)
                return None, None, note
            headers, rows = h.report_table(service, models or names)
            fig, msg = h.training_figure(service, models, smooth)
            return _best_bold(pd.DataFrame(rows, columns=headers)), fig, msg

        training_tab.select(run_training, [t_models, t_smooth], [t_report, t_plot, t_msg])
        t_models.input(run_training, [t_models, t_smooth], [t_report, t_plot, t_msg])
        t_smooth.release(run_training, [t_models, t_smooth], [t_report, t_plot, t_msg])

    return demo


def _best_bold(df: pd.DataFrame):
    """Format the report (R@k and rsum: 1 decimal, nDCG: 3) and bold the single best model per metric
    (every report metric is higher-is-better)."""
    num = [c for c in df.columns[2:] if pd.api.types.is_numeric_dtype(df[c])]
    if not num:
        return df

    def bold(col: pd.Series) -> list[str]:
        best = col == col.max()
        unique = len(col) > 1 and best.sum() == 1
        return ["font-weight: 800; color: var(--ltd-m0);" if b and unique else "" for b in best]

    fmt = {c: ("{:.3f}" if "nDCG" in c else "{:.1f}") for c in num}
    return df.style.apply(bold, subset=num).format(fmt, na_rep="–")


def _winner_choices(a: str, b: str) -> list[tuple[str, str]]:
    if a == b:
        return [("any", "any")]
    return [("any", "any"), (f"{a} better", "a"), (f"{b} better", "b"), ("tie", "tie")]
