"""What the UI's events do: plain functions of the search service, returning HTML, table rows or a
figure. No Gradio in here, so every behaviour is testable without a browser.

Errors never escape as stack traces: the service's typed errors (``ServiceError`` and subclasses)
become an inline notice that shows their ``.detail``; anything else is logged and shown as one line.
Images reach the browser as ``<img>`` tags pointing at the REST thumbnail route (cached by the
service, lazily loaded), or as data URIs when the UI runs without that route (``inline_thumbs``).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import html
import io
import logging
import os
import random
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.service import NotReady, SearchResult, SearchService, ServiceError, decode_upload_check
from training.fsio import atomic_write_bytes

log = logging.getLogger(__name__)

K_CHOICES = [5, 10, 20, 50]
MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # the REST API's default; build_ui passes the server's setting
THUMB_URL = "/api/images/{id}/thumbnail?size={size}&model={model}"

ThumbSrc = Callable[[int, "str | None", int], str]
"""(image_id, model, size) → an ``src`` for an ``<img>`` tag."""


# ---- small HTML helpers -----------------------------------------------------------------------
def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def notice(message: str, kind: str = "info") -> str:
    """An inline message box: kind is info | warn | error | loading."""
    icon = {"info": "i", "warn": "!", "error": "!", "loading": "↻"}.get(kind, "i")
    return (f'<div class="ltd-notice ltd-{esc(kind)}" role="status"><span class="ltd-notice-icon">{icon}</span>'
            f"<span>{esc(message)}</span></div>")


def url_thumbs(template: str = THUMB_URL) -> ThumbSrc:
    """Thumbnails through the REST route (the browser caches them; the service caches the JPEGs)."""
    def src(image_id: int, model: str | None, size: int) -> str:
        return template.format(id=int(image_id), size=int(size), model=quote(model or "", safe=""))
    return src


def inline_thumbs(service: SearchService) -> ThumbSrc:
    """Thumbnails embedded as data URIs: for a UI mounted without the REST API."""
    def src(image_id: int, model: str | None, size: int) -> str:
        try:
            data = service.thumbnail(int(image_id), size=size, model=model)
        except ServiceError:
            return ""
        return "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
    return src


def guarded(fn: Callable[..., str]) -> Callable[..., str]:
    """Turn service errors into a notice (the detail, never a trace); log anything unexpected."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> str:
        try:
            return fn(*args, **kwargs)
        except NotReady as e:
            return notice(f"Models are still loading: {e.detail}. Try again in a moment.", "loading")
        except ServiceError as e:
            return notice(e.detail, "error")
        except Exception as e:  # noqa: BLE001 - the UI must answer with a message, not a trace
            log.exception("UI handler %s failed", fn.__name__)
            return notice(f"Something went wrong ({type(e).__name__}: {e}).", "error")
    return wrapper


def parse_k(k: Any, default: int = 10) -> int:
    try:
        k = int(k)
    except (TypeError, ValueError):
        return default
    return max(1, min(k, 1000))


