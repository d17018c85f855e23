"""`ltd experiment --config GRID.yaml [--jobs N]`."""
from __future__ import annotations

import argparse
from pathlib import Path

from training.errors import UserValueError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("experiment", parents=[common], help="run a resumable grid of train → index → eval (seeds, sweeps, shortcuts)")
    p.add_argument("--config", required=True, help="grid YAML (see app/experiment.py and grids/*.yaml)")
    p.add_argument("--out", help="output folder (default experiments/<grid name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every cell, after the grid's own 'set' (repeatable), e.g. --set loss.eta=0.15")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes; default 1)")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="data-parallel processes per training run (ltd train --nproc; default: the grid's nproc, 1)")
    p.set_defaults(func=cmd_experiment)


def cmd_experiment(args: argparse.Namespace) -> int:
    from app.experiment import run_grid
    from app.grid import load_grid

    if args.jobs < 1:
        raise UserValueError("--jobs must be at least 1")
    grid = load_grid(args.config, args.set)
    out = Path(args.out) if args.out else Path("experiments") / grid.name
    if args.nproc is not None and args.nproc < 1:
        raise UserValueError("--nproc must be at least 1")
    res = run_grid(grid, out, n_jobs=args.jobs, nproc=args.nproc)
    print((out / "results.md").read_text())
    print(f"wrote {out / 'results.json'}, {out / 'results.md'} and plots under {out / 'plots'}")
    return 0 if res["runs"] else 1
