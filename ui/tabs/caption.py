"""The Caption tab: the served captioners side by side on one image (e.g. cross-entropy, CIDEr-only
and self-retrieval training), each caption with its CIDEr-D against the image's references and the
image's rank for it under every retrieval model — the captioner's own judge and the referee (a model
no served captioner trained against) marked; and a checker for a caption you write."""
from __future__ import annotations

from typing import Any

import gradio as gr

from search import CaptionerInfo, CaptionService, ImageRank
from ui import inputs, widgets
from ui.context import UIContext
from ui.render import ThumbSrc, esc, notice

EMPTY = ('<div class="ltd-empty">Pick a dataset image (its reference captions give CIDEr-D) or upload one: each '
         'captioner describes it, and each retrieval model says where that caption ranks the image.</div>')
NO_CAPTIONER = ("This server has no captioner. Train one with `ltd caption train` and start the server with "
                "`--captioner NAME=runs/…/best.pt` (repeatable) to compare captioners here.")


ROLES = {"teacher": ("judge", "this captioner was trained against this model, which favours its captions"),
         "referee": ("referee", "no served captioner was trained against this model: the independent view")}


def _rank_badges(ranks: list[ImageRank]) -> str:
    """One badge per retrieval model: rank 1 green, top 5 amber, further red; the captioner's own judge
    and the referee (a model no captioner trained against) are marked."""
    out = []
    for r in ranks:
        cls = "gt" if r.rank == 1 else ("near" if r.rank <= 5 else "miss")
        role = next((ROLES[k] for k in ("teacher", "referee") if getattr(r, k)), None)
        tip = (f"{r.model}: the image ranks {r.rank} of {r.of} for this caption (score {r.score:.3f})"
               + (f"; {role[1]}" if role else ""))
        out.append(f'<span class="ltd-rankbadge {cls}" title="{esc(tip)}">{esc(r.model)} '
                   f'<b>#{r.rank}</b><small>/{r.of}</small>'
                   + (f' <em class="ltd-role">{role[0]}</em>' if role else "") + "</span>")
    return "".join(out) or '<span class="ltd-muted">no retrieval model can rank this image</span>'


def _image_html(captions: CaptionService, image_id: int | None, thumbs: ThumbSrc, refs: list[str] | None) -> str:
    if image_id is None:
        return '<div class="ltd-query"><span class="ltd-tag ltd-tag-free">uploaded image · no references</span></div>'
    model = captions.search.registry.default_name_with_ground_truth
    img = f'<img class="ltd-qimg" src="{esc(thumbs(image_id, model, 256))}" alt="">'
    ref = "".join(f"<li>{esc(t)}</li>" for t in refs or [])
    refs_html = (f'<details class="ltd-gtcaps" open><summary>its {len(refs)} reference captions</summary>'
                 f'<ul>{ref}</ul></details>') if refs else ""
    return (f'<div class="ltd-query ltd-query-img">{img}<div><span class="ltd-tag">dataset image #{image_id}</span>'
            f'{refs_html}</div></div>')


def _how(info: CaptionerInfo) -> str:
    """How a captioner was trained, in a few words."""
    how = {"xe": "cross-entropy", "scst": "self-critical"}.get(info.stage, info.stage or "")
    if info.stage == "scst" and info.alpha is not None:
        how += f" · α = {info.alpha:g}"
    return how


