"""HTML of the UI: notices, the header, result grids and lists, query banners and metric chips.

Plain functions of results and the search service (no Gradio here), so every piece of the page is
testable without a browser. Images reach the browser through a ``ThumbSrc``: app/api hands the UI a
builder of REST thumbnail URLs; ``inline_thumbs`` embeds data URIs instead (no REST API needed).
"""
from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from search import SearchError, SearchResult, SearchService

ThumbSrc = Callable[[int, "str | None", int], str]
"""(image_id, model, size) → an ``src`` for an ``<img>`` tag."""


def inline_thumbs(service: SearchService) -> ThumbSrc:
    """Thumbnails embedded as data URIs: for a UI mounted without the REST API."""
    def src(image_id: int, model: str | None, size: int) -> str:
        try:
            data = service.thumbnail(int(image_id), size=size, model=model)
        except SearchError:
            return ""
        return "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
    return src


# ---- small HTML helpers -----------------------------------------------------------------------
def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def notice(message: str, kind: str = "info") -> str:
    """An inline message box: kind is info | warn | error | loading."""
    icon = {"info": "i", "warn": "!", "error": "!", "loading": "↻"}.get(kind, "i")
    return (f'<div class="ltd-notice ltd-{esc(kind)}" role="status"><span class="ltd-notice-icon">{icon}</span>'
            f"<span>{esc(message)}</span></div>")



# ---- models ------------------------------------------------------------------------------------
def loading_state(service: SearchService) -> str | None:
    """A notice while the service is not ready (or failed to load), None once it is."""
    health = service.registry.health()
    if health.detail:
        return notice(f"Loading the models failed: {health.detail}", "error")
    if health.status != "loading":
        return None
    return notice("Models are loading… the page updates by itself when they are ready.", "loading")


MARK = "ᴹ"
MARK_MEANS = "ᴹ: its captions or LTD targets come from a sentence model trained on Flickr30k/COCO captions"


def live_counts(service: SearchService, name: str, counts: dict) -> dict:
    """``counts`` (the manifest's) with the images and captions model ``name`` serves now: a living index
    grows and shrinks after its manifest was written."""
    e = service.registry.get(name)
    out = dict(counts)
    for key, side in (("images", e.index.images), ("captions", e.index.captions)):
        n = len(side.meta["ids"])
        dead = getattr(side.index, "dead", None)
        out[key] = n - int(np.count_nonzero(dead[:n])) if dead is not None else n
    return out


def model_label(service: SearchService, name: str) -> dict:
    """Short facts about a model for the header and the training tab (needs a ready service)."""
    info = service.model_info(name)
    loss = (info.model or {}).get("loss") or {}
    mode = loss.get("mode") or "none"
    kind = {"none": "baseline", "constraint": "LTD", "dual": "LTD (dual)"}.get(mode, mode)
    if loss.get("decoder") == "itd":
        kind = "ITD" + (" (dual)" if mode == "dual" else "")
    detail = ""
    if mode == "constraint" and loss.get("eta") is not None:
        detail = f"η = {float(loss['eta']):g}"
    elif mode == "dual" and loss.get("beta") is not None:
        detail = f"β = {float(loss['beta']):g}"
    ev = info.eval or {}
    if info.caption_corpora:  # its captions or LTD targets come from a model trained on Flickr30k/COCO captions
        kind += MARK
    return {"name": name, "kind": kind, "detail": detail, "loss": loss, "rsum": ev.get("rsum"),
            "dataset": info.dataset, "split": info.split, "counts": live_counts(service, name, info.counts or {}),
            "image_search": info.image_search, "ground_truth": info.ground_truth}


