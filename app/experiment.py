"""`ltd experiment`: a grid of train → index → eval runs with seeds, sweeps chosen on validation,
shortcut evaluations, and mean ± std tables.

The grid file is described in ``app/grid.py``. A sweep first trains every value with ``sweep_seeds`` and evaluates on val; the best value is then
trained with all ``seeds`` and reported on ``eval_split``. The test split is never used to choose.
Every step is skipped when its result exists, so an interrupted grid resumes where it stopped.
"""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from app.experiment_stats import paired_statistics, render_paired, seed_matched
from app.grid import Grid, substitute
from indexer import metrics
from training.config import load_config
from training.fsio import atomic_write_text, write_json_atomic

log = logging.getLogger("ltd.experiment")

REPORT_KEYS = [*metrics.REPORT_KEYS, metrics.ndcg_key("t2i"), metrics.ndcg_key("i2t")]


@dataclass
class Job:
    cell: str
    seed: int
    overrides: list[str]
    run_dir: str
    index_root: str
    eval_splits: list[str]
    eval_shortcuts: list[str]
    relevance: str | None
    base: str
    label: str = ""
    sweep_value: object = None


def _value_tag(v: object) -> str:
    return str(v).replace("/", "_").replace(" ", "")


def _run_job(job: Job) -> dict:
    """Train → index (val + eval split, each eval shortcut) → eval. Runs in a worker process."""
    from app.pipeline import ensure_evaluated, ensure_indexed, ensure_trained
    from training.prepare import resolve_dataset_path

    t0 = time.time()
    cfg = load_config(job.base, job.overrides)
    best = ensure_trained(cfg, Path(job.run_dir), show_progress=False)
    ds = resolve_dataset_path(cfg.data.path, cache_dir=cfg.data.cache_dir, synthetic_images=cfg.data.synthetic_images,
                              synthetic_seed=cfg.data.synthetic_seed, show_progress=False)
    out = {"cell": job.cell, "seed": job.seed, "label": job.label, "sweep_value": job.sweep_value,
           "run_dir": job.run_dir, "index_root": job.index_root, "reports": {}}
    for split in job.eval_splits:
        for sc in job.eval_shortcuts:
            if sc != "none" and cfg.data.shortcuts == "none":
                continue  # shortcut evaluation only makes sense for runs trained with shortcuts
            tag = split if sc == "none" else f"{split}_sc-{_value_tag(sc)}"
            ix = ensure_indexed(best, ds, split, Path(job.index_root) / tag, shortcuts=sc, show_progress=False)
            rep = ensure_evaluated(ix, relevance=job.relevance if split != cfg.data.val_split else None,
                                   show_progress=False)
            out["reports"][tag] = {k: rep[k] for k in REPORT_KEYS if k in rep}
    out["wall_s"] = round(time.time() - t0, 1)  # this invocation only (a resumed run is skipped)
    out["train_s"] = round(_train_seconds(Path(job.run_dir) / "metrics.jsonl"), 1)
    return out


def _train_seconds(metrics: Path) -> float:
    """Sum of the epoch times a run logged (survives resumption, excludes validation)."""
    total = 0.0
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("type") == "epoch":
                total += float(row.get("seconds", 0.0))
    return total


def _run_all(jobs: list[Job], n_jobs: int) -> list[dict]:
    if n_jobs <= 1 or len(jobs) <= 1:
        results = []
        for i, j in enumerate(jobs, 1):
            log.info("[%d/%d] %s seed %d", i, len(jobs), j.label or j.cell, j.seed)
            results.append(_run_job(j))
        return results
    # cores / jobs torch threads per worker (an explicit OMP_NUM_THREADS from the user wins). Set in
    # each worker, not only in the environment: forked workers inherit this process's OpenMP pool,
    # which was sized when torch was first imported.
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // n_jobs))
    with ProcessPoolExecutor(n_jobs, initializer=_limit_threads, initargs=(threads,)) as ex:
        return list(ex.map(_run_job, jobs))


def _limit_threads(threads: int) -> None:
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)  # for anything the worker starts
    torch.set_num_threads(threads)


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, "n": int(len(arr)),
            "values": [round(float(v), 4) for v in arr]}


