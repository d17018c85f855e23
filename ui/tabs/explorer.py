"""The Explorer tab, three views of two models over the whole test split:

- Queries: test queries sorted by how much the models disagree on the rank of the first ground
  truth, filterable by direction and winner;
- Words: the words one model uses and the other ignores (every caption's words removed in turn,
  search/word_usage.py), each with example captions;
- Map: both models' images and captions in 2-D (PCA), coloured by disagreement or by a word.

With a filter in the filter bar, the queries view keeps the queries of that slice (a caption query whose
image matches, an image query that matches) and counts how many each model wins there.

A click on a row, an example or a point opens that query in Compare."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd

from indexer.vector_index import IndexDirError
from search import BadRequest, NotReady, SearchError, SearchService, redact_paths
from ui import filters, inputs, share
from ui.context import UIContext
from ui.explain_render import CLICK_JS, maps_html, words_html
from ui.render import ThumbSrc, esc, need_two_notice, notice
from ui.share import UIState
from ui.tabs import compare as compare_tab

# the progress bar of the words and map views (their first computation is a split-wide pass): Gradio
# finds it as a parameter's default and uses that very object for every call, so one module-level
# instance is what a default written in each signature would be
PROGRESS = gr.Progress(track_tqdm=True)

EXPLORER_HEADERS = ["dir", "id", "query", "rank A", "rank B", "P@5 A", "P@5 B", "nDCG A", "nDCG B", "better", "Δ"]
"""Δ = |log2(rank A / rank B)| of the first ground truth: 1 means one model ranks it twice as high."""


@dataclass(frozen=True)
class Queries:
    """What the queries view lists: the queries of models ``a`` and ``b`` in ``direction`` (both | t2i |
    i2t) that ``winner`` ranks higher (any | a | b | tie), at most ``limit`` rows, within the filter bar's
    filter ``flt`` (None: every query)."""

    a: str
    b: str
    direction: str = "both"
    winner: str = "any"
    limit: Any = 200
    flt: dict | None = None


@dataclass(frozen=True)
class View:
    """The Explorer's view controls as the page holds them (``ExplorerTab.view_inputs``, then the filter):
    which ``view`` (queries | words | map) of models ``a`` and ``b``, the words view's ``min_count`` and
    ``top``, the map's ``color`` (disagreement | word) and ``word``, and the filter bar's ``flt``."""

    view: str
    a: str
    b: str
    min_count: Any = 5
    top: Any = 15
    color: str = "disagreement"
    word: str = ""
    flt: dict | None = None


def explorer_headers(a: str, b: str) -> list[str]:
    return [h.replace(" A", f" {a}").replace(" B", f" {b}") for h in EXPLORER_HEADERS]


def in_slice(service: SearchService, a: str, rows: list[dict], flt: dict | None) -> list[dict]:
    """The Explorer rows whose query lies in the slice ``flt`` keeps (on model ``a``'s index; None: every
    query): a caption query whose image matches, an image query that matches; removed items never."""
    e = service.registry.get(a)
    images, captions = service.filter_masks(e, flt)
    if images is None:
        images, captions = np.ones(len(e.index.images.meta["ids"]), bool), np.ones(len(e.index.captions.meta["ids"]), bool)
    dead_img = getattr(e.index.images.index, "dead", None)
    dead_cap = getattr(e.index.captions.index, "dead", None)

    def keep(r: dict) -> bool:
        q = int(r["query_index"])
        mask, dead = (captions, dead_cap) if r["direction"] == "t2i" else (images, dead_img)
        return q < len(mask) and bool(mask[q]) and not (dead is not None and q < len(dead) and dead[q])
    return [r for r in rows if keep(r)]


def explorer(service: SearchService, q: Queries, thumbs: ThumbSrc | None = None) -> tuple[list[list], list[dict], str]:
    """(table rows, raw rows, summary HTML) of the queries sorted by disagreement between ``q.a`` and
    ``q.b``, only those of the slice ``q.flt`` keeps (ranks are over the whole split, as `ltd eval` ranks).

    ``q.winner`` is any | a | b | tie (which model ranks the ground truth higher). With ``thumbs``, image
    queries show a thumbnail in the query cell (an HTML column)."""
    a, b, direction, winner, limit, flt = q.a, q.b, q.direction, q.winner, q.limit, q.flt
    if len(service.registry.names) < 2:
        return [], [], need_two_notice(service) or ""
    if not a or not b or a == b:
        return [], [], notice("Pick two different models.", "error")
    try:
        all_rows = in_slice(service, a, service.explorer(a, b, direction=direction, limit=10**9), flt)
    except NotReady as e:
        return [], [], notice(f"Models are still loading: {e.detail}.", "loading")
    except SearchError as e:
        return [], [], notice(e.detail, "error")
    except IndexDirError as e:  # the two indexes no longer hold the same items (one was written to)
        return [], [], notice(redact_paths(str(e)), "error")
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
    if flt is not None:
        scope += f" in the slice {filters.describe(flt)} (ranks over the whole split)"
    summary = (f'<div class="ltd-explorer-sum"><span class="ltd-win ltd-m1"><b>{esc(b)}</b> ranks the ground truth higher '
               f'for <b>{wins["b"]}</b></span><span class="ltd-win ltd-m0"><b>{esc(a)}</b> for <b>{wins["a"]}</b></span>'
               f'<span class="ltd-win">tie <b>{wins["tie"]}</b></span><span class="ltd-muted">of {total} {scope} · '
               f'showing {len(rows)} · Δ = |log₂ of the ratio of the two first-GT ranks| · '
               'click a row to open it in Compare</span></div>')
    if not rows:
        summary += notice("No query matches these filters." + (" The filter bar keeps no query of this split."
                                                               if flt is not None and not total else ""), "info")
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
            raise BadRequest("that row is no longer in the table; refresh the explorer")
        match = rows[int(i)]
    if match["direction"] == "t2i":
        return {"direction": "t2i", "caption_id": int(match["query_id"]), "text": str(match.get("query", ""))}
    return {"direction": "i2t", "image_id": int(match["query_id"])}


def winner_choices(a: str, b: str) -> list[tuple[str, str]]:
    if a == b:
        return [("any", "any")]
    return [("any", "any"), (f"{a} better", "a"), (f"{b} better", "b"), ("tie", "tie")]


def words_view(service: SearchService, a: str, b: str, min_count: Any = 5, top: Any = 15) -> str:
    """The words view: what each model uses and the other ignores over the whole split."""
    if len(service.registry.names) < 2:
        return need_two_notice(service) or ""
    if not a or not b or a == b:
        return notice("Pick two different models.", "error")
    try:
        u = service.explainer.word_usage(a, b, min_count=int(min_count or 5))
    except NotReady as e:
        return notice(f"Models are still loading: {e.detail}.", "loading")
    except SearchError as e:
        return notice(e.detail, "error")
    return words_html(u, top=int(top or 15))


def map_view(service: SearchService, a: str, b: str, color_by: str = "disagreement", word: str = "") -> str:
    if len(service.registry.names) < 2:
        return need_two_notice(service) or ""
    if not a or not b or a == b:
        return notice("Pick two different models.", "error")
    try:
        return maps_html(service, a, b, color_by=color_by, word=(word or "")[:100])
    except NotReady as e:
        return notice(f"Models are still loading: {e.detail}.", "loading")
    except SearchError as e:
        return notice(e.detail, "error")


def clicked_query(evt: gr.EventData) -> dict | None:
    """The Compare query of a click on a words example or a map point ({"caption_id"} or {"image_id"});
    the event's data comes from the browser, so anything but a whole number is ignored."""
    data = getattr(evt, "_data", None) or {}
    try:
        cid = inputs.parse_id(data.get("cid"), "caption id")
        iid = inputs.parse_id(data.get("iid"), "image id")
    except (SearchError, AttributeError):
        return None
    return {"caption_id": cid} if cid is not None else {"image_id": iid} if iid is not None else None


