"""HTML of the explanations: a query's words shaded by what they contribute (one row per model), the
words two models use differently over a split, and the side-by-side embedding maps.

Plain functions of the service's typed results (no Gradio), like ui/render.py; every string that
comes from a user or a dataset is escaped. Clickable items carry ``data-cid`` (a caption id) or
``data-iid`` (an image id): the tabs' ``CLICK_JS`` turns a click on one into an ``open`` event.
"""
from __future__ import annotations

import re

import numpy as np

from search import EmbeddingMap, Explanation, ModelAttribution, SearchService, WordStat, WordUsage
from search.embedmap import captions_with_word, images_with_word
from ui.render import ThumbSrc, esc

CLICK_JS = """element.addEventListener('click', (ev) => {
  const t = ev.target.closest('[data-cid],[data-iid]');
  if (t) { ev.preventDefault(); trigger('open', {cid: t.dataset.cid || null, iid: t.dataset.iid || null}); }
});"""
"""js_on_load of an HTML component whose items open a query: fires the component's ``open`` event."""

HELPS, HURTS = (79, 70, 229), (202, 138, 4)  # indigo: the word raises the image's score; amber: lowers it


def _md_emphasis(text: str) -> str:
    """Escape, then turn *word* into <em>word</em> (the service's sentences mark words that way)."""
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", esc(text))


def _shade(delta: float, scale: float) -> str:
    alpha = 0.0 if scale <= 0 else min(1.0, abs(delta) / scale) * 0.85
    r, g, b = HELPS if delta >= 0 else HURTS
    ink = "#fff" if alpha > 0.45 else "inherit"
    return f"background:rgba({r},{g},{b},{alpha:.2f});color:{ink}"


def _rank_mark(d: int) -> str:
    if d > 0:
        return f'<sub class="ltd-dr ltd-dr-down">▼{d}</sub>'
    if d < 0:
        return f'<sub class="ltd-dr ltd-dr-up">▲{-d}</sub>'
    return ""


def words_row_html(m: ModelAttribution, scale: float, index: int, kind: str = "") -> str:
    """One model's row: its rank and score for the image, then the query with each word shaded."""
    head = (f'<div class="ltd-attr-head ltd-m{index % 4}"><b>{esc(m.model)}</b>'
            + (f'<span class="ltd-muted">{esc(kind)}</span>' if kind else "")
            + f'<span class="ltd-attr-rank">rank <b>{m.rank:,}</b> of {m.of:,} · score {m.score:.3f}</span></div>')
    if not m.words:
        return f'<div class="ltd-attr-row">{head}<div class="ltd-attr-words ltd-muted">{esc(m.note or "")}</div></div>'
    parts, at = [], 0
    for w in m.words:
        parts.append(esc(m.text[at:w.start]))
        drop = (f"drops {w.delta_rank} place{'s' * (w.delta_rank != 1)}" if w.delta_rank > 0 else
                f"rises {-w.delta_rank} place{'s' * (w.delta_rank != -1)}" if w.delta_rank < 0 else "keeps its rank")
        tip = (f"without “{w.word}”: rank {m.rank} → {w.rank_without} (the image {drop}); score {m.score:.4f} → "
               f"{w.score_without:.4f} (Δscore {w.delta_score:+.4f})")
        parts.append(f'<span class="ltd-w" style="{_shade(w.delta_score, scale)}" title="{esc(tip)}" '
                     f'data-delta-score="{w.delta_score:.6f}" data-delta-rank="{w.delta_rank}">{esc(w.word)}'
                     f'{_rank_mark(w.delta_rank)}</span>')
        at = w.end
    parts.append(esc(m.text[at:]))
    return f'<div class="ltd-attr-row">{head}<div class="ltd-attr-words">{"".join(parts)}</div></div>'