def parse_id(value: Any, what: str) -> int | None:
    """A numeric id from a Number/Textbox value; None when empty; ServiceError when not a whole number."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ServiceError(f"{what} must be a whole number, got {value!r}") from None
    if f != int(f) or f < 0:
        raise ServiceError(f"{what} must be a non-negative whole number, got {value!r}")
    return int(f)


# ---- models ------------------------------------------------------------------------------------
def loading_state(service: SearchService) -> str | None:
    """A notice while the service is not ready (or failed to load), None once it is."""
    if service.load_error:
        return notice(f"Loading the models failed: {service.load_error}", "error")
    if service.ready.is_set():
        return None
    return notice("Models are loading… the page updates by itself when they are ready.", "loading")


def model_label(service: SearchService, name: str) -> dict:
    """Short facts about a model for the header and the training tab (needs a ready service)."""
    info = service.model_info(name)
    loss = (info.get("model") or {}).get("loss") or {}
    mode = loss.get("mode") or "none"
    kind = {"none": "baseline", "constraint": "LTD", "dual": "LTD (dual)"}.get(mode, mode)
    if loss.get("decoder") == "itd":
        kind = "ITD" + (" (dual)" if mode == "dual" else "")
    detail = ""
    if mode == "constraint" and loss.get("eta") is not None:
        detail = f"η = {float(loss['eta']):g}"
    elif mode == "dual" and loss.get("beta") is not None:
        detail = f"β = {float(loss['beta']):g}"
    ev = info.get("eval") or {}
    return {"name": name, "kind": kind, "detail": detail, "loss": loss, "rsum": ev.get("rsum"),
            "dataset": info.get("dataset"), "split": info.get("split"), "counts": info.get("counts") or {},
            "image_search": info.get("image_search", True), "ground_truth": info.get("ground_truth")}


def header_html(service: SearchService) -> str:
    """Title bar: dataset/split and one chip per model with its eval rsum."""
    title = '<div class="ltd-title"><span class="ltd-logo">◐</span><div><h1>LTD retrieval</h1>'
    if not service.ready.is_set():
        state = loading_state(service) or ""
        chips = "".join(f'<span class="ltd-chip ltd-chip-wait">{esc(n)} · loading…</span>' for n in service.names)
        return (f'<header class="ltd-header">{title}<p>image ↔ caption ranking inspector</p></div></div>'
                f'<div class="ltd-chips">{chips}</div></header>{state}')
    labels = [model_label(service, n) for n in service.names if n in service.entries]
    down = "".join(f'<span class="ltd-chip ltd-chip-down" title="{esc(r)}"><span class="ltd-chip-name">{esc(n)}</span>'
                   f'<span class="ltd-chip-kind">down</span>not loaded</span>' for n, r in service.failed.items())
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
        chips.append(f'<span class="ltd-chip ltd-m{i % 4}" title="{esc(lb["name"])}: {esc(lb["kind"])}{det}">'
                     f'<span class="ltd-chip-name">{esc(lb["name"])}</span>'
                     f'<span class="ltd-chip-kind">{esc(lb["kind"])}{det}</span>{rsum}</span>')
    warn = notice("Not every model could be loaded: " + "; ".join(f"{n}: {r}" for n, r in service.failed.items()),
                  "error") if service.failed else ""
    return (f'<header class="ltd-header">{title}<p>{sub}</p></div></div>'
            f'<div class="ltd-chips">{"".join(chips)}{down}</div></header>{warn}')


def two_models(service: SearchService) -> tuple[str, str] | None:
    names = service.names
    return (names[0], names[1]) if len(names) >= 2 else None


def need_two_notice(service: SearchService) -> str | None:
    if len(service.names) >= 2:
        return None
    return notice(f"Comparing needs two models; this server loaded one ({service.names[0]}). Start it with two, "
                  "e.g. `ltd serve --model bl=indexes/bl --model ltd=indexes/ltd`.", "info")


# ---- query pickers -----------------------------------------------------------------------------
def random_caption(service: SearchService, model: str, seed: int | None = None, exclude: int | None = None) -> dict:
    """One random dataset caption {id, text, image_id}: searching it attaches ground truth. ``exclude``
    (the caption on screen) is skipped so that the button always changes something."""
    rng = random.Random(seed)
    picks = service.sample_captions(model, 8, seed=rng.randrange(1 << 30))
    if not picks:
        raise ServiceError(f"model {model}'s index has no captions")
    fresh = [c for c in picks if exclude is None or c["id"] != exclude] or picks
    return fresh[rng.randrange(len(fresh))]


def example_captions(service: SearchService, model: str, n: int = 8, seed: int = 0) -> list[dict]:
    return service.sample_captions(model, n, seed=seed)


def text_query(text: str | None, picked: dict | None) -> dict:
    """The query for a text box: the picked dataset caption (with ground truth) while the box still
    holds its text, free text otherwise."""
    text = (text or "").strip()
    if picked and picked.get("id") is not None and text and " ".join(text.split()) == " ".join(str(picked.get("text", "")).split()):
        return {"caption_id": int(picked["id"])}
    if not text:
        raise ServiceError("Type a query, or pick a dataset caption (⚄ random caption, or an example) to see ground truth.")
    return {"query": text}


def read_upload(upload_path: str, max_bytes: int) -> bytes:
    """The bytes of a file the browser uploaded through this UI. Gradio already refuses input paths
    outside its upload folder (app.main marks the mounted Blocks as launched for that); this checks
    again, and reads only regular files, never more than ``max_bytes`` (no device files, no FIFOs)."""
    from gradio.utils import get_upload_folder

    try:
        p = Path(upload_path).resolve(strict=True)
        st = p.stat()
    except (OSError, RuntimeError):
        raise ServiceError("the uploaded file is gone; upload it again") from None
    if not p.is_relative_to(Path(get_upload_folder()).resolve()) or not stat.S_ISREG(st.st_mode):
        raise ServiceError("only images uploaded through this page can be searched")
    if st.st_size > max_bytes:
        raise ServiceError(f"upload of {st.st_size:,} bytes exceeds the limit of {max_bytes:,} bytes")
    with open(p, "rb") as f:
        data = f.read(max_bytes + 1)
    decode_upload_check(data, max_bytes)
    return data


def image_query(image_id: Any, upload_path: str | None, max_bytes: int = MAX_UPLOAD_BYTES) -> dict:
    """The query for the image inputs: an uploaded file wins over a dataset image id."""
    if upload_path:
        return {"image_bytes": read_upload(upload_path, max_bytes)}
    iid = parse_id(image_id, "image id")
    if iid is None:
        raise ServiceError("Pick a dataset image (click one in the gallery or type its id), or upload an image.")
    return {"image_id": iid}


THUMB_DIR = Path(os.environ.get("LTD_UI_THUMBS", Path(tempfile.gettempdir()) / "ltd-ui-thumbs"))


def thumb_file(service: SearchService, image_id: int, model: str | None, size: int = 160) -> str:
    """A thumbnail JPEG on disk, for gr.Gallery (which serves files, not bytes)."""
    data = service.thumbnail(int(image_id), size=size, model=model)
    digest = hashlib.sha1(data).hexdigest()[:16]
    path = THUMB_DIR / f"{int(image_id)}_{size}_{digest}.jpg"
    if not path.is_file():
        atomic_write_bytes(path, data, durable=False)  # a cache: rebuilt when lost
    return str(path)


def image_picker(service: SearchService, model: str, n: int = 24, seed: int = 0) -> tuple[list[tuple[str, str]], list[int]]:
    """Gallery items [(thumbnail path, "#id")] and their image ids: dataset images to query with."""
    ids: list[int] = []
    for c in service.sample_captions(model, n * 4, seed=seed):
        if c.get("image_id") is not None and c["image_id"] not in ids:
            ids.append(int(c["image_id"]))
        if len(ids) >= n:
            break
    items = []
    for i in ids:
        try:
            items.append((thumb_file(service, i, model), f"#{i}"))
        except ServiceError:
            continue
    return items, [int(lbl[1:]) for _, lbl in items]


# ---- rendering results -------------------------------------------------------------------------
def _state(gt: bool | None) -> tuple[str, str, str]:
    """(css class, glyph, words) of a hit."""
    if gt is True:
        return "gt", "✓", "ground truth"
    if gt is False:
        return "miss", "✗", "not a match"
    return "neutral", "", ""


def pick_metrics(metrics: dict | None) -> dict[str, float]:
    """The metrics to show, as {label: value}: 1st GT rank, P@n and nDCG@n (fixed cut-offs, as in the
    eval report), falling back to the service's at-k values when it gives no fixed ones."""
    if not metrics:
        return {}
    out: dict[str, float] = {}
    if isinstance(metrics.get("first_gt_rank"), (int, float)):
        out["1st GT rank"] = metrics["first_gt_rank"]
    k = metrics.get("k")
    for head, label in (("p", "P"), ("ndcg", "nDCG")):
        fixed = [key for key, v in metrics.items() if key.startswith(head + "@") and key[len(head) + 1:].isdigit()
                 and isinstance(v, (int, float))]
        if fixed:
            key = fixed[0]
            out[f"{label}@{key.split('@')[1]}"] = metrics[key]
        elif isinstance(metrics.get(f"{head}@k"), (int, float)):
            out[f"{label}@{k if k is not None else 'k'}"] = metrics[f"{head}@k"]
    return out


