"""`ltd train` and `ltd plot`."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from app.cli.launch_args import add_arguments, worker_args
from training.errors import UserFileNotFound, UserValueError

log = logging.getLogger("ltd.train")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("train", parents=[common], help="train a dual encoder (baseline, LTD or ITD)")
    p.add_argument("--config", help="YAML file or preset name (see --list-presets); default: synthetic baseline")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set loss.eta=0.15 (repeatable)")
    p.add_argument("--out", help="run folder (default runs/<train.name or config name>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint, with the run's own config.yaml "
                        "(--config/--set are refused unless they match it)")
    p.add_argument("--list-presets", action="store_true", help="print the shipped presets and exit")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_arguments(p)
    p.set_defaults(func=cmd_train)

    q = sub.add_parser("plot", parents=[common], help="training curves (λ, L_rec with η, L_con, val rsum) as PNGs")
    q.add_argument("runs", nargs="+", help="run folders (several are overlaid)")
    q.add_argument("--out", help="output folder (default: the run's folder for one run, the current folder for several)")
    q.set_defaults(func=cmd_plot)


def run_name(cfg, config_arg: str | None) -> str:
    if cfg.train.name:
        return cfg.train.name
    return Path(config_arg).stem if config_arg else "synthetic_baseline"


CONTAMINATED = "ᴹ"
CONTAMINATED_MEANS = ("the caption encoder or the LTD targets come from a sentence model (all-MiniLM-L6-v2, "
                      "all-mpnet-base-v2) trained on pairs that include Flickr30k and COCO captions: not comparable "
                      "with methods that learn captions from the training split alone (RESULTS.md)")


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
    if any(CONTAMINATED in s for _, s, _ in rows):
        print(f"\n{CONTAMINATED} {CONTAMINATED_MEANS}")


def _differences(saved: object, asked: object, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two config dicts."""
    if isinstance(saved, dict) and isinstance(asked, dict):
        return [d for k in dict.fromkeys([*saved, *asked])
                for d in _differences(saved.get(k), asked.get(k), f"{prefix}{k}.")]
    return [] if saved == asked else [prefix.rstrip(".")]


def resume_config(out: Path, config_arg: str | None, sets: list[str]):
    """The config a resumed run continues with: its own ``config.yaml``. A --config or --set that would
    change it is refused (a resumed run must replay the run it continues); a run with no checkpoint yet
    (it stopped before its first) is said to start over."""
    from training.config import load_config

    saved = out / "config.yaml"
    if not saved.is_file():
        what = "a checkpoint but no config.yaml" if (out / "checkpoint.pt").is_file() else "no run (no config.yaml)"
        raise UserFileNotFound(f"--resume: {out} holds {what}; nothing to continue (train it without --resume, "
                               "or name the run's folder with --out)")
    cfg = load_config(saved)
    if config_arg or sets:
        changed = _differences(cfg.to_dict(), load_config(config_arg or saved, sets).to_dict())
        if changed:
            raise UserValueError(f"--resume continues {out} with its config.yaml; the command line would change "
                                 f"{', '.join(changed[:8])}{' …' if len(changed) > 8 else ''}. Drop --config/--set "
                                 "(or give the same values), or start a new run in another --out")
    if not (out / "checkpoint.pt").is_file():
        log.warning("%s stopped before its first checkpoint: nothing to continue from, so it trains again from the "
                    "start with its config.yaml", out)
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from training.config import load_config

    if args.list_presets:
        print_presets("train")
        return 0
    if args.resume and args.out:
        out = Path(args.out)
        cfg = resume_config(out, args.config, args.set)
    else:
        cfg = load_config(args.config, args.set)
        out = Path(args.out) if args.out else Path("runs") / run_name(cfg, args.config)
        if args.resume:
            cfg = resume_config(out, args.config, args.set)
    from app.launch import data_parallel_command
    from app.pipeline import train_run
    from training.device import using_device

    with using_device(cfg.train.device):  # what the launcher checks and the process group's backend
        code, res = data_parallel_command(args, worker_args(args, ["train"], out),
                                          lambda: train_run(cfg, out, resume=args.resume))
    if res is not None:
        print(json.dumps({"run_dir": str(res.run_dir), "best_val_rsum": round(res.best_rsum, 2),
                          "best_epoch": res.best_epoch, "seconds": round(res.seconds, 1),
                          "best_checkpoint": str(res.run_dir / "best.pt")}))
    return code


def cmd_plot(args: argparse.Namespace) -> int:
    from training.plots import plot_runs

    for path in plot_runs([Path(r) for r in args.runs], Path(args.out) if args.out else None):
        print(path)
    return 0