@dataclass
class ExplorerTab:
    tab: gr.Tab
    a: gr.Dropdown
    b: gr.Dropdown
    view: gr.Radio
    panels: dict  # view → its gr.Column
    direction: gr.Radio
    win: gr.Radio
    limit: gr.Dropdown
    table: gr.Dataframe
    rows: gr.State
    summary: gr.HTML
    min_count: gr.Dropdown
    top: gr.Dropdown
    words_out: gr.HTML
    color: gr.Radio
    word: gr.Textbox
    map_out: gr.HTML

    @property
    def view_inputs(self) -> list:
        return [self.view, self.a, self.b, self.min_count, self.top, self.color, self.word]

    def view_outputs(self, share_box: gr.Textbox) -> list:
        return [*self.panels.values(), self.words_out, self.map_out, share_box]

    def restore_targets(self, share_box: gr.Textbox) -> list:
        return [self.a, self.b, self.view, self.color, self.word, self.win, self.table, self.rows, self.summary,
                *self.view_outputs(share_box)]


def queries_update(ctx: UIContext, t: ExplorerTab, q: Queries) -> dict:
    """The queries view's table, rows and summary, within the slice ``q.flt`` keeps."""
    cells, raw, text = explorer(ctx.service, replace(q, limit=int(q.limit or 200)), thumbs=ctx.thumbs)
    return {t.table: pd.DataFrame(cells, columns=explorer_headers(q.a, q.b)), t.rows: raw, t.summary: text}