def metrics_html(metrics: dict | None, other: dict | None = None) -> str:
    """Chips for first-GT rank, P@n and nDCG@n; with ``other``, the better of two models is marked ▲."""
    shown = pick_metrics(metrics)
    if not shown:
        return '<div class="ltd-metrics"><span class="ltd-metric ltd-muted">no ground truth for this query</span></div>'
    theirs = pick_metrics(other)
    rel = (metrics or {}).get("ndcg_relevance")
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


def image_grid_html(res: SearchResult, thumbs: ThumbSrc, shared: set[int] | None = None, size: int = 256) -> str:
    """Thumbnail cards; with ``shared`` (ids both models retrieved) the others get a ◆ marker."""
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
            f"</figure>")
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
    if "text" in q:
        tag = (f'<span class="ltd-tag">dataset caption #{q["caption_id"]}</span>' if "caption_id" in q
               else '<span class="ltd-tag ltd-tag-free">free text · no ground truth</span>')
        parts.append(f'<div class="ltd-qtext"><span class="ltd-quote">“{esc(q["text"])}”</span>{tag}</div>')
        if res.ground_truth_ids:
            imgs = "".join(f'<img src="{esc(thumbs(i, model, 128))}" alt="ground truth image {i}" '
                           f'title="ground-truth image #{i}">' for i in res.ground_truth_ids[:5])
            parts.append(f'<div class="ltd-qgt"><span>✓ ground truth</span>{imgs}</div>')
        return f'<div class="ltd-query">{"".join(parts)}</div>'
    if "image_id" in q:
        img = f'<img class="ltd-qimg" src="{esc(thumbs(q["image_id"], model, 256))}" alt="query image {q["image_id"]}">'
        desc = f'<span class="ltd-tag">dataset image #{q["image_id"]} · {esc(q.get("filename") or "")}</span>'
    else:
        src = _upload_preview(upload) if upload else ""
        img = f'<img class="ltd-qimg" src="{src}" alt="uploaded image">' if src else ""
        desc = '<span class="ltd-tag ltd-tag-free">uploaded image · no ground truth</span>'
    gt = ""
    if res.ground_truth_ids:
        caps = []
        for cid in res.ground_truth_ids[:10]:
            try:
                caps.append(f"<li>{esc(service.caption(model, cid)['text'])}</li>")
            except ServiceError:
                continue
        gt = (f'<details class="ltd-gtcaps" open><summary>✓ its {len(res.ground_truth_ids)} ground-truth captions</summary>'
              f'<ul>{"".join(caps)}</ul></details>')
    return f'<div class="ltd-query ltd-query-img">{img}<div>{desc}{gt}</div></div>'


