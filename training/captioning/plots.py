"""Captioner training curves from metrics.jsonl: XE loss, SCST reward terms (CIDEr-D, r_ret, total
reward and its greedy baseline), val CIDEr-D and val self-retrieval R@1. Drawn by ``ltd plot``."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def is_caption_run(rows: list[dict]) -> bool:
    return any("stage" in r for r in rows)


def _val_x(vals: list[dict], xe_epochs: int) -> list[int]:
    """Validation points on one epoch axis across both stages (SCST epochs follow the XE ones)."""
    return [v["epoch"] + (xe_epochs if v.get("stage") == "scst" else 0) for v in vals]


def caption_figure(series: list[tuple[str, list[dict]]], figsize: tuple[float, float] = (11, 7.5)):
    fig, axes = plt.subplots(2, 2, figsize=figsize, constrained_layout=True)
    (ax_xe, ax_rw), (ax_cider, ax_ret) = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rows) in enumerate(series):
        c = colours[i % len(colours)]
        steps = [r for r in rows if r.get("type") == "step"]
        xe = [r for r in steps if r.get("stage") == "xe"]
        scst = [r for r in steps if r.get("stage") == "scst"]
        if xe:
            ax_xe.plot([r["step"] for r in xe], [r["loss"] for r in xe], color=c, label=label)
        for key, style in (("cider", "-"), ("r_ret", ":"), ("reward", "--"), ("baseline", "-.")):
            pts = [(r["step"], r[key]) for r in scst if key in r]
            if pts:
                ax_rw.plot(*zip(*pts), color=c, ls=style, marker="." if len(pts) < 20 else None,
                           label=f"{label}: {key}")
        vals = [r for r in rows if r.get("type") == "val"]
        xe_epochs = max([r["epoch"] for r in vals if r.get("stage") == "xe"], default=0)
        xs = _val_x(vals, xe_epochs)
        ax_cider.plot(xs, [v["cider"] for v in vals], marker="o", color=c, label=label)
        ret = [(x, v["self_R@1"]) for x, v in zip(xs, vals) if "self_R@1" in v]
        if ret:
            ax_ret.plot(*zip(*ret), marker="o", color=c, label=label)
        if xe_epochs and scst:
            for ax in (ax_cider, ax_ret):
                ax.axvline(xe_epochs, color=c, ls="--", lw=0.8)
    ax_xe.set(title="XE loss (scheduled sampling)", xlabel="step")
    ax_rw.set(title="SCST reward terms of the samples (baseline: greedy)", xlabel="step")
    ax_cider.set(title="val CIDEr-D (greedy, ×100; dashed: XE → SCST)", xlabel="epoch")
    ax_ret.set(title="val self-retrieval R@1 (%)", xlabel="epoch")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if not ax_rw.lines:
        ax_rw.text(0.5, 0.5, "no SCST steps", ha="center", va="center", transform=ax_rw.transAxes)
    if not ax_ret.lines:
        ax_ret.text(0.5, 0.5, "no retrieval judge", ha="center", va="center", transform=ax_ret.transAxes)
    return fig
