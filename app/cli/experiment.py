"""`ltd experiment --config GRID.yaml [--jobs N]`, and `--render` to rewrite results without training."""
from __future__ import annotations

import argparse
from pathlib import Path

from training.errors import UserValueError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("experiment", parents=[common], help="run a resumable grid of train → index → eval (seeds, sweeps, shortcuts)")
    p.add_argument("--config", help="grid YAML (see app/experiment.py and grids/*.yaml); required unless --render")
    p.add_argument("--out", help="output folder (default experiments/<grid name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every cell, after the grid's own 'set' (repeatable), e.g. --set loss.eta=0.15")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes; default 1)")
    p.add_argument("--render", action="store_true",
                   help="train nothing: rewrite results.{json,md} with the current statistics — from the finished "
                        "runs of --config's grid (also while it runs), or without --config from --out's results.json "
                        "(a finished grid or a copy under docs/results/)")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="data-parallel processes per training run (ltd train --nproc; default: the grid's nproc, 1)")
    p.set_defaults(func=cmd_experiment)


def cmd_experiment(args: argparse.Namespace) -> int:
    from app.experiment import run_grid
    from app.experiment_report import rerender
    from app.grid import load_grid

    if args.jobs < 1:
        raise UserValueError("--jobs must be at least 1")
    if args.nproc is not None and args.nproc < 1:
        raise UserValueError("--nproc must be at least 1")
    if args.config is None:
        if not (args.render and args.out):
            raise UserValueError("--config is required (or --render --out FOLDER to re-render a results.json)")
        out = Path(args.out)
        res = rerender(out)
    else:
        grid = load_grid(args.config, args.set)
        out = Path(args.out) if args.out else Path("experiments") / grid.name
        res = run_grid(grid, out, n_jobs=args.jobs, render_only=args.render, nproc=args.nproc)
    print((out / "results.md").read_text())
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}" + ("" if args.render and not args.config
                                                                        else f" and plots under {out / 'plots'}"))
    return 0 if res["runs"] else 1