@inputs.guarded
def caption_image(captions: CaptionService, image_id: Any, upload_path: str | None, beam: Any,
                  thumbs: ThumbSrc) -> str:
    """Every captioner's caption of the image, scored (CIDEr-D, self-retrieval rank per model)."""
    if not captions.captioners.names:
        return notice(NO_CAPTIONER, "info")
    q = inputs.image_query(image_id, upload_path, captions.search.config.max_upload_bytes)
    out = captions.caption_image(beam=inputs.parse_k(beam, 5), **q)
    cards = []
    for c in out.captions:
        cider = f'<span class="ltd-metric"><span>CIDEr-D</span><b>{c.cider:.3f}</b></span>' if c.cider is not None else ""
        cards.append(f'<section class="ltd-col"><div class="ltd-col-head"><h3>{esc(c.captioner)}</h3>'
                     f'<span class="ltd-muted">{esc(_how(c.info))}</span></div>'
                     + (f'<p class="ltd-gen">“{esc(c.caption)}”</p>' if c.caption.strip() else
                        '<p class="ltd-gen ltd-muted">(the captioner produced no words for this image)</p>')
                     + f'<div class="ltd-metrics">{cider}</div>'
                     + (f'<div class="ltd-ranks">{_rank_badges(c.retrieval)}</div>' if c.caption.strip() else "")
                     + "</section>")
    return (f'<div class="ltd-result">{_image_html(captions, out.image_id, thumbs, out.references)}'
            f'<div class="ltd-cols">{"".join(cards)}</div></div>')


@inputs.guarded
def check_caption(captions: CaptionService, caption: str | None, image_id: Any, upload_path: str | None) -> str:
    """How well a caption you wrote finds the image, under every retrieval model."""
    q = inputs.image_query(image_id, upload_path, captions.search.config.max_upload_bytes)
    out = captions.check_caption(caption or "", **q)
    cider = f" · CIDEr-D {out.cider:.3f} against its references" if out.cider is not None else ""
    return (f'<div class="ltd-result"><p class="ltd-gen">“{esc(out.caption)}”{esc(cider)}</p>'
            f'<div class="ltd-ranks">{_rank_badges(out.retrieval)}</div>'
            '<p class="ltd-muted">Rank 1: the caption picks this image out of the whole index. A caption that '
            'fits many images ranks it lower.</p></div>')


def build(ctx: UIContext) -> tuple[gr.Gallery, gr.State]:
    """The tab; returns its image picker (and the ids behind it) for the page's load event."""
    svc = ctx.captions
    with gr.Tab("Caption", id="caption", elem_id="tab-caption"):
        if not svc.captioners.names:
            gr.HTML(notice(NO_CAPTIONER, "info"))
        gallery_ids = gr.State([])
        with gr.Row():
            with gr.Column(scale=2, min_width=280):
                img_id, go = widgets.image_id_row("caption", "Caption it")
                beam = gr.Dropdown([1, 3, 5], value=5, label="Beam", min_width=80)
                gallery = gr.Gallery(label="…or click a dataset image", columns=4, height=240, allow_preview=False,
                                     object_fit="cover", elem_classes="ltd-picker", elem_id="caption-gallery")
                upload = widgets.upload_box(150)
            with gr.Column(scale=5):
                out = gr.HTML(EMPTY, elem_id="caption-results")
                with gr.Row(equal_height=False, elem_classes="ltd-qrow"):
                    mine = gr.Textbox(label="Your caption for this image", scale=6, elem_id="caption-mine",
                                      max_length=ctx.limits.max_query_chars,
                                      placeholder="write a caption: how discriminative is it?")
                    check = gr.Button("Check", scale=0, min_width=100, elem_id="caption-check")
                check_out = gr.HTML("", elem_id="caption-check-results")

    def run_caption(image_id, upload, beam):
        return caption_image(svc, image_id, upload, beam, ctx.thumbs)

    def pick(ids, beam, evt: gr.SelectData):
        if evt.index is None or not 0 <= evt.index < len(ids):
            return gr.skip(), gr.skip(), gr.skip()
        return str(ids[evt.index]), None, run_caption(ids[evt.index], None, beam)

    go.click(run_caption, [img_id, upload, beam], out)
    img_id.submit(run_caption, [img_id, upload, beam], out)
    upload.upload(lambda u, b: ("", run_caption(None, u, b)), [upload, beam], [img_id, out])
    gallery.select(pick, [gallery_ids, beam], [img_id, upload, out])
    check.click(lambda c, i, u: check_caption(svc, c, i, u), [mine, img_id, upload], check_out)
    mine.submit(lambda c, i, u: check_caption(svc, c, i, u), [mine, img_id, upload], check_out)
    return gallery, gallery_ids