def _upload_preview(data: bytes, size: int = 256) -> str:
    try:
        from PIL import Image

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


# ---- Search tab --------------------------------------------------------------------------------
@guarded
def search_text(service: SearchService, model: str, text: str | None, picked: dict | None, k: Any,
                thumbs: ThumbSrc) -> str:
    """Text → images: a grid of thumbnails, ground truth outlined when the query is a dataset caption."""
    res = service.search_text(model, k=parse_k(k), **text_query(text, picked))
    return _result_html(query_html(service, model, res, thumbs), res, "t2i", image_grid_html(res, thumbs))


@guarded
def search_image(service: SearchService, model: str, image_id: Any, upload_path: str | None, k: Any,
                 thumbs: ThumbSrc, max_bytes: int = MAX_UPLOAD_BYTES) -> str:
    """Image → captions: a ranked list, ground-truth captions marked when the image is a dataset image."""
    q = image_query(image_id, upload_path, max_bytes)
    res = service.search_image(model, k=parse_k(k), **q)
    return _result_html(query_html(service, model, res, thumbs, q.get("image_bytes")), res, "i2t",
                        caption_list_html(res, thumbs))


def _result_html(query: str, res: Any, direction: str, ranking: str) -> str:
    """One search result: the query, a bar with metrics / legend / timing, then the ranking."""
    return (f'<div class="ltd-result">{query}'
            f'<div class="ltd-bar">{metrics_html(res.metrics)}{legend_html(direction, res.metrics is not None)}'
            f'{_timing(res)}</div>{ranking}</div>')


