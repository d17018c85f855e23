"""The filter bar above the tabs: chips built from the served models' metadata fields, a range over a
field of dates or numbers, and words; the filter it builds (ui/filters.py) restricts every tab's
searches — Search, Compare and the Explorer's queries — and is carried in shared links.

The filter lives in a ``gr.State`` (``FilterBar.state``): the tabs take it as an input and re-run what
they show when it changes (its ``change`` event). The chips are filled once the models are ready and
again after every write from the page (a new album appears as a chip at once).
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from search import SearchError
from ui import filters
from ui.context import UIContext
from ui.render import esc, header_html, notice


@dataclass
class FilterBar:
    chips: gr.Dropdown
    range_field: gr.Dropdown
    lo: gr.Textbox
    hi: gr.Textbox
    words: gr.Textbox
    clear: gr.Button
    status: gr.HTML
    state: gr.State  # the filter (a dict) or None
    header: gr.HTML  # the page's title bar: its counts follow the writes too

    @property
    def values(self) -> list:
        """The components whose values build the filter."""
        return [self.chips, self.range_field, self.lo, self.hi, self.words]

    @property
    def fill_targets(self) -> list:
        """What ``filled`` updates."""
        return [self.chips, self.range_field, self.status, self.header]


def status_html(ctx: UIContext, flt: dict | None) -> str:
    """What the filter keeps: its reading and, per model, how many of its live images match."""
    if flt is None:
        return ('<div class="ltd-filter-status"><span class="ltd-muted">No filter: every tab searches all items. '
                "Pick chips, a range or words to search one slice (Compare and the Explorer too).</span></div>")
    counts = []
    for name in ctx.names:
        try:
            kept, total = filters.matching(ctx.service, name, flt)
        except SearchError:
            continue
        counts.append(f'<span><b>{kept:,}</b> of {total:,} images in {esc(name)}</span>')
    return (f'<div class="ltd-filter-status"><span class="ltd-fdesc">Filter: {esc(filters.describe(flt))}</span>'
            f'{"".join(counts)}</div>')


def filled(ctx: UIContext, selected: list | None = None, flt: dict | None = None) -> list:
    """Updates of the chips (the fields' values now, ``selected`` kept), the range fields, the status and
    the header (after a write: its item counts)."""
    fields = filters.merged_fields(ctx.service, ctx.names)
    keep = [v for v in selected or [] if isinstance(v, str)]
    return [gr.Dropdown(choices=filters.chip_choices(fields, keep), value=keep),
            gr.Dropdown(choices=filters.range_choices(fields)), status_html(ctx, flt), header_html(ctx.service)]


def offered(ctx: UIContext) -> list:
    """Updates of the chips' and the range fields' choices only (the page's load: a shared link may be
    setting their values at the same time)."""
    fields = filters.merged_fields(ctx.service, ctx.names)
    return [gr.Dropdown(choices=filters.chip_choices(fields)), gr.Dropdown(choices=filters.range_choices(fields))]


def applied(ctx: UIContext, chips, range_field, lo, hi, words) -> tuple:
    """(filter state, status) of the bar's values; a bad value leaves the filter as it was, with a notice."""
    try:
        flt = filters.build_filter(chips, range_field, lo, hi, words)
    except SearchError as e:
        return gr.skip(), notice(e.detail, "error")
    return flt, status_html(ctx, flt)


def restored(bar: FilterBar, ctx: UIContext, flt: dict | None) -> dict:
    """Updates that show ``flt`` (a filter this bar built, e.g. from a shared link) in the bar."""
    values = filters.bar_values(flt)
    if values is None:
        return {}
    chips, field, lo, hi, words = values
    fields = filters.merged_fields(ctx.service, ctx.names)
    return {bar.chips: gr.Dropdown(choices=filters.chip_choices(fields, chips), value=chips),
            bar.range_field: gr.Dropdown(choices=filters.range_choices(fields), value=field),
            bar.lo: lo, bar.hi: hi, bar.words: words, bar.state: flt, bar.status: status_html(ctx, flt)}


def build(ctx: UIContext, header: gr.HTML) -> FilterBar:
    with gr.Accordion("Filter: search one slice", open=True, elem_id="ltd-filter"):
        with gr.Row(equal_height=False, elem_classes="ltd-controls"):
            chips = gr.Dropdown([], value=[], multiselect=True, label="Only items with (chips of one field: any of them)",
                                scale=5, min_width=260, elem_id="filter-chips")
            field = gr.Dropdown([("—", "")], value="", label="Range of", scale=2, min_width=150,
                                elem_id="filter-range-field")
            lo = gr.Textbox(label="from", placeholder="2024-01-01", scale=1, min_width=110, max_length=40,
                            elem_id="filter-from")
            hi = gr.Textbox(label="to", placeholder="2024-12-31", scale=1, min_width=110, max_length=40, elem_id="filter-to")
            words = gr.Textbox(label="Words (Enter)", placeholder="in captions or metadata", scale=2, min_width=150,
                               max_length=200, elem_id="filter-words")
            clear = gr.Button("Clear", scale=0, min_width=70, size="sm", elem_id="filter-clear")
        status = gr.HTML(status_html(ctx, None), elem_id="filter-status")
    bar = FilterBar(chips, field, lo, hi, words, clear, status, gr.State(None), header)
    _wire(ctx, bar)
    return bar


def _wire(ctx: UIContext, bar: FilterBar) -> None:
    def apply(chips, range_field, lo, hi, words):
        return applied(ctx, chips, range_field, lo, hi, words)

    def clear_filter():
        return [], "", "", "", "", None, status_html(ctx, None)

    out = [bar.state, bar.status]
    for comp in (bar.chips, bar.range_field):
        comp.input(apply, bar.values, out)
    for comp in (bar.lo, bar.hi, bar.words):
        comp.submit(apply, bar.values, out)
    for comp in (bar.lo, bar.hi):  # a date typed, then a click elsewhere
        comp.blur(apply, bar.values, out)
    bar.clear.click(clear_filter, None, [*bar.values, bar.state, bar.status])