def header_html(service: SearchService) -> str:
    """Title bar: dataset/split and one chip per model with its eval rsum."""
    title = '<div class="ltd-title"><span class="ltd-logo">◐</span><div><h1>LTD retrieval</h1>'
    health = service.registry.health()  # the reasons a model is down name files, never the server's folders
    if health.status == "loading":
        state = loading_state(service) or ""
        chips = "".join(f'<span class="ltd-chip ltd-chip-wait">{esc(n)} · loading…</span>' for n in health.models)
        return (f'<header class="ltd-header">{title}<p>image ↔ caption ranking inspector</p></div></div>'
                f'<div class="ltd-chips">{chips}</div></header>{state}')
    labels = [model_label(service, n) for n in health.loaded]
    down = "".join(f'<span class="ltd-chip ltd-chip-down" title="{esc(r)}"><span class="ltd-chip-name">{esc(n)}</span>'
                   f'<span class="ltd-chip-kind">down</span>not loaded</span>' for n, r in health.down.items())
    if not labels:
        return (f'<header class="ltd-header">{title}<p>image ↔ caption ranking inspector</p></div></div>'
                f'<div class="ltd-chips">{down}</div></header>{loading_state(service) or ""}')
    first = labels[0]
    counts = first["counts"]
    sub = f"{esc(first['dataset'] or 'corpus')} · {esc(first['split'] or '')} split"
    if counts:
        sub += f" · {counts.get('images', 0):,} images · {counts.get('captions', 0):,} captions"
    chips = []
    for i, lb in enumerate(labels):
        rsum = f'<b>{lb["rsum"]:.1f}</b> rsum' if isinstance(lb["rsum"], (int, float)) else "no eval report"
        det = f" · {esc(lb['detail'])}" if lb["detail"] else ""
        why = f" ({MARK_MEANS})" if lb["kind"].endswith(MARK) else ""
        chips.append(f'<span class="ltd-chip ltd-m{i % 4}" title="{esc(lb["name"])}: {esc(lb["kind"])}{det}{esc(why)}">'
                     f'<span class="ltd-chip-name">{esc(lb["name"])}</span>'
                     f'<span class="ltd-chip-kind">{esc(lb["kind"])}{det}</span>{rsum}</span>')
    warn = notice("Not every model could be loaded: " + "; ".join(f"{n}: {r}" for n, r in health.down.items()),
                  "error") if health.down else ""
    return (f'<header class="ltd-header">{title}<p>{sub}</p></div></div>'
            f'<div class="ltd-chips">{"".join(chips)}{down}</div></header>{warn}')


def two_models(service: SearchService) -> tuple[str, str] | None:
    names = service.registry.names
    return (names[0], names[1]) if len(names) >= 2 else None


def need_two_notice(service: SearchService) -> str | None:
    names = service.registry.names
    if len(names) >= 2:
        return None
    return notice(f"Comparing needs two models; this server loaded one ({names[0]}). Start it with two, "
                  "e.g. `ltd serve --model bl=indexes/bl --model ltd=indexes/ltd`.", "info")



# ---- results -----------------------------------------------------------------------------------
def _state(gt: bool | None) -> tuple[str, str, str]:
    """(css class, glyph, words) of a hit."""
    if gt is True:
        return "gt", "✓", "ground truth"
    if gt is False:
        return "miss", "✗", "not a match"
    return "neutral", "", ""


def pick_metrics(res: SearchResult | None) -> dict[str, float]:
    """The metrics to show, as {label: value}: 1st GT rank, P@n and nDCG@n at the eval report's fixed
    cut-offs (P@5, nDCG@25, at most the index size); empty without ground truth."""
    if res is None or res.metrics is None or res.cutoffs is None:
        return {}
    c = res.cutoffs
    return {"1st GT rank": res.metrics.first_gt_rank, f"P@{c.p_at}": c.precision, f"nDCG@{c.ndcg_at}": c.ndcg}


def metrics_html(res: SearchResult, other: SearchResult | None = None) -> str:
    """Chips for first-GT rank, P@n and nDCG@n; with ``other``, the better of two models is marked ▲."""
    shown = pick_metrics(res)
    if not shown:
        return '<div class="ltd-metrics"><span class="ltd-metric ltd-muted">no ground truth for this query</span></div>'
    theirs = pick_metrics(other)
    rel = res.metrics.ndcg_relevance
    chips = []
    for label, v in shown.items():
        o = theirs.get(label)
        better = ""
        if o is not None:
            better = " ltd-better" if (v < o if label == "1st GT rank" else v > o + 1e-9) else ""
        value = f"{int(v)}" if label == "1st GT rank" else f"{float(v):.3f}"
        tip = {"1st GT rank": "rank of the first ground-truth item (lower is better)",
               }.get(label, f"{label} (higher is better)" + (f"; graded by {rel} relevance" if rel and label.startswith("nDCG") else ""))
        chips.append(f'<span class="ltd-metric{better}" title="{esc(tip)}"><span>{esc(label)}</span><b>{esc(value)}</b></span>')
    return f'<div class="ltd-metrics">{"".join(chips)}</div>'