# ---- Compare tab -------------------------------------------------------------------------------
@guarded
def compare(service: SearchService, a: str, b: str, query: dict, k: Any, thumbs: ThumbSrc) -> str:
    """Two models side by side on one query (``query``: one of query/caption_id/image_id/image_bytes)."""
    if len(service.names) < 2:
        return need_two_notice(service) or ""
    if not a or not b or a == b:
        raise ServiceError("Pick two different models to compare.")
    k = parse_k(k)
    out = service.compare([a, b], k=k, **query)
    ra, rb = out["results"]
    shared = set(out["overlap_ids"])
    n = max(len(ra.hits), len(rb.hits), 1)
    overlap = (f'<div class="ltd-overlap"><b>{out["overlap"]}</b> of top-{n} shared '
               f'<span class="ltd-overlap-bar"><span style="width:{100 * out["overlap"] / n:.0f}%"></span></span>'
               + (f'<span class="ltd-muted">◆ only that model retrieved it</span>' if out["overlap"] < n else "")
               + "</div>")
    render = image_grid_html if out["direction"] == "t2i" else caption_list_html
    cols = []
    for i, (r, other) in enumerate(((ra, rb), (rb, ra))):
        lb = model_label(service, r.model)
        det = f" · {esc(lb['detail'])}" if lb["detail"] else ""
        cols.append(f'<section class="ltd-col"><div class="ltd-col-head ltd-m{i}"><h3>{esc(r.model)}</h3>'
                    f'<span class="ltd-muted">{esc(lb["kind"])}{det}</span></div>'
                    f'{metrics_html(r.metrics, other.metrics)}{render(r, thumbs, shared)}</section>')
    has_gt = ra.metrics is not None
    return (f'<div class="ltd-result">{query_html(service, a, ra, thumbs, query.get("image_bytes"))}'
            f'<div class="ltd-bar">{overlap}{legend_html(out["direction"], has_gt)}</div>'
            f'<div class="ltd-cols">{"".join(cols)}</div></div>')


def compare_text(service: SearchService, a: str, b: str, text: str | None, picked: dict | None, k: Any,
                 thumbs: ThumbSrc) -> str:
    try:
        q = text_query(text, picked)
    except ServiceError as e:
        return notice(e.detail, "error")
    return compare(service, a, b, q, k, thumbs)


def compare_image(service: SearchService, a: str, b: str, image_id: Any, upload_path: str | None, k: Any,
                  thumbs: ThumbSrc, max_bytes: int = MAX_UPLOAD_BYTES) -> str:
    try:
        q = image_query(image_id, upload_path, max_bytes)
    except ServiceError as e:
        return notice(e.detail, "error")
    return compare(service, a, b, q, k, thumbs)


