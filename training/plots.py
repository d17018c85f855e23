"""Training curves from metrics.jsonl: λ (log scale), L_rec with the η line, L_con and val rsum
(captioner runs: XE loss, SCST reward terms, val CIDEr-D and self-retrieval, training/captioning/plots.py).

One run or several overlaid (the paper's Figure 3 is several η values on one set of axes).
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from training.captioning.plots import caption_figure, is_caption_run
from training.errors import UserFileNotFound
from training.fsio import atomic_path


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(step rows, val rows) of a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserFileNotFound(f"{run_dir} has no metrics.jsonl (is it a run folder?)")
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return [r for r in rows if r.get("type") == "step"], [r for r in rows if r.get("type") == "val"]


def run_label(run_dir: Path) -> tuple[str, float | None]:
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        return run_dir.name, None
    cfg = yaml.safe_load(cfg_path.read_text())
    loss = cfg.get("loss", {})
    mode = loss.get("mode", "none")
    eta = float(loss["eta"]) if mode == "constraint" else None
    # experiment runs live in <label>/seed<k>: the parent names the cell, the folder only the seed
    label = f"{run_dir.parent.name}/{run_dir.name}" if run_dir.name.startswith("seed") else run_dir.name
    if mode == "constraint":
        label += f" (η={eta:g})"
    elif mode == "dual":
        label += f" (β={float(loss.get('beta', 1)):g})"
    return label, eta


def split_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(step rows, val rows) of already-parsed metrics.jsonl rows (e.g. from the search service)."""
    return [r for r in rows if r.get("type") == "step"], [r for r in rows if r.get("type") == "val"]


def label_for(name: str, loss: dict | None) -> tuple[str, float | None]:
    """Legend label and η of a run from its loss settings ({"mode", "eta", "beta"}), as run_label does."""
    loss = loss or {}
    mode = loss.get("mode") or "none"
    eta = float(loss["eta"]) if mode == "constraint" and loss.get("eta") is not None else None
    if mode == "constraint" and eta is not None:
        return f"{name} (η={eta:g})", eta
    if mode == "dual":
        return f"{name} (β={float(loss.get('beta') or 1):g})", None
    return name, None


def figure_from_rows(series: list[tuple[str, float | None, list[dict]]], smooth: int = 5,
                     figsize: tuple[float, float] = (11, 7.5)):
    """The 2×2 curves figure from metrics rows: ``series`` is [(label, eta or None, rows), ...], one
    entry per run, where rows are metrics.jsonl objects (step and val rows; others are ignored)."""
    fig, axes = plt.subplots(2, 2, figsize=figsize, constrained_layout=True)
    (ax_lam, ax_rec), (ax_con, ax_val) = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lam_floor, lam_clipped = 1e-4, False  # λ = 0 (constraint met) cannot sit on a log axis
    for i, (label, eta, rows) in enumerate(series):
        steps, vals = split_rows(rows)
        c = colours[i % len(colours)]

        def series_of(key, steps=steps):
            pts = [(r["step"], r[key]) for r in steps if key in r]
            if not pts:
                return [], []
            xs, ys = zip(*pts)
            if smooth > 1 and len(ys) > smooth:
                k = smooth
                ys = [sum(ys[max(0, j - k + 1): j + 1]) / len(ys[max(0, j - k + 1): j + 1]) for j in range(len(ys))]
            return xs, ys

        xs, ys = series_of("lambda")
        if xs:
            lam_clipped = lam_clipped or min(ys) < lam_floor
            ax_lam.plot(xs, [max(y, lam_floor) for y in ys], color=c, label=label)
        xs, ys = series_of("l_rec")
        if xs:
            ax_rec.plot(xs, ys, color=c, label=label)
            if eta is not None:
                ax_rec.axhline(eta, color=c, ls="--", lw=1)
        xs, ys = series_of("l_con")
        ax_con.plot(xs, ys, color=c, label=label)
        # epoch 0 is the untrained model (rsum near chance): on the same axis it flattens the differences
        pts = [(r["epoch"], r["rsum"]) for r in vals if "rsum" in r and r["epoch"] >= 1]
        if pts:
            ax_val.plot(*zip(*pts), marker="o", color=c, label=label)
    ax_lam.set(title="Lagrange multiplier λ" + (" (λ = 0 drawn at 10⁻⁴)" if lam_clipped else ""), xlabel="step",
               yscale="log")
    lam = [y for line in ax_lam.lines for y in line.get_ydata()]
    if lam and max(lam) / max(min(lam), 1e-12) < 10:  # within one decade: plain tick labels, not 1.02×10⁰
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax_lam.yaxis.set_major_formatter(plain)
        ax_lam.yaxis.set_minor_formatter(plain)
    ax_rec.set(title="reconstruction loss L_rec (dashed: η)", xlabel="step")
    ax_con.set(title="contrastive loss L_con", xlabel="step")
    ax_val.set(title="validation rsum (trained epochs)", xlabel="epoch")
    ax_val.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not ax_lam.lines:
        ax_lam.text(0.5, 0.5, "no constraint runs", ha="center", va="center", transform=ax_lam.transAxes)
    if not ax_rec.lines:
        ax_rec.text(0.5, 0.5, "no reconstruction loss", ha="center", va="center", transform=ax_rec.transAxes)
    return fig


def figure(runs: list[Path], smooth: int = 5):
    rows = [[json.loads(ln) for ln in (r / "metrics.jsonl").read_text().splitlines() if ln.strip()]
            if (r / "metrics.jsonl").is_file() else [] for r in runs]

    if rows and all(is_caption_run(r) for r in rows):  # captioner runs (ltd caption train)
        return caption_figure([(run_label(r)[0], rr) for r, rr in zip(runs, rows)])
    series = []
    for run in runs:
        steps, vals = read_metrics(run)
        label, eta = run_label(run)
        series.append((label, eta, steps + vals))
    return figure_from_rows(series, smooth=smooth)


def plot_runs(runs: list[Path], out: Path | None = None) -> list[Path]:
    """Write the curves (all panels) as a PNG, ``curves.png`` in ``out``. Without ``out``: in the run's
    folder for one run; for several (overlaid), ``curves_<run>_vs_<run>….png`` in the current folder,
    so a comparison never lands inside one of the runs it compares."""
    name = "curves.png"
    if out is None and len(runs) > 1:
        out, name = Path("."), "curves_" + "_vs_".join(r.resolve().name for r in runs)[:150] + ".png"
    out = out or runs[0]
    return [save_png(figure(runs), out / name)]


def save_png(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG, whole or not at all (atomic), and free it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