def run_grid(grid: Grid, out: Path, n_jobs: int = 1) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "grid.yaml", yaml.safe_dump(grid.raw, sort_keys=False))
    base_cfg = load_config(grid.base, grid.common)
    val_split = base_cfg.data.val_split

    def job(cell: str, seed: int, sets: list[str], label: str, value=None) -> Job:
        sets = substitute(sets, seed, grid.seeds, out)
        return Job(cell=cell, seed=seed, overrides=grid.common + sets + [f"train.seed={seed}", f"train.name={label}"],
                   run_dir=str(out / "runs" / label / f"seed{seed}"), index_root=str(out / "indexes" / label / f"seed{seed}"),
                   eval_splits=[val_split, grid.eval_split], eval_shortcuts=grid.eval_shortcuts,
                   relevance=grid.relevance, base=grid.base, label=label, sweep_value=value)

    # Phase 0: cells marked `first` (a pretrained model that sweeps fine-tune from), every seed; phase 2
    # finds them finished and only collects their results.
    _run_all([job(c.name, s, c.set, c.name) for c in grid.cells if c.first
              for s in (c.seeds if c.seeds is not None else grid.seeds)], n_jobs)
    # Phase 1: sweeps on their sweep seeds, chosen on val.
    selection: dict[str, dict] = {}
    sweep_jobs = []
    for c in grid.cells:
        if c.sweep:
            (param, values), = c.sweep.items()
            for v in values:
                for s in (c.sweep_seeds if c.sweep_seeds is not None else grid.seeds[:1]):
                    sweep_jobs.append(job(c.name, s, c.set + [f"{param}={v}"],
                                          f"{c.name}@{param.split('.')[-1]}={_value_tag(v)}", v))
    sweep_results = _run_all(sweep_jobs, n_jobs)
    for c in grid.cells:
        if c.sweep:
            (param, values), = c.sweep.items()
            by_v = {v: [r["reports"][val_split]["rsum"] for r in sweep_results
                        if r["cell"] == c.name and r["sweep_value"] == v] for v in values}
            means = {str(v): float(np.mean(x)) for v, x in by_v.items()}
            chosen = max(values, key=lambda v: np.mean(by_v[v]))
            selection[c.name] = {"param": param, "val_rsum": means, "chosen": chosen}
            log.info("%s: chose %s=%s on %s rsum %s", c.name, param, chosen, val_split, means)
    # Phase 2: every cell with all its seeds (a chosen sweep value reuses its sweep runs).
    main_jobs = []
    for c in grid.cells:
        sets = list(c.set)
        label = c.name
        value = None
        if c.name in selection:
            sel = selection[c.name]
            value = sel["chosen"]
            sets += [f"{sel['param']}={value}"]
            label = f"{c.name}@{sel['param'].split('.')[-1]}={_value_tag(value)}"
        for s in (c.seeds if c.seeds is not None else grid.seeds):
            main_jobs.append(job(c.name, s, sets, label, value))
    main_results = _run_all(main_jobs, n_jobs)
    summary: dict[str, dict] = {}
    for c in grid.cells:
        rs = [r for r in main_results if r["cell"] == c.name]
        tags = sorted({t for r in rs for t in r["reports"]})
        summary[c.name] = {t: {k: _stats([r["reports"][t][k] for r in rs if k in r["reports"][t]])
                                  for k in REPORT_KEYS if all(k in r["reports"][t] for r in rs)} for t in tags}
    results = {"name": grid.name, "base": grid.base, "common": grid.common, "seeds": grid.seeds,
               "eval_split": grid.eval_split, "val_split": val_split, "selection": selection,
               "sweep_runs": sweep_results, "runs": main_results, "summary": summary, "compare": grid.compare,
               "machine": machine_description(), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    results["paired"] = paired_statistics(results, [grid.eval_split])
    write_json_atomic(out / "results.json", results, indent=2, default=str)
    atomic_write_text(out / "results.md", render_results(results))
    plot_groups(results, out)
    plot_cells(results, out / "plots" / "cells.png")
    return results


def machine_description() -> dict:
    import platform

    import torch
    cpu = "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _fmt(st: dict | None, digits: int = 1) -> str:
    if not st:
        return "–"
    return f"{st['mean']:.{digits}f} ± {st['std']:.{digits}f}" if st["n"] > 1 else f"{st['mean']:.{digits}f}"


def paired_differences(results: dict, tag: str, key: str = "rsum") -> dict[str, dict]:
    """Per cell, ``key`` minus the reference cell's (the first cell) on the same seeds: mean, sample std
    and how many seeds the cell is ahead. Seed-matched differences cancel what seeds share (feature
    cache, data order), so they say more than comparing two means with overlapping spreads."""
    cells = list(results["summary"])
    out = {}
    for cell in cells[1:]:
        d = seed_matched(results, tag, cells[0], cell, key)
        if d is not None:
            out[cell] = d
    return out


def render_results(results: dict) -> str:
    split = results["eval_split"]
    lines = [f"# Experiment {results['name']}", "",
             f"base `{results['base']}`, common overrides `{' '.join(results['common']) or '–'}`, seeds "
             f"{results['seeds']}; {split} split, mean ± std over seeds (sample std). Machine: "
             f"{results['machine']['cpu']} ({results['machine']['cores']} cores).", ""]
    if results["selection"]:
        lines += ["## Chosen on validation", "", "| cell | parameter | val rsum per value | chosen |", "|---|---|---|---|"]
        for cell, sel in results["selection"].items():
            vals = ", ".join(f"{k}: {v:.1f}" for k, v in sel["val_rsum"].items())
            lines.append(f"| {cell} | {sel['param']} | {vals} | **{sel['chosen']}** |")
        lines.append("")
    tags = sorted({t for s in results["summary"].values() for t in s if t != results["val_split"]})
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
    from training.plots import plot_runs

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
    from training.plots import plt, save_png

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
