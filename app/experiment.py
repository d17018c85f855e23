"""`ltd experiment`: a grid of train → index → eval runs with seeds, sweeps chosen on validation,
shortcut evaluations, and mean ± std tables.

The grid file is described in ``app/grid.py``. A sweep first trains every value with ``sweep_seeds`` and evaluates on
val; the best value is then trained with all ``seeds`` and reported on ``eval_split``. The test split is never used to choose.
Every step is skipped when its result exists, so an interrupted grid resumes where it stopped.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from app.experiment_report import REPORT_KEYS, reported_tags, write_results
from app.experiment_stats import paired_statistics
from app.grid import Grid, substitute, sweep_label, sweep_sets, value_tag
from app.pipeline import ensure_evaluated, ensure_indexed, ensure_trained
from indexer.evaluate import load_report
from training.config import load_config
from training.fsio import atomic_write_text
from training.prepare import resolve_dataset_path
from training.progress import duration, progress, quiet

log = logging.getLogger("ltd.experiment")

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
    nproc: int = 1  # data-parallel training processes


def _run_job(job: Job) -> dict:
    """Train → index (val + eval split, each eval shortcut) → eval. Runs in a worker process, silent
    (the grid's own counter reports the runs)."""
    with quiet():
        return _job_steps(job)


def _job_steps(job: Job) -> dict:
    t0 = time.time()
    cfg = load_config(job.base, job.overrides)
    best = ensure_trained(cfg, Path(job.run_dir), nproc=job.nproc)
    ds = resolve_dataset_path(cfg.data.path, cache_dir=cfg.data.cache_dir, synthetic_images=cfg.data.synthetic_images,
                              synthetic_seed=cfg.data.synthetic_seed)
    out = {"cell": job.cell, "seed": job.seed, "label": job.label, "sweep_value": job.sweep_value,
           "run_dir": job.run_dir, "index_root": job.index_root, "reports": {}}
    for split in job.eval_splits:
        for sc in job.eval_shortcuts:
            if sc != "none" and cfg.data.shortcuts == "none":
                continue  # shortcut evaluation only makes sense for runs trained with shortcuts
            tag = split if sc == "none" else f"{split}_sc-{value_tag(sc)}"
            ix = ensure_indexed(best, ds, split, Path(job.index_root) / tag, shortcuts=sc)
            rep = ensure_evaluated(ix, relevance=job.relevance if split != cfg.data.val_split else None)
            out["reports"][tag] = {k: rep[k] for k in REPORT_KEYS if k in rep}
    out["wall_s"] = round(time.time() - t0, 1)  # this invocation only (a resumed run is skipped)
    out["train_s"] = round(_train_seconds(Path(job.run_dir) / "metrics.jsonl"), 1)
    return out


def _train_seconds(metrics: Path) -> float:
    """Sum of the epoch times a run logged (survives resumption, excludes validation)."""
    return sum(float(row.get("seconds", 0.0)) for row in _epoch_rows(metrics))


def _collect_job(job: Job) -> dict | None:
    """A finished job's result read from its folders (``--render``), or None while any of its
    reports is missing: trains, indexes and evaluates nothing."""
    cfg = load_config(job.base, job.overrides)
    out = {"cell": job.cell, "seed": job.seed, "label": job.label, "sweep_value": job.sweep_value,
           "run_dir": job.run_dir, "index_root": job.index_root, "reports": {}}
    for split in job.eval_splits:
        for sc in job.eval_shortcuts:
            if sc != "none" and cfg.data.shortcuts == "none":
                continue
            tag = split if sc == "none" else f"{split}_sc-{value_tag(sc)}"
            rep = load_report(Path(job.index_root) / tag)
            if rep is None:
                return None
            out["reports"][tag] = {k: rep[k] for k in REPORT_KEYS if k in rep}
    out["train_s"] = round(_train_seconds(Path(job.run_dir) / "metrics.jsonl"), 1)
    return out


def _job_state(job: Job) -> dict:
    """A run the grid has not finished: how many of its epochs it trained (a killed run resumes from its
    last checkpoint) or that it only waits for its index and evaluation."""
    epochs = load_config(job.base, job.overrides).train.epochs
    done = max((row.get("epoch", 0) for row in _epoch_rows(Path(job.run_dir) / "metrics.jsonl")), default=0)
    state = ("not started" if not done and not (Path(job.run_dir) / "checkpoint.pt").is_file()
             else "trained; index or evaluation missing" if done >= epochs else f"epoch {done} of {epochs} trained")
    return {"label": job.label or job.cell, "seed": job.seed, "state": state}


def _epoch_rows(metrics: Path) -> list[dict]:
    """The ``epoch`` rows a run logged (none when it has no log yet; a torn last line is skipped)."""
    rows = []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and row.get("type") == "epoch":
                rows.append(row)
    return rows


def _run_all(jobs: list[Job], n_jobs: int, collect: bool = False, desc: str = "grid runs") -> list[dict]:
    """Every job's result, in the jobs' order. A progress bar (or a log line a run) counts the runs; those
    a killed grid already finished count from the start and are only read back, so the time left is the
    pace of the runs that train (with several at a time: :class:`_TimeLeft`)."""
    if collect:
        return [r for r in map(_collect_job, jobs) if r is not None]
    if not jobs:
        return []
    results = {i: r for i, j in enumerate(jobs) if (r := _collect_job(j)) is not None}
    todo = [i for i in range(len(jobs)) if i not in results]
    parallel = n_jobs > 1 and len(todo) > 1
    with progress(total=len(jobs), initial=len(results), desc=desc, unit="run", pace=not parallel) as bar:
        left = _TimeLeft(len(todo), n_jobs, time.monotonic()) if parallel else None

        def done(i: int, r: dict) -> None:
            results[i] = r
            post = {"last": f"{jobs[i].label or jobs[i].cell} seed {jobs[i].seed}"}
            if left is not None:
                now = time.monotonic()
                left.finished(r["wall_s"], now)
                post["left"] = f"~{duration(left.seconds(now))}"
            bar.set_postfix(**post)
            bar.update(1)

        if not parallel:
            for i in todo:
                log.info("[%d/%d] %s seed %d", i + 1, len(jobs), jobs[i].label or jobs[i].cell, jobs[i].seed)
                done(i, _run_job(jobs[i]))
        else:
            # cores / jobs torch threads per worker (an explicit OMP_NUM_THREADS from the user wins). Set in
            # each worker, not only in the environment: forked workers inherit this process's OpenMP pool,
            # which was sized when torch was first imported.
            threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // n_jobs))
            with ProcessPoolExecutor(n_jobs, initializer=_limit_threads, initargs=(threads,)) as ex:
                futures = {ex.submit(_run_job, jobs[i]): i for i in todo}
                for f in as_completed(futures):
                    done(futures[f], f.result())
    return [results[i] for i in range(len(jobs))]


class _TimeLeft:
    """Time left of ``n`` runs that go ``workers`` at a time. Counting finished runs alone misleads
    when they finish in bursts (two runs started together end together: the first one's pace is half the
    grid's). Instead: each run's own duration (their mean is the next runs' guess), when each run in
    flight started (a worker takes the next run when one ends), and the schedule that follows."""

    def __init__(self, n: int, workers: int, now: float):
        self.workers = max(1, min(workers, n))
        self.waiting = n - self.workers
        self.starts = [now] * self.workers  # of the runs in flight
        self.durations: list[float] = []

    def finished(self, seconds: float, now: float) -> None:
        self.durations.append(seconds)
        if self.starts:  # the run in flight whose start fits this one best
            self.starts.remove(min(self.starts, key=lambda s: abs(s - (now - seconds))))
        if self.waiting:
            self.waiting -= 1
            self.starts.append(now)

    def seconds(self, now: float) -> float:
        d = sum(self.durations) / len(self.durations)
        free = sorted(max(d - (now - s), 0.0) for s in self.starts)  # when each busy worker frees up
        free += [0.0] * (self.workers - len(free))
        for _ in range(self.waiting):  # each waiting run goes to the worker that frees up first
            free[0] += d
            free.sort()
        return max(free, default=0.0)


def _limit_threads(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for anything the worker starts
    torch.set_num_threads(threads)


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, "n": int(len(arr)),
            "values": [round(float(v), 4) for v in arr]}


def _choose(grid: Grid, sweep_results: list[dict], val_split: str) -> dict[str, dict]:
    """Each sweep's value with the best mean val rsum over its sweep seeds; a sweep with a run
    missing (``--render`` of a grid still running) is left out."""
    selection = {}
    for c in grid.cells:
        if c.sweep:
            (param, values), = c.sweep.items()
            by_v = [[r["reports"][val_split]["rsum"] for r in sweep_results
                     if r["cell"] == c.name and r["sweep_value"] == v] for v in values]
            if any(len(x) < len(c.sweep_seeds if c.sweep_seeds is not None else grid.seeds[:1]) for x in by_v):
                continue
            means = {value_tag(v): float(np.mean(x)) for v, x in zip(values, by_v)}
            chosen = values[int(np.argmax([np.mean(x) for x in by_v]))]
            selection[c.name] = {"param": param, "val_rsum": means, "chosen": chosen}
            log.info("%s: chose %s=%s on %s rsum %s", c.name, param, chosen, val_split, means)
    return selection


def run_grid(grid: Grid, out: Path, n_jobs: int = 1, render_only: bool = False, nproc: int | None = None) -> dict:
    """Run the grid (sweeps on val, then every cell's seeds) and write its results; ``render_only``
    writes the results of the runs that have finished and trains nothing (a grid still running);
    ``nproc`` data-parallel processes per run unless a cell or the grid names its own."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "grid.yaml", yaml.safe_dump(grid.raw, sort_keys=False))
    base_cfg = load_config(grid.base, grid.common)
    val_split = base_cfg.data.val_split

    cell_nproc = {c.name: c.nproc or nproc or grid.nproc for c in grid.cells}

    def job(cell: str, seed: int, sets: list[str], label: str, value=None) -> Job:
        sets = substitute(sets, seed, grid.seeds, out)
        return Job(cell=cell, seed=seed, overrides=grid.common + sets + [f"train.seed={seed}", f"train.name={label}"],
                   run_dir=str(out / "runs" / label / f"seed{seed}"), index_root=str(out / "indexes" / label / f"seed{seed}"),
                   eval_splits=[val_split, grid.eval_split], eval_shortcuts=grid.eval_shortcuts,
                   relevance=grid.relevance, base=grid.base, label=label, sweep_value=value, nproc=cell_nproc[cell])

    # Phase 0: cells marked `first` (a pretrained model that sweeps fine-tune from), every seed; phase 2
    # finds them finished and only collects their results.
    _run_all([job(c.name, s, c.set, c.name) for c in grid.cells if c.first
              for s in (c.seeds if c.seeds is not None else grid.seeds)], n_jobs)
    # Phase 1: sweeps on their sweep seeds, chosen on val.
    sweep_jobs = []
    for c in grid.cells:
        if c.sweep:
            (param, values), = c.sweep.items()
            for v in values:
                for s in (c.sweep_seeds if c.sweep_seeds is not None else grid.seeds[:1]):
                    sweep_jobs.append(job(c.name, s, c.set + sweep_sets(param, v), sweep_label(c.name, param, v), v))
    sweep_results = _run_all(sweep_jobs, n_jobs, collect=render_only, desc="sweep runs (val)")
    selection = _choose(grid, sweep_results, val_split)
    # Phase 2: every cell with all its seeds (a chosen sweep value reuses its sweep runs).
    main_jobs, waiting = [], []
    for c in grid.cells:
        sets, label, value = list(c.set), c.name, None
        if c.sweep and c.name not in selection:
            waiting.append({"label": c.name, "seed": "every", "state": "waits for its sweep"})
            continue  # --render while its sweep runs
        if c.name in selection:
            sel = selection[c.name]
            value = sel["chosen"]
            sets += sweep_sets(sel["param"], value)
            label = sweep_label(c.name, sel["param"], value)
        for s in (c.seeds if c.seeds is not None else grid.seeds):
            main_jobs.append(job(c.name, s, sets, label, value))
    # Seed by seed in the grid's order (every cell of its first seed, then of its second, …; stable, so
    # cells keep their order): a grid stopped part-way has whole seeds for the seed-matched comparisons.
    rank = {s: i for i, s in enumerate(grid.seeds)}
    main_jobs.sort(key=lambda j: (rank.get(j.seed, len(rank)), j.seed))
    main_results = _run_all(main_jobs, n_jobs, collect=render_only)
    summary: dict[str, dict] = {}
    for c in grid.cells:
        rs = [r for r in main_results if r["cell"] == c.name]
        if not rs:
            continue
        tags = sorted({t for r in rs for t in r["reports"]})
        summary[c.name] = {t: {k: _stats([r["reports"][t][k] for r in rs if k in r["reports"][t]])
                               for k in REPORT_KEYS if all(k in r["reports"][t] for r in rs)} for t in tags}
    results = {"name": grid.name, "base": grid.base, "common": grid.common, "seeds": grid.seeds,
               "eval_split": grid.eval_split, "val_split": val_split, "selection": selection,
               "sweep_runs": sweep_results, "runs": main_results, "summary": summary, "compare": grid.compare,
               "machine": machine_description(), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
               "partial": len(main_results) < len(main_jobs) or len(sweep_results) < len(sweep_jobs)}
    if results["partial"]:  # --render while the grid runs (or after it was stopped): where each missing run stands
        have = {(r["label"], r["seed"]) for r in sweep_results + main_results}
        missing = {(j.label, j.seed): j for j in sweep_jobs + main_jobs if (j.label, j.seed) not in have}
        results["missing"] = [_job_state(j) for j in missing.values()] + waiting
    results["paired"] = paired_statistics(results, reported_tags(results))
    write_results(results, out)
    return results


def machine_description() -> dict:
    cpu = "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