def attribution_html(ex: Explanation, thumbs: ThumbSrc, *, kinds: dict[str, str] | None = None,
                     why: str = "", upload_src: str = "") -> str:
    """The panel: the explained image, one shaded row per model (one colour scale for all), the sentences."""
    scale = max((abs(w.delta_score) for m in ex.results for w in m.words), default=0.0)
    rows = "".join(words_row_html(m, scale, i, (kinds or {}).get(m.model, "")) for i, m in enumerate(ex.results))
    if ex.image_id is not None:
        src = thumbs(ex.image_id, ex.results[0].model if ex.results else None, 160)
        img = f'<img class="ltd-attr-img" src="{esc(src)}" alt="image {ex.image_id}">'
        label = f"image #{ex.image_id}" + (f" · {esc(why)}" if why else "")
    else:
        img = f'<img class="ltd-attr-img" src="{esc(upload_src)}" alt="uploaded image">' if upload_src else ""
        label = "the uploaded image"
    sentences = "".join(f"<li>{_md_emphasis(s)}</li>" for s in ex.summary)
    legend = ('<div class="ltd-attr-legend ltd-muted">each word removed in turn: <span class="ltd-sw" '
              'style="background:rgb(79,70,229)"></span>it raised the image\'s score <span class="ltd-sw" '
              'style="background:rgb(202,138,4)"></span>it lowered it (darker: more) · ▼n: without it the image drops '
              'n places, ▲n: rises n, no mark: same rank · hover a word for its numbers · click a result image below '
              'to explain that one</div>')
    return (f'<section class="ltd-attr"><div class="ltd-attr-side">{img}<span class="ltd-muted">{label}</span></div>'
            f'<div class="ltd-attr-main"><h4>What each word does for this image, per model</h4>{rows}'
            f'<ul class="ltd-attr-sum">{sentences}</ul>{legend}</div></section>')


# ---- whole split ---------------------------------------------------------------------------------
def _bars(w: WordStat, scale: float) -> str:
    return (f'<span class="ltd-bars" title="how far removing it moves the caption\'s image (mean |log2 rank ratio|): '
            f'{w.a_moves:.2f} under A, {w.b_moves:.2f} under B">'
            f'<span class="ltd-bar-a" style="width:{100 * w.a_moves / scale:.0f}%"></span>'
            f'<span class="ltd-bar-b" style="width:{100 * w.b_moves / scale:.0f}%"></span></span>')


def _examples(w: WordStat, a: str, b: str) -> str:
    def eff(d: int) -> str:
        return "same" if d == 0 else f"▼{d}" if d > 0 else f"▲{-d}"
    return "".join(f'<a class="ltd-ex" href="#" data-cid="{x.caption_id}" title="open in Compare">“{esc(x.text)}”'
                   f'<span class="ltd-muted"> {esc(a)} {eff(x.a_delta_rank)} · {esc(b)} {eff(x.b_delta_rank)}</span></a>'
                   for x in w.examples)


def _word_list(title: str, rows: list[WordStat], u: WordUsage, scale: float) -> str:
    items = []
    for w in rows:
        ci = "no interval: one image" if not np.isfinite(w.gap_ci) else f"± {w.gap_ci:.2f}"
        ns = "" if w.shown else ' <span class="ltd-ns" title="the 95% interval includes 0">ns</span>'
        # three aligned columns (word and counts | bars | numbers), the example queries below
        items.append(f'<li class="ltd-wordrow"><div class="ltd-wordhead"><span class="ltd-wordname">'
                     f'<b class="ltd-word">{esc(w.word)}</b><span class="ltd-muted">{w.n:,}× in {w.images:,} '
                     f'images</span></span>{_bars(w, scale)}<span class="ltd-wordnums"><span class="ltd-gap">moves '
                     f'{esc(u.a)} {w.a_moves:.2f} → {esc(u.b)} {w.b_moves:.2f} ({w.gap:+.2f} {ci}){ns}</span>'
                     f'<span class="ltd-muted">rank changed {w.a_changed:.0%} / {w.b_changed:.0%}</span></span>'
                     f'</div><div class="ltd-exs">{_examples(w, u.a, u.b)}</div></li>')
    body = "".join(items) or '<li class="ltd-muted">none</li>'
    return f'<div class="ltd-wordcol"><h4>{esc(title)}</h4><ol class="ltd-words">{body}</ol></div>'


