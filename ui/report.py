"""A self-contained HTML report of two models on a set of queries (``ltd compare --html``).

One file to send to a colleague: for each query, both rankings side by side (the Compare tab's
HTML, thumbnails inlined as base64 JPEG), the word attributions for the query's image, and the
models' metrics; optionally the words each model uses and the other ignores. Nothing is fetched
when it is opened (no script, no external style sheet or image), and every string that comes from
a query, a dataset or a model name is escaped (the same render functions as the UI).
"""
from __future__ import annotations

import time

from search import SearchService, WordUsage
from ui.explain_render import words_html
from ui.render import esc, inline_thumbs, model_label
from ui.tabs.compare import compare, explain_panel
from ui.theme import CSS

THUMB_MAX = 160  # px: enough for a report's grid, and a 6-query report stays around a megabyte

# The Gradio theme's variables that ui/style.css reads, for a page outside Gradio.
PAGE_CSS = """:root { --border-color-primary: #e2e8f0; --block-background-fill: #fff; --background-fill-secondary: #f8fafc;
  --body-text-color-subdued: #64748b; --font: system-ui, -apple-system, "Segoe UI", sans-serif; }
body { font-family: var(--font); margin: 0 auto; max-width: 1280px; padding: 18px; color: #0f172a; background: #f1f5f9; }
.ltd-report-q { margin: 22px 0; padding: 14px; border-radius: 14px; background: #fff; border: 1px solid #e2e8f0; }
table.ltd-metrics-table { border-collapse: collapse; margin: 8px 0 4px; font-size: .92rem; }
table.ltd-metrics-table th, table.ltd-metrics-table td { padding: 4px 10px; border-bottom: 1px solid #e2e8f0; text-align: right; }
table.ltd-metrics-table th:first-child, table.ltd-metrics-table td:first-child { text-align: left; }
a.ltd-ex { pointer-events: none; }
"""

METRICS = ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10", "rsum")


def _metrics_table(service: SearchService, names: list[str]) -> str:
    head = "".join(f"<th>{esc(k)}</th>" for k in METRICS)
    rows = []
    for n in names:
        lb = model_label(service, n)
        ev = service.model_info(n).eval or {}
        cells = "".join(f"<td>{ev[k]:.1f}</td>" if isinstance(ev.get(k), (int, float)) else "<td>–</td>"
                        for k in METRICS)
        rows.append(f"<tr><td><b>{esc(n)}</b> <span class='ltd-muted'>{esc(lb['kind'])} {esc(lb['detail'])}</span>"
                    f"</td>{cells}</tr>")
    return (f'<table class="ltd-metrics-table"><thead><tr><th>model (`ltd eval`, test split)</th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def report_html(service: SearchService, a: str, b: str, queries: list[dict], *, k: int = 8,
                usage: WordUsage | None = None, top: int = 10) -> str:
    """The whole page. ``queries``: {"query": text} or {"caption_id": id} each."""
    full = inline_thumbs(service)

    def thumbs(image_id: int, model: str | None, size: int) -> str:
        return full(image_id, model, min(int(size), THUMB_MAX))

    info = service.model_info(a)
    sections = []
    for i, q in enumerate(queries, 1):
        results = compare(service, a, b, q, k, thumbs)
        attr, _ = explain_panel(service, a, b, q, thumbs)
        sections.append(f'<section class="ltd-report-q"><h2>Query {i}</h2>{attr}{results}</section>')
    words = (f'<section class="ltd-report-q"><h2>Words over the whole split</h2>{words_html(usage, top=top, clickable=False)}</section>'
             if usage is not None else "")
    title = f"{a} vs {b}: {len(queries)} queries"
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{PAGE_CSS}\n{CSS}</style></head><body>"
            f'<header class="ltd-header"><div class="ltd-title"><span class="ltd-logo">◐</span><div>'
            f"<h1>{esc(title)}</h1><p>{esc(info.dataset or 'corpus')} · {esc(info.split or '')} split · "
            f"written {esc(time.strftime('%Y-%m-%d %H:%M'))} by <code>ltd compare --html</code></p></div></div></header>"
            f"{_metrics_table(service, [a, b])}{words}{''.join(sections)}</body></html>")