def view_update(ctx: UIContext, t: ExplorerTab, share_box: gr.Textbox, v: View) -> dict:
    """Show ``v.view`` and fill it (the words of a split are computed once per index; tqdm feeds the page's
    progress bar meanwhile); the URL state follows."""
    a, b = v.a, v.b
    upd: dict = {p: gr.Column(visible=name == v.view) for name, p in t.panels.items()}
    if v.view == "words":
        upd[t.words_out] = words_view(ctx.service, a, b, v.min_count, v.top)
    elif v.view == "map":
        upd[t.map_out] = map_view(ctx.service, a, b, v.color, v.word)
    upd[share_box] = share.write("explorer", a=a, b=b, view=v.view,
                                 word=(v.word or None) if v.view == "map" and v.color == "word" else None,
                                 f=share.filter_value(v.flt), **share.pins(ctx.service, a, b))
    return upd


def restored(ctx: UIContext, t: ExplorerTab, share_box: gr.Textbox, a: str, b: str, state: UIState) -> dict:
    """The Explorer as the shared link ``state`` names it, on models ``a`` and ``b``: its view, map word
    and filter, everything filled."""
    view, word = state.view or "queries", state.word or ""
    v = View(view, a, b, color="word" if word else "disagreement", word=word, flt=state.f)
    queries = queries_update(ctx, t, Queries(a, b, flt=state.f))
    return ({t.a: a, t.b: b, t.view: view, t.color: v.color, t.word: word,
             t.win: gr.Radio(choices=winner_choices(a, b), value="any")}
            | queries | view_update(ctx, t, share_box, v))


def build(ctx: UIContext, compare: compare_tab.CompareTab, tabs: gr.Tabs, flt: gr.State) -> ExplorerTab:
    names, pair = ctx.names, ctx.pair
    a0, b0 = ctx.first_pair
    with gr.Tab("Explorer", id="explorer", elem_id="tab-explorer") as tab:
        if not pair:
            gr.HTML(need_two_notice(ctx.service))
        rows = gr.State([])
        with gr.Row(elem_classes="ltd-controls", visible=bool(pair)):
            a = gr.Dropdown(names, value=a0, label="Model A", scale=1, min_width=110)
            b = gr.Dropdown(names, value=b0, label="Model B", scale=1, min_width=110)
            view = gr.Radio([("Queries", "queries"), ("Words", "words"), ("Map", "map")], value="queries",
                            label="Show", scale=2, min_width=220, elem_id="explorer-view")
        with gr.Column(visible=bool(pair)) as queries:
            with gr.Row(elem_classes="ltd-controls"):
                direction = gr.Radio([("both", "both"), ("text → image", "t2i"), ("image → text", "i2t")],
                                     value="both", label="Direction", scale=3, min_width=330)
                win = gr.Radio(winner_choices(a0, b0), value="any", label="Which model ranks the ground truth higher",
                               scale=4)
                limit = gr.Dropdown([50, 200, 1000], value=200, label="Rows", scale=1, min_width=80)
            summary = gr.HTML("", elem_id="explorer-summary")
            table = gr.Dataframe(headers=explorer_headers(a0, b0), interactive=False, wrap=True, max_height=560,
                                 elem_id="explorer-table",
                                 datatype=["str", "number", "html"] + ["number"] * 6 + ["str", "number"],
                                 column_widths=["5%", "5%", "39%"] + ["6.5%"] * 6 + ["7%", "5%"])
        with gr.Column(visible=False) as words:
            with gr.Row(elem_classes="ltd-controls"):
                min_count = gr.Dropdown([3, 5, 10, 20], value=5, label="Words seen at least", scale=1, min_width=120)
                top = gr.Dropdown([15, 30, 60], value=15, label="Words per list", scale=1, min_width=120)
            words_out = gr.HTML("", elem_id="explorer-words", js_on_load=CLICK_JS)
        with gr.Column(visible=False) as maps:
            with gr.Row(elem_classes="ltd-controls"):
                color = gr.Radio([("disagreement", "disagreement"), ("a word", "word")], value="disagreement",
                                 label="Colour by", scale=2, min_width=220, elem_id="explorer-map-color")
                word = gr.Textbox(label="Word (Enter)", placeholder="e.g. red", scale=2, max_lines=1, max_length=100,
                                  elem_id="explorer-map-word")
            map_out = gr.HTML("", elem_id="explorer-map", js_on_load=CLICK_JS)
    t = ExplorerTab(tab, a, b, view, {"queries": queries, "words": words, "map": maps}, direction, win, limit, table,
                    rows, summary, min_count, top, words_out, color, word, map_out)
    _wire(ctx, t, compare, tabs, flt)
    return t


