"""The Explorer tab: test queries sorted by how much two models disagree on the rank of the first
ground truth, filterable by direction and winner; a click opens the query in Compare."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from search import BadRequest, NotReady, SearchError, SearchService
from ui.context import UIContext
from ui.render import ThumbSrc, esc, need_two_notice, notice
from ui.tabs import compare as compare_tab

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
    except SearchError as e:
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
            raise BadRequest("that row is no longer in the table; refresh the explorer")
        match = rows[int(i)]
    if match["direction"] == "t2i":
        return {"direction": "t2i", "caption_id": int(match["query_id"]), "text": str(match.get("query", ""))}
    return {"direction": "i2t", "image_id": int(match["query_id"])}


def winner_choices(a: str, b: str) -> list[tuple[str, str]]:
    if a == b:
        return [("any", "any")]
    return [("any", "any"), (f"{a} better", "a"), (f"{b} better", "b"), ("tie", "tie")]


@dataclass
class ExplorerTab:
    tab: gr.Tab


def build(ctx: UIContext, compare: compare_tab.CompareTab, tabs: gr.Tabs) -> ExplorerTab:
    names, pair = ctx.names, ctx.pair
    a0, b0 = ctx.first_pair
    with gr.Tab("Explorer", id="explorer", elem_id="tab-explorer") as tab:
        if not pair:
            gr.HTML(need_two_notice(ctx.service))
        rows = gr.State([])
        with gr.Row(elem_classes="ltd-controls", visible=bool(pair)):
            a = gr.Dropdown(names, value=a0, label="Model A", scale=1, min_width=110)
            b = gr.Dropdown(names, value=b0, label="Model B", scale=1, min_width=110)
            direction = gr.Radio([("both", "both"), ("text → image", "t2i"), ("image → text", "i2t")], value="both",
                                 label="Direction", scale=3, min_width=330)
            win = gr.Radio(winner_choices(a0, b0), value="any", label="Which model ranks the ground truth higher",
                           scale=4)
            limit = gr.Dropdown([50, 200, 1000], value=200, label="Rows", scale=1, min_width=80)
        summary = gr.HTML("", elem_id="explorer-summary")
        table = gr.Dataframe(headers=explorer_headers(a0, b0), interactive=False, wrap=True, max_height=560,
                             elem_id="explorer-table", visible=bool(pair),
                             datatype=["str", "number", "html"] + ["number"] * 6 + ["str", "number"],
                             column_widths=["5%", "5%", "39%"] + ["6.5%"] * 6 + ["7%", "5%"])
    _wire(ctx, tab, compare, tabs, a, b, direction, win, limit, summary, table, rows)
    return ExplorerTab(tab)


def _wire(ctx: UIContext, tab, c: compare_tab.CompareTab, tabs, a, b, direction, win, limit, summary, table,
          rows) -> None:
    svc, src = ctx.service, ctx.thumbs

    def run_explorer(a, b, direction, winner, limit):
        cells, raw, text = explorer(svc, a, b, direction, winner, int(limit or 200), thumbs=src)
        return pd.DataFrame(cells, columns=explorer_headers(a, b)), raw, text

    def explorer_models(a, b, direction, winner, limit):
        df, raw, text = run_explorer(a, b, direction, winner, limit)
        return gr.Radio(choices=winner_choices(a, b), value="any" if a == b else winner), df, raw, text

    def open_in_compare(rows, a, b, k, evt: gr.SelectData):
        """Explorer row → Compare tab, with the query filled in and the comparison already run."""
        try:
            q = explorer_pick(rows, evt.index, evt.row_value)
        except (SearchError, ValueError, TypeError, IndexError) as e:
            return [gr.skip()] * 10 + [notice(e.detail if isinstance(e, SearchError) else str(e), "error")]
        if q["direction"] == "t2i":
            out = compare_tab.compare(svc, a, b, {"caption_id": q["caption_id"]}, k, src)
            return (gr.Tabs(selected="compare"), a, b, "text", gr.Column(visible=True), gr.Row(visible=False),
                    q["text"], {"id": q["caption_id"], "text": q["text"]}, gr.skip(), gr.skip(), out)
        out = compare_tab.compare(svc, a, b, {"image_id": q["image_id"]}, k, src)
        return (gr.Tabs(selected="compare"), a, b, "image", gr.Column(visible=False), gr.Row(visible=True),
                gr.skip(), gr.skip(), str(q["image_id"]), None, out)

    ex_inputs = [a, b, direction, win, limit]
    tab.select(run_explorer, ex_inputs, [table, rows, summary])
    for comp in (direction, win, limit):
        comp.input(run_explorer, ex_inputs, [table, rows, summary])
    for comp in (a, b):
        comp.input(explorer_models, ex_inputs, [win, table, rows, summary])
    table.select(open_in_compare, [rows, a, b, c.k],
                 [tabs, c.a, c.b, c.kind, c.text_panel, c.img_panel, c.text, c.picked, c.img_id, c.upload, c.out])
