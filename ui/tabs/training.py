"""The Training tab: the served models' eval reports side by side (the best value per metric in
bold) and their training curves overlaid (λ, L_rec with the η line, L_con, val rsum)."""
from __future__ import annotations

import gradio as gr
import pandas as pd

from search import REPORT_KEYS, NotReady, SearchError, SearchService
from ui.context import UIContext
from ui.render import loading_state, model_label, notice

REPORT_COLUMNS = [(k, k.replace("_", " ")) for k in REPORT_KEYS]


def report_table(service: SearchService, names: list[str] | None = None) -> tuple[list[str], list[list]]:
    """(headers, rows): one row per serving model with its eval report (R@1/5/10 both ways, rsum, R-P, nDCG)."""
    names = [n for n in (names or service.registry.names) if n in service.registry.entries]
    reports = {n: (model_label(service, n), service.model_info(n).eval or {}) for n in names}
    nd = sorted({k for _, r in reports.values() for k in r if "nDCG" in k})
    headers = (["model", "loss"] + [h for _, h in REPORT_COLUMNS]
               + [k.replace("_rougeL", " (ROUGE-L)").replace("_", " ") for k in nd])
    rows = []
    for n, (lb, rep) in reports.items():
        loss = lb["kind"] + (f" ({lb['detail']})" if lb["detail"] else "")
        vals = [rep.get(k) for k, _ in REPORT_COLUMNS] + [rep.get(k) for k in nd]
        rows.append([n, loss] + [None if v is None else round(float(v), 4 if abs(float(v)) < 2 else 1) for v in vals])
    return headers, rows


def training_figure(service: SearchService, names: list[str] | None = None, smooth: int = 5):
    """(matplotlib figure or None, notice HTML) of the selected models' training curves."""
    names = [n for n in (names or []) if n in service.registry.names]
    if not names:
        return None, notice("Select at least one model.", "info")
    try:
        fig, missing = service.training_figure(names, smooth)
    except NotReady as e:
        return None, notice(f"Models are still loading: {e.detail}.", "loading")
    except SearchError as e:
        return None, notice(e.detail, "error")
    msg = ""
    if missing:
        msg = notice(f"No metrics.jsonl next to the checkpoint of: {', '.join(missing)} (trained elsewhere?).", "warn")
    return fig, msg


def best_bold(df: pd.DataFrame):
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


def build(ctx: UIContext) -> None:
    names, svc = ctx.names, ctx.service
    with gr.Tab("Training", id="training", elem_id="tab-training") as tab:
        with gr.Row(elem_classes="ltd-controls"):
            models = gr.CheckboxGroup(names, value=names, label="Models (overlaid)", scale=3)
            smooth = gr.Slider(1, 50, value=5, step=1, label="Smoothing (steps)", scale=2)
        report = gr.Dataframe(label="Evaluation report (test split)", interactive=False, elem_id="training-report")
        msg = gr.HTML("")
        plot = gr.Plot(label="Training curves", elem_id="training-plot")

    def run_training(models, smooth):
        if not svc.registry.ready.is_set():
            return None, None, loading_state(svc)
        headers, rows = report_table(svc, models or names)
        fig, note = training_figure(svc, models, smooth)
        return best_bold(pd.DataFrame(rows, columns=headers)), fig, note

    tab.select(run_training, [models, smooth], [report, plot, msg])
    models.input(run_training, [models, smooth], [report, plot, msg])
    smooth.release(run_training, [models, smooth], [report, plot, msg])
