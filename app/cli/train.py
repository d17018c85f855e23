"""`ltd train` and `ltd plot`."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger("ltd.train")
DEFAULT_TIMEOUT_S = 1800.0  # training.distributed.DEFAULT_TIMEOUT_S (not imported: --help stays torch-free)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("train", parents=[common], help="train a dual encoder (baseline, LTD or ITD)")
    p.add_argument("--config", help="YAML file or preset name (see --list-presets); default: synthetic baseline")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set loss.eta=0.15 (repeatable)")
    p.add_argument("--out", help="run folder (default runs/<train.name or config name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--list-presets", action="store_true", help="print the shipped presets and exit")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel processes on this machine (gloo on the CPU, NCCL with one GPU each on CUDA); "
                        "train.batch_size stays the global batch. Several machines: torchrun … -m app.cli train …")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="data parallel: how long a process waits for a silent peer before it gives up and exits "
                        "(it must cover rank 0's validation; default %(default)s)")
    p.set_defaults(func=cmd_train)

    q = sub.add_parser("plot", parents=[common], help="training curves (λ, L_rec with η, L_con, val rsum) as PNGs")
    q.add_argument("runs", nargs="+", help="run folders (several are overlaid)")
    q.add_argument("--out", help="output folder (default: the run's folder for one run, the current folder for several)")
    q.set_defaults(func=cmd_plot)


def run_name(cfg, config_arg: str | None) -> str:
    if cfg.train.name:
        return cfg.train.name
    return Path(config_arg).stem if config_arg else "synthetic_baseline"


def describe_presets(kind: str = "train") -> list[tuple[str, str, str]]:
    """(name, what it is, what it costs on this kind of CPU) of every shipped preset, from the
    ``# summary:`` and ``# cost …:`` lines at the top of its YAML."""
    from training.config import list_presets, preset_path

    out = []
    for name in list_presets(kind):
        head = {}
        for line in preset_path(name).read_text().splitlines()[:6]:
            if line.startswith("# summary:"):
                head["summary"] = line.split(":", 1)[1].strip()
            elif line.startswith("# cost"):
                head["cost"] = line.split(":", 1)[1].strip()
        out.append((name, head.get("summary", ""), head.get("cost", "")))
    return out


def print_presets(kind: str) -> None:
    """One line per shipped preset: its name, what it is, what it costs on this kind of CPU."""
    rows = describe_presets(kind)
    width = max(len(n) for n, _, _ in rows)
    for name, summary, cost in rows:
        print(f"{name:<{width}}  {summary}" + (f"  [{cost}]" if cost else ""))


def cmd_train(args: argparse.Namespace) -> int:
    from training.config import load_config

    if args.list_presets:
        print_presets("train")
        return 0
    cfg = load_config(args.config, args.set)
    out = Path(args.out) if args.out else Path("runs") / run_name(cfg, args.config)
    from app.pipeline import train_run
    from training import distributed
    from training.errors import UserValueError

    if distributed.launched() and args.nproc > 1:
        raise UserValueError("--nproc starts processes itself: under torchrun, --nproc-per-node sets the count")
    if args.nproc > 1:
        from app.launch import launch_local

        return launch_local(args.nproc, worker_args(args, out), device=cfg.train.device)
    rank = distributed.init_from_env(cfg.train.device, args.dist_timeout)  # a no-op unless launched
    try:
        res = train_run(cfg, out, resume=args.resume, show_progress=not args.no_progress)
    finally:
        distributed.shutdown()
    if not rank.main:
        return 0
    print(json.dumps({"run_dir": str(res.run_dir), "best_val_rsum": round(res.best_rsum, 2),
                      "best_epoch": res.best_epoch, "seconds": round(res.seconds, 1),
                      "best_checkpoint": str(res.run_dir / "best.pt")}))
    return 0


def worker_args(args: argparse.Namespace, out: Path) -> list[str]:
    """The ``ltd train`` arguments each launched process runs (everything but ``--nproc``)."""
    argv = ["train", "--out", str(out), "--dist-timeout", str(args.dist_timeout)]
    argv += ["--config", args.config] if args.config else []
    for s in args.set:
        argv += ["--set", s]
    argv += ["--resume"] * args.resume + ["--no-progress"] * args.no_progress + ["-v"] * getattr(args, "verbose", False)
    return argv


def cmd_plot(args: argparse.Namespace) -> int:
    from training.plots import plot_runs

    for path in plot_runs([Path(r) for r in args.runs], Path(args.out) if args.out else None):
        print(path)
    return 0