ONLY_TIP = "only this model retrieved it: not in the other model's top-k"


ACTIONS_JS = """element.addEventListener('click', (ev) => {
  const b = ev.target.closest('.ltd-act[data-act]');
  if (!b) return;
  ev.preventDefault();
  ev.stopPropagation();
  const d = {iid: b.dataset.iid, model: b.dataset.model};
  if (b.dataset.act === 'remove') {
    if (!window.confirm('Remove image #' + d.iid + ' from model ' + d.model + '? It leaves every answer at once.')) return;
    trigger('unindex', d);
  } else if (b.dataset.act === 'similar') {
    trigger('similar', d);
  }
});"""
"""js_on_load of an HTML component showing result cards: a card's "more like this" fires the component's
``similar`` event and its "remove" (after the browser's confirmation) ``unindex``, with {iid, model}."""

ACTION_LABELS = {"similar": ("≈ More like this", "images like this one"),
                 "remove": ("✕ Remove", "remove this image from the index")}


def actions_html(image_id: int, model: str, actions: tuple[str, ...]) -> str:
    """A card's buttons (``similar``, ``remove``), read by ``ACTIONS_JS``."""
    if not actions:
        return ""
    buttons = "".join(f'<button type="button" class="ltd-act ltd-act-{a}" data-act="{a}" data-iid="{int(image_id)}" '
                      f'data-model="{esc(model)}" title="{esc(ACTION_LABELS[a][1])}">{esc(ACTION_LABELS[a][0])}</button>'
                      for a in actions if a in ACTION_LABELS)
    return f'<div class="ltd-acts">{buttons}</div>'


def image_grid_html(res: SearchResult, thumbs: ThumbSrc, shared: set[int] | None = None, size: int = 256,
                    actions: tuple[str, ...] = ()) -> str:
    """Thumbnail cards; with ``shared`` (ids both models retrieved) the others get a ◆ marker; ``actions``:
    the buttons of each card (``similar``: "more like this", ``remove``)."""
    if not res.hits:
        return notice("no results", "warn")
    cards = []
    for h in res.hits:
        cls, glyph, words = _state(h.ground_truth)
        rel = f" · ROUGE-L {h.relevance:.2f}" if h.relevance is not None else ""
        only = shared is not None and h.id not in shared
        title = f"#{h.rank} · image {h.id} · {h.filename or ''} · score {h.score:.4f}{rel}" + (f" · {words}" if words else "")
        badge = f'<span class="ltd-badge" aria-label="{esc(words)}">{glyph}</span>' if glyph else ""
        mark = f'<span class="ltd-only" title="{ONLY_TIP}">◆</span>' if only else ""
        cards.append(
            f'<figure class="ltd-card {cls}" title="{esc(title)}" data-image-id="{h.id}">'
            f'<div class="ltd-thumb"><img loading="lazy" decoding="async" src="{esc(thumbs(h.id, res.model, size))}" '
            f'alt="{esc(h.filename or h.id)}">{badge}<span class="ltd-rank">{h.rank}</span>{mark}</div>'
            f'<figcaption><span class="ltd-id">#{h.id}</span><span class="ltd-score">{h.score:.3f}</span></figcaption>'
            f"{actions_html(h.id, res.model, actions)}</figure>")
    return f'<div class="ltd-grid">{"".join(cards)}</div>'


def caption_list_html(res: SearchResult, thumbs: ThumbSrc, shared: set[int] | None = None) -> str:
    if not res.hits:
        return notice("no results", "warn")
    items = []
    for h in res.hits:
        cls, glyph, words = _state(h.ground_truth)
        rel = f" · ROUGE-L {h.relevance:.2f}" if h.relevance is not None else ""
        only = shared is not None and h.id not in shared
        img = ""
        if h.image_id is not None:
            img = (f'<img class="ltd-capimg" loading="lazy" decoding="async" src="{esc(thumbs(h.image_id, res.model, 96))}" '
                   f'alt="image {h.image_id}" title="this caption describes image #{h.image_id}">')
        badge = f'<span class="ltd-badge" aria-label="{esc(words)}">{glyph}</span>' if glyph else '<span class="ltd-badge"></span>'
        mark = f'<span class="ltd-only" title="{ONLY_TIP}">◆</span>' if only else ""
        items.append(
            f'<li class="ltd-cap {cls}" title="caption {h.id} · score {h.score:.4f}{esc(rel)}">'
            f'<span class="ltd-rank">{h.rank}</span>{badge}<span class="ltd-text">{esc(h.text or "")}{mark}</span>'
            f'<span class="ltd-score">{h.score:.3f}</span>{img}</li>')
    return f'<ol class="ltd-caps">{"".join(items)}</ol>'