def _overall(u: WordUsage) -> str:
    o = u.overall
    if o is None:
        return ""
    return (f" Every word together: {esc(u.a)} {o.a_moves:.3f}, {esc(u.b)} {o.b_moves:.3f} "
            f"({o.gap:+.3f} ± {o.gap_ci:.3f}).")


def words_html(u: WordUsage, top: int = 15, clickable: bool = True) -> str:
    """The Explorer's words view: what b uses and a ignores, and the reverse, with example queries."""
    a, b = esc(u.a), esc(u.b)
    lists = (u.b_uses(top), u.a_uses(top))
    scale = max((max(w.a_moves, w.b_moves) for ws in lists for w in ws), default=1.0) or 1.0
    head = (f'<div class="ltd-explorer-sum"><span class="ltd-muted">Every caption of the split with its own image, '
            f'each word removed in turn ({u.occurrences:,} occurrences in {u.captions:,} captions; words seen at least '
            f'{u.min_count}×). <i>moves</i>: how far removing the word moves the image\'s rank, as the mean '
            '|log₂(rank without / rank with)| (1: halved or doubled; 0: the model ignores the word), bars for '
            f'<b class="ltd-m0">{a}</b> / <b class="ltd-m1">{b}</b>; the gap has a 95% interval clustered by image '
            f'(ns: includes 0; one interval per word, not corrected for comparing {len(u.words):,} words), and the '
            'surest differences come first.' + _overall(u)
            + (' Click an example to open it in Compare.' if clickable else '') + '</span></div>')
    cols = (_word_list(f"Words {u.b} uses and {u.a} ignores", lists[0], u, scale)
            + _word_list(f"Words {u.a} uses and {u.b} ignores", lists[1], u, scale))
    return f'{head}<div class="ltd-wordcols">{cols}</div>'


# ---- embedding maps ------------------------------------------------------------------------------
GREY = "#cbd5e1"


def _diverging(v: float, span: float) -> str:
    """Signed log2 rank ratio → colour: > 0 model B (cyan) ranks the ground truth higher, < 0 model A (indigo)."""
    if not np.isfinite(v) or v == 0 or span <= 0:
        return GREY
    t = min(1.0, abs(v) / span)
    r, g, b = (8, 145, 178) if v > 0 else (79, 70, 229)
    mix = [int(round(c * t + 203 * (1 - t))) for c in (r, g, b)]
    return f"rgb({mix[0]},{mix[1]},{mix[2]})"


def map_svg(m: EmbeddingMap, colors: tuple[list[str], list[str]], texts: list[str], filenames: list[str], *,
            caption_rows: np.ndarray, index: int, size: int = 460) -> str:
    """One model's map: captions as dots, images as squares; highlighted (non-grey) points drawn last.
    ``colors``: (caption colours, image colours), as ``map_colors_by_disagreement`` and
    ``map_colors_by_word`` give them."""
    cap_color, img_color = colors
    pts = np.concatenate([m.images, m.captions[caption_rows]]) if len(caption_rows) else m.images
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)

    def xy(p) -> tuple[float, float]:
        x, y = (p - lo) / span
        return 8 + x * (size - 16), 8 + (1 - y) * (size - 16)

    items = []
    for j in caption_rows:
        x, y = xy(m.captions[j])
        items.append((cap_color[j] != GREY, f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.4" fill="{cap_color[j]}" '
                                            f'data-cid="{m.caption_ids[j]}"><title>{esc(texts[j])}</title></circle>'))
    for i in range(len(m.images)):
        x, y = xy(m.images[i])
        items.append((img_color[i] != GREY, f'<rect x="{x - 2.6:.1f}" y="{y - 2.6:.1f}" width="5.2" height="5.2" '
                                            f'fill="{img_color[i]}" stroke="#334155" stroke-width="0.4" '
                                            f'data-iid="{m.image_ids[i]}"><title>image #{m.image_ids[i]} '
                                            f'{esc(filenames[i])}</title></rect>'))
    items.sort(key=lambda t: t[0])  # grey first, coloured on top
    head = (f'<div class="ltd-map-head ltd-m{index % 4}"><b>{esc(m.model)}</b><span class="ltd-muted">PCA of '
            f'{len(m.images):,} images (■) and {len(caption_rows):,} of {len(m.captions):,} captions (●); '
            f'axes hold {m.explained[0]:.0%} and {m.explained[1]:.0%} of the variance; each modality centred on its own '
            f'mean (the modality gap, {m.gap:.2f}, is left out)</span></div>')
    return (f'<figure class="ltd-map">{head}<svg viewBox="0 0 {size} {size}" role="img" '
            f'aria-label="embedding map of {esc(m.model)}">{"".join(s for _, s in items)}</svg></figure>')