# ---- Explorer tab ------------------------------------------------------------------------------
EXPLORER_HEADERS = ["dir", "id", "query", "rank A", "rank B", "P@5 A", "P@5 B", "nDCG A", "nDCG B", "better", "Δ"]
"""Δ = |log2(rank A / rank B)| of the first ground truth: 1 means one model ranks it twice as high."""


def explorer_headers(a: str, b: str) -> list[str]:
    return [h.replace(" A", f" {a}").replace(" B", f" {b}") for h in EXPLORER_HEADERS]


def explorer(service: SearchService, a: str, b: str, direction: str = "both", winner: str = "any",
             limit: int = 200, thumbs: ThumbSrc | None = None) -> tuple[list[list], list[dict], str]:
    """(table rows, raw rows, summary HTML) of the queries sorted by disagreement between a and b.

    ``winner`` is any | a | b | tie (which model ranks the ground truth higher). With ``thumbs``, image
    queries show a thumbnail in the query cell (an HTML column)."""
    if len(service.names) < 2:
        return [], [], need_two_notice(service) or ""
    if not a or not b or a == b:
        return [], [], notice("Pick two different models.", "error")
    try:
        all_rows = service.explorer(a, b, direction=direction, limit=10**9)
    except NotReady as e:
        return [], [], notice(f"Models are still loading: {e.detail}.", "loading")
    except ServiceError as e:
        return [], [], notice(e.detail, "error")
    wins = {w: sum(r["winner"] == w for r in all_rows) for w in ("a", "b", "tie")}
    rows = [r for r in all_rows if winner not in ("a", "b", "tie") or r["winner"] == winner][: max(1, int(limit))]
    name = {"a": a, "b": b, "tie": "tie"}
    def query_cell(r: dict) -> str:
        if thumbs is None:
            return str(r["query"])
        if r["direction"] == "i2t":
            return (f'<span class="ltd-xq"><img src="{esc(thumbs(r["query_id"], a, 96))}" alt="" loading="lazy">'
                    f'{esc(r["query"])}</span>')
        return esc(r["query"])

    def rnd(v, nd):
        return None if v is None else round(float(v), nd)

    table = [[r["direction"], r["query_id"], query_cell(r), r["a_rank"], r["b_rank"], rnd(r["a_p@k"], 2), rnd(r["b_p@k"], 2),
              rnd(r["a_ndcg"], 3), rnd(r["b_ndcg"], 3), name[r["winner"]], rnd(r["disagreement"], 2)] for r in rows]
    scope = {"t2i": "text → image queries", "i2t": "image → text queries"}.get(direction, "queries")
    total = len(all_rows)
    summary = (f'<div class="ltd-explorer-sum"><span class="ltd-win ltd-m1"><b>{esc(b)}</b> ranks the ground truth higher '
               f'for <b>{wins["b"]}</b></span><span class="ltd-win ltd-m0"><b>{esc(a)}</b> for <b>{wins["a"]}</b></span>'
               f'<span class="ltd-win">tie <b>{wins["tie"]}</b></span><span class="ltd-muted">of {total} {scope} · '
               f'showing {len(rows)} · Δ = |log₂ of the ratio of the two first-GT ranks| · '
               'click a row to open it in Compare</span></div>')
    if not rows:
        summary += notice("No query matches these filters.", "info")
    return table, rows, summary


def explorer_pick(rows: list[dict], index: Any = None, row_value: list | None = None) -> dict:
    """The Compare query for a clicked Explorer row: {"direction", "caption_id" | "image_id", "text"?}.

    ``row_value`` (the clicked row as displayed) is preferred, so sorting the table in the browser does
    not break the mapping; ``index`` (row number, or (row, col)) is the fallback."""
    if row_value:
        d, qid = str(row_value[0]), int(row_value[1])
        match = next((r for r in rows if r["direction"] == d and int(r["query_id"]) == qid), None)
        if match is None:
            match = {"direction": d, "query_id": qid, "query": row_value[2] if len(row_value) > 2 else ""}
    else:
        i = index[0] if isinstance(index, (list, tuple)) else index
        if i is None or not 0 <= int(i) < len(rows):
            raise ServiceError("that row is no longer in the table; refresh the explorer")
        match = rows[int(i)]
    if match["direction"] == "t2i":
        return {"direction": "t2i", "caption_id": int(match["query_id"]), "text": str(match.get("query", ""))}
    return {"direction": "i2t", "image_id": int(match["query_id"])}