def _wire(ctx: UIContext, t: ExplorerTab, c: compare_tab.CompareTab, tabs: gr.Tabs, flt: gr.State) -> None:
    def run_explorer(a, b, direction, winner, limit, flt):
        return queries_update(ctx, t, Queries(a, b, direction, winner, limit, flt))

    def rerun_explorer(a, b, direction, winner, limit, flt, summary):
        """A new filter: the queries view again, if it was shown (its first computation is split-wide)."""
        return run_explorer(a, b, direction, winner, limit, flt) if summary else {t.summary: gr.skip()}

    def explorer_models(a, b, direction, winner, limit, flt):
        return {t.win: gr.Radio(choices=winner_choices(a, b), value="any" if a == b else winner)} | run_explorer(
            a, b, direction, winner, limit, flt)

    def open_in_compare(rows, a, b, k, flt, evt: gr.SelectData):
        """Explorer row → Compare tab, with the query filled in and the comparison already run."""
        try:
            q = explorer_pick(rows, evt.index, evt.row_value)
        except (SearchError, ValueError, TypeError, IndexError) as e:
            return {c.out: notice(e.detail if isinstance(e, SearchError) else str(e), "error")}
        q = {"caption_id": q["caption_id"]} if q["direction"] == "t2i" else {"image_id": q["image_id"]}
        return compare_tab.opened(c, tabs, ctx, compare_tab.Pair(a, b, k, flt), q)

    def open_clicked(a, b, k, flt, evt: gr.EventData):
        q = clicked_query(evt)
        return compare_tab.opened(c, tabs, ctx, compare_tab.Pair(a, b, k, flt), q) if q else {c.out: gr.skip()}

    def view_of(v: dict) -> View:
        """The view controls' values (``view_inputs``, by component: a set of inputs gives one dict)."""
        return View(v[t.view], v[t.a], v[t.b], v[t.min_count], v[t.top], v[t.color], v[t.word], v[flt])

    def show_view(v: dict, progress=PROGRESS):
        return view_update(ctx, t, c.share, view_of(v))

    def show_word(v: dict, progress=PROGRESS):
        """Enter in the word box: colour the map by that word."""
        return {t.color: "word"} | view_update(ctx, t, c.share, replace(view_of(v), view="map", color="word"))

    queries = [t.table, t.rows, t.summary]
    ex_inputs = [t.a, t.b, t.direction, t.win, t.limit, flt]
    t.tab.select(run_explorer, ex_inputs, queries)
    flt.change(rerun_explorer, [*ex_inputs, t.summary], queries)
    for comp in (t.direction, t.win, t.limit):
        comp.input(run_explorer, ex_inputs, queries)
    for comp in (t.a, t.b):
        comp.input(explorer_models, ex_inputs, [t.win, *queries])
        comp.input(show_view, {*t.view_inputs, flt}, t.view_outputs(c.share))
    for comp in (t.view, t.min_count, t.top, t.color):
        comp.input(show_view, {*t.view_inputs, flt}, t.view_outputs(c.share))
    t.word.submit(show_word, {*t.view_inputs, flt}, [t.color, *t.view_outputs(c.share)])
    t.table.select(open_in_compare, [t.rows, t.a, t.b, c.k, flt], c.open_targets(tabs))
    for out in (t.words_out, t.map_out):
        out.open(open_clicked, [t.a, t.b, c.k, flt], c.open_targets(tabs))