def map_colors_by_disagreement(rows: list[dict], n_captions: int, n_images: int,
                               caption_pos: dict[int, int], image_pos: dict[int, int]) -> tuple[list[str], list[str]]:
    """Colours from the Explorer's rows: each query's signed log2 ratio of the two first-GT ranks."""
    cap, img = [GREY] * n_captions, [GREY] * n_images
    span = max((abs(r["rank_log2_ratio"]) for r in rows), default=0.0)
    for r in rows:
        pos = (caption_pos if r["direction"] == "t2i" else image_pos).get(int(r["query_id"]))
        if pos is not None:
            (cap if r["direction"] == "t2i" else img)[pos] = _diverging(float(r["rank_log2_ratio"]), span)
    return cap, img


def map_colors_by_word(cap_mask: np.ndarray, img_mask: np.ndarray) -> tuple[list[str], list[str]]:
    return ([("#4f46e5" if x else GREY) for x in cap_mask], [("#0891b2" if x else GREY) for x in img_mask])


def maps_html(service: SearchService, a: str, b: str, *, color_by: str = "disagreement", word: str = "",
              max_captions: int = 2500) -> str:
    """Both models' maps side by side, coloured by how much they disagree on each query or by a word's
    presence; at most ``max_captions`` captions (an even, fixed sample) so the page stays light."""
    maps = [service.explainer.embedding_map(n) for n in (a, b)]
    ix = service.registry.get(a).index
    texts, files = ix.captions.meta["texts"], ix.images.meta["filenames"]
    n_cap, n_img = len(ix.captions.ids), len(ix.images.ids)
    rows = np.linspace(0, n_cap - 1, min(n_cap, max_captions)).round().astype(int) if n_cap else np.zeros(0, int)
    if color_by == "word" and word.strip():
        cmask = captions_with_word(ix, word)
        cap, img = map_colors_by_word(cmask, images_with_word(ix, cmask))
        rows = np.union1d(rows, np.flatnonzero(cmask))  # every caption with the word is drawn
        legend = (f'<b style="color:#4f46e5">●</b> captions with “{esc(word.strip())}” ({int(cmask.sum()):,}), '
                  f'<b style="color:#0891b2">■</b> their images; grey: the others')
    else:
        e = service.registry.get(a)
        cap, img = map_colors_by_disagreement(service.explorer(a, b, limit=10**9), n_cap, n_img, e.caption_pos,
                                              e.image_pos)
        legend = (f'colour: which model ranks the query\'s ground truth higher, by how much (log₂ of the rank ratio): '
                  f'<b class="ltd-m0">■ {esc(a)}</b>, <b class="ltd-m1">■ {esc(b)}</b>; grey: the same rank')
    figs = "".join(map_svg(m, (cap, img), texts, files, caption_rows=rows, index=i) for i, m in enumerate(maps))
    return (f'<div class="ltd-explorer-sum"><span class="ltd-muted">{legend} · click a point to open that query in '
            f'Compare (● a caption, ■ an image)</span></div><div class="ltd-maps">{figs}</div>')