# ---- Training tab ------------------------------------------------------------------------------
REPORT_COLUMNS = [("i2t_R@1", "i2t R@1"), ("i2t_R@5", "i2t R@5"), ("i2t_R@10", "i2t R@10"),
                  ("t2i_R@1", "t2i R@1"), ("t2i_R@5", "t2i R@5"), ("t2i_R@10", "t2i R@10"), ("rsum", "rsum"),
                  ("i2t_R-P", "i2t R-P"), ("t2i_R-P", "t2i R-P")]


def _ndcg_keys(report: dict) -> list[str]:
    return sorted(k for k in report if "nDCG" in k)


def report_table(service: SearchService, names: list[str] | None = None) -> tuple[list[str], list[list]]:
    """(headers, rows): one row per model with its eval report (R@1/5/10 both ways, rsum, R-P, nDCG)."""
    names = [n for n in (names or service.names) if n in service.names]
    reports = {}
    for n in names:
        lb = model_label(service, n)
        reports[n] = (lb, service.model_info(n).get("eval") or {})
    nd = sorted({k for _, r in reports.values() for k in _ndcg_keys(r)})
    headers = ["model", "loss"] + [h for _, h in REPORT_COLUMNS] + [k.replace("_rougeL", " (ROUGE-L)").replace("_", " ") for k in nd]
    rows = []
    for n, (lb, rep) in reports.items():
        loss = lb["kind"] + (f" ({lb['detail']})" if lb["detail"] else "")
        vals = [rep.get(k) for k, _ in REPORT_COLUMNS] + [rep.get(k) for k in nd]
        rows.append([n, loss] + [None if v is None else round(float(v), 4 if abs(float(v)) < 2 else 1) for v in vals])
    return headers, rows


def training_series(service: SearchService, names: list[str]) -> tuple[list[tuple[str, float | None, list[dict]]], list[str]]:
    """([(label, eta, metrics rows)], names without a metrics file)."""
    from training.plots import label_for

    series, missing = [], []
    for n in names:
        rows = service.training_metrics(n)
        if not rows:
            missing.append(n)
            continue
        label, eta = label_for(n, model_label(service, n)["loss"])
        series.append((label, eta, rows))
    return series, missing


_PYPLOT_LOCK = threading.Lock()


def training_figure(service: SearchService, names: list[str] | None = None, smooth: int = 5):
    """(matplotlib figure or None, notice HTML): λ (log), L_rec with the η line, L_con, val rsum."""
    from training.plots import figure_from_rows, plt

    names = [n for n in (names or []) if n in service.names]
    if not names:
        return None, notice("Select at least one model.", "info")
    try:
        series, missing = training_series(service, names)
    except NotReady as e:
        return None, notice(f"Models are still loading: {e.detail}.", "loading")
    except ServiceError as e:
        return None, notice(e.detail, "error")
    msg = ""
    if missing:
        msg = notice(f"No metrics.jsonl next to the checkpoint of: {', '.join(missing)} (trained elsewhere?).", "warn")
    if not series:
        return None, msg
    with _PYPLOT_LOCK:  # pyplot's figure registry is not thread-safe; Gradio runs events in threads
        fig = figure_from_rows(series, smooth=max(1, int(smooth)), figsize=(11, 6.2))
        plt.close(fig)  # Gradio renders the Figure object itself; keep pyplot's registry from growing
    return fig, msg
