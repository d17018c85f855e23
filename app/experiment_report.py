"""What `ltd experiment` writes from a grid's results: ``results.md`` (tables, choices on val, the
paired comparisons of ``app.experiment_stats``, training time), the plots, and the re-rendering of an
existing folder — a finished grid, one still running, or a copy under docs/results/ whose runs are
gone — without training anything, so older grids get newer statistics.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.experiment_stats import paired_statistics, render_paired
from app.grid import value_tag
from indexer import metrics
from training.errors import UserFileNotFound
from training.fsio import atomic_write_text, write_json_atomic
from training.plots import plot_runs, plt, save_png

REPORT_KEYS = [*metrics.REPORT_KEYS, metrics.ndcg_key("t2i"), metrics.ndcg_key("i2t")]


def reported_tags(results: dict) -> list[str]:
    """The evaluations a grid reports: every split and shortcut setting except the val split (which chose
    the sweeps' values), unless the grid reports on val itself (``eval_split: val``, a grid that chooses nothing)."""
    val = results["val_split"] if results.get("eval_split") != results["val_split"] else None
    return sorted({t for s in results["summary"].values() for t in s if t.split("_sc-")[0] != val})


def write_results(results: dict, out: Path, plots: bool = True) -> None:
    """results.json and results.md (atomically), and with ``plots`` the training curves and cells.png."""
    write_json_atomic(out / "results.json", results, indent=2, default=str)
    atomic_write_text(out / "results.md", render_results(results))
    if plots:
        plot_groups(results, out)
        plot_cells(results, out / "plots" / "cells.png")


def rerender(out: Path) -> dict:
    """Recompute the paired statistics of ``out/results.json`` and rewrite it and results.md: per-query
    results are read where the runs still exist, else the stored bootstrap is kept (marked † when it
    was caption-level). Trains and plots nothing."""
    path = out / "results.json"
    if not path.is_file():
        raise UserFileNotFound(f"no results.json in {out}: nothing to re-render")
    results = json.loads(path.read_text())
    results["paired"] = paired_statistics(results, reported_tags(results), stored=results.get("paired"))
    write_results(results, out, plots=False)
    return results


def _fmt(st: dict | None, digits: int = 1) -> str:
    if not st:
        return "–"
    return f"{st['mean']:.{digits}f} ± {st['std']:.{digits}f}" if st["n"] > 1 else f"{st['mean']:.{digits}f}"


def render_results(results: dict) -> str:
    split = results["eval_split"]
    lines = [f"# Experiment {results['name']}", "",
             f"base `{results['base']}`, common overrides `{' '.join(results['common']) or '–'}`, seeds "
             f"{results['seeds']}; {split} split, mean ± std over seeds (sample std). Machine: "
             f"{results['machine']['cpu']} ({results['machine']['cores']} cores).", ""]
    if results.get("partial"):
        missing = results.get("missing") or []
        where = [f"{m['label']} seed {m['seed']}: {m['state']}" for m in missing if m["state"] != "not started"]
        if len(where) < len(missing):
            where.append(f"{len(missing) - len(where)} not started")
        lines += [f"**Partial** (rendered {results.get('finished')}): runs of the grid still missing; only "
                  "finished runs are counted." + (f" Missing ({len(missing)}): {'; '.join(where)}." if missing else ""), ""]
    if results["selection"]:
        lines += ["## Chosen on validation", "", "| cell | parameter | val rsum per value | chosen |", "|---|---|---|---|"]
        for cell, sel in results["selection"].items():
            vals = ", ".join(f"{k}: {v:.1f}" for k, v in sel["val_rsum"].items())
            lines.append(f"| {cell} | {sel['param']} | {vals} | **{value_tag(sel['chosen'])}** |")
        lines.append("")
    tags = reported_tags(results)
    for tag in tags:
        lines += [f"## {tag}", "", "| cell | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | rsum | "
                  "i2t R-P | t2i nDCG (ROUGE-L) |", "|---|" + "---:|" * 9]
        for cell, s in results["summary"].items():
            m = s.get(tag)
            if not m:
                continue
            lines.append(f"| {cell} | " + " | ".join(_fmt(m.get(k)) for k in REPORT_KEYS[:8]) + " | "
                         + _fmt(m.get("t2i_nDCG@25_rougeL"), 4) + " |")
        lines.append("")
    lines += render_paired(results["paired"] if "paired" in results else paired_statistics(results, tags))
    timed = [r for r in results["runs"] if r.get("train_s")]
    if timed:
        lines += ["## Training time", "", "| cell | seconds per run (sum of epoch times, mean) | runs |", "|---|---:|---:|"]
        for cell in results["summary"]:
            t = [r["train_s"] for r in timed if r["cell"] == cell]
            if t:
                lines.append(f"| {cell} | {np.mean(t):.0f} | {len(t)} |")
        lines.append("")
    lines += ["Every number comes from `results.json` next to this file; per-run reports are under `indexes/`.", ""]
    return "\n".join(lines)


def plot_groups(results: dict, out: Path) -> list[Path]:
    """Overlaid training curves: one figure per cell with its seeds, one per sweep with its values."""
    paths = []
    groups: dict[str, list[Path]] = {}
    for r in results["runs"]:
        groups.setdefault(r["cell"], []).append(Path(r["run_dir"]))
    for r in results["sweep_runs"]:
        groups.setdefault(f"{r['cell']}_sweep", []).append(Path(r["run_dir"]))
    for name, runs in groups.items():
        runs = sorted(set(runs))
        dest = out / "plots" / name
        paths += plot_runs(runs, dest)
    return paths


def plot_cells(results: dict, path: Path) -> Path | None:
    """``plots/cells.png``: the reported split's rsum and t2i nDCG of every run, one column per cell, one
    colour per seed with a line joining each seed's runs (the seed-matched comparison at a glance), the
    cell's mean as a bar. None when no run has the metrics."""
    split, cells = results["eval_split"], list(results["summary"])
    by = {(r["cell"], r["seed"]): r["reports"].get(split, {}) for r in results["runs"]}
    seeds = sorted({s for _, s in by})
    keys = [k for k in ("rsum", "t2i_nDCG@25_rougeL") if any(k in rep for rep in by.values())]
    if not cells or not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(max(6.0, 1.3 * len(cells) * len(keys)), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for i, s in enumerate(seeds):
            pts = [(x, by[(c, s)][key]) for x, c in enumerate(cells) if key in by.get((c, s), {})]
            if pts:
                ax.plot(*zip(*pts), "o-", color=f"C{i}", alpha=0.6, lw=0.8, label=f"seed {s}")
        for x, c in enumerate(cells):
            vals = [by[(c, s)][key] for s in seeds if key in by.get((c, s), {})]
            if vals:
                ax.hlines(np.mean(vals), x - 0.3, x + 0.3, color="k", lw=2)
        ax.set_xticks(range(len(cells)), cells, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{split} {key} (bar: mean over seeds)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)