def query_html(service: SearchService, model: str, res: SearchResult, thumbs: ThumbSrc,
               upload: bytes | None = None) -> str:
    """The query banner: the caption (with its ground-truth image) or the query image (with its captions)."""
    q = res.query
    parts = []
    if q.text is not None:
        tag = (f'<span class="ltd-tag">dataset caption #{q.caption_id}</span>' if q.caption_id is not None
               else '<span class="ltd-tag ltd-tag-free">free text · no ground truth</span>')
        parts.append(f'<div class="ltd-qtext"><span class="ltd-quote">“{esc(q.text)}”</span>{tag}</div>')
        if res.ground_truth_ids:
            imgs = "".join(f'<img src="{esc(thumbs(i, model, 128))}" alt="ground truth image {i}" '
                           f'title="ground-truth image #{i}">' for i in res.ground_truth_ids[:5])
            parts.append(f'<div class="ltd-qgt"><span>✓ ground truth</span>{imgs}</div>')
        return f'<div class="ltd-query">{"".join(parts)}</div>'
    if q.image_id is not None:
        img = f'<img class="ltd-qimg" src="{esc(thumbs(q.image_id, model, 256))}" alt="query image {q.image_id}">'
        desc = f'<span class="ltd-tag">dataset image #{q.image_id} · {esc(q.filename or "")}</span>'
    else:
        src = _upload_preview(upload) if upload else ""
        img = f'<img class="ltd-qimg" src="{src}" alt="uploaded image">' if src else ""
        desc = '<span class="ltd-tag ltd-tag-free">uploaded image · no ground truth</span>'
    gt = ""
    if res.ground_truth_ids:
        caps = []
        for cid in res.ground_truth_ids[:10]:
            try:
                caps.append(f"<li>{esc(service.caption(model, cid).text)}</li>")
            except SearchError:
                continue
        gt = (f'<details class="ltd-gtcaps" open><summary>✓ its {len(res.ground_truth_ids)} ground-truth captions</summary>'
              f'<ul>{"".join(caps)}</ul></details>')
    return f'<div class="ltd-query ltd-query-img">{img}<div>{desc}{gt}</div></div>'


def _upload_preview(data: bytes, size: int = 256) -> str:
    try:
        img = Image.open(io.BytesIO(data))
        img = img.convert("RGB")
        img.thumbnail((size, size))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=80)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    except Exception:  # noqa: BLE001 - a preview is optional
        return ""


def _timing(res: SearchResult) -> str:
    return f'<span class="ltd-muted">{len(res.hits)} results · {res.took_ms:.0f} ms</span>'


def legend_html(direction: str, has_gt: bool) -> str:
    if not has_gt:
        return ""
    what = "image" if direction == "t2i" else "caption"
    return (f'<div class="ltd-legend"><span class="ltd-key gt"><span class="ltd-badge">✓</span>ground-truth {what}</span>'
            f'<span class="ltd-key miss"><span class="ltd-badge">✗</span>not a match</span></div>')


SLICE_METRICS = ('<span class="ltd-muted" title="1st GT rank, P@n and nDCG@n rank the ground truth among the items '
                 'the filter keeps, as the ranking shown does">metrics: within the filter</span>')
"""The note beside a filtered result's metric chips: the service computes them among the filtered items."""


def result_html(query: str, res: Any, direction: str, ranking: str, note: str = "") -> str:
    """One search result: the query, a bar with metrics / legend / timing (and ``note``), then the ranking."""
    return (f'<div class="ltd-result">{query}'
            f'<div class="ltd-bar">{metrics_html(res)}{legend_html(direction, res.metrics is not None)}'
            f'{note}{_timing(res)}</div>{ranking}</div>')
