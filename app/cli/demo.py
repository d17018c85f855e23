"""`ltd demo`: the whole loop on one machine — train a baseline and an LTD model, index and evaluate
both, print the comparison, then serve the API and the UI.

With no dataset (and no ``LTD_DATA_DIR``) it uses the embedded synthetic scenes, so it runs anywhere.
There both models train on scenes whose every image and caption carry a number of their own (SVL's
"unique" shortcut): a contrastive loss can match pairs by the number alone and let the rest of the
caption go, which is what LTD's reconstruction target (the caption without its number) resists. Test
is evaluated without the shortcut (what each model learned of the scenes: the indexes served) and
with it. Re-running reuses every finished step.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("ltd.demo")

PRESETS = {"synthetic": ("synthetic_svl_baseline", "synthetic_svl_ltd"), "karpathy": ("flickr8k_fne_sbert_baseline", "flickr8k_fne_sbert_ltd")}


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from app.cli.serve import add_bind_args

    p = sub.add_parser("demo", parents=[common], help="train baseline + LTD, index, evaluate, compare and serve (end to end)")
    p.add_argument("--dataset", help="Karpathy JSON or its folder (default: $LTD_DATA_DIR, else synthetic scenes)")
    p.add_argument("--synthetic", action="store_true", help="use the synthetic scenes even if LTD_DATA_DIR is set")
    p.add_argument("--out", default="demo", help="folder for runs/ and indexes/ (default ./demo)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to both models (e.g. train.epochs=3)")
    p.add_argument("--no-serve", action="store_true", help="stop after printing the comparison table")
    add_bind_args(p)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_demo)


def choose_dataset(args: argparse.Namespace) -> tuple[str, str]:
    """(kind, data.path): an explicit --dataset, else $LTD_DATA_DIR when it holds a dataset, else synthetic."""
    if args.dataset:
        return "karpathy", str(Path(args.dataset).expanduser().resolve())
    env = os.environ.get("LTD_DATA_DIR")
    if env and not args.synthetic:
        d = Path(env)
        if d.is_file() or list(d.glob("dataset_*.json")):
            return "karpathy", str(d.resolve())
        log.warning("LTD_DATA_DIR=%s holds no dataset_*.json; using the synthetic scenes", env)
    return "synthetic", ""


def cmd_demo(args: argparse.Namespace) -> int:
    from app.pipeline import ensure_evaluated, ensure_indexed, ensure_trained
    from indexer.disagreement import compare_indexes, to_markdown
    from training.config import load_config
    from training.losses.objective import describe_loss
    from training.prepare import resolve_dataset_path

    t0 = time.time()
    progress = not args.no_progress
    if not args.no_serve:  # refuse an accidental exposure now, not after the training
        from app.cli.serve import bind_policy
        from app.api.settings import Settings

        token = Settings().api_token
        hosts = bind_policy(args.host, args.expose, args.allowed_host, token.get_secret_value() if token else None)
    kind, data_path = choose_dataset(args)
    names = dict(zip(("bl", "ltd"), PRESETS[kind]))
    cfgs = {n: load_config(p, [f"data.path={data_path}", *args.set]) for n, p in names.items()}
    json_path = resolve_dataset_path(data_path, cache_dir=cfgs["bl"].data.cache_dir,
                                     synthetic_images=cfgs["bl"].data.synthetic_images,
                                     synthetic_seed=cfgs["bl"].data.synthetic_seed, show_progress=progress)
    root = Path(args.out) / json_path.stem.replace("dataset_", "")
    print(f"demo: dataset {json_path} → {root} (baseline {names['bl']}, LTD {names['ltd']})", flush=True)
    shortcut = cfgs["bl"].data.shortcuts
    reports, indexes, with_shortcut = {}, {}, {}
    for name, cfg in cfgs.items():
        print(f"[{name}] training ({describe_loss(cfg.loss)['mode']}, {cfg.train.epochs} epochs"
              + (f", shortcuts {shortcut} in training" if shortcut != "none" else "") + ")", flush=True)
        best = ensure_trained(cfg, root / "runs" / name, show_progress=progress)
        print(f"[{name}] indexing and evaluating the test split" + (" without and with the shortcut" if shortcut != "none"
                                                                    else ""), flush=True)
        ix = ensure_indexed(best, json_path, "test", root / "indexes" / name, show_progress=progress)
        reports[name], indexes[name] = ensure_evaluated(ix, show_progress=progress), ix
        if shortcut != "none":
            ix_sc = ensure_indexed(best, json_path, "test", root / "indexes" / f"{name}_shortcut", shortcuts=shortcut,
                                   show_progress=progress)
            with_shortcut[name] = ensure_evaluated(ix_sc, show_progress=progress)
    print_comparison(reports, with_shortcut, shortcut)
    rows = compare_indexes(indexes["bl"], indexes["ltd"])
    print("\nQueries where the two models disagree most (rank of the first ground truth):\n")
    print(to_markdown(rows, "bl", "ltd", top=8))
    print(f"\ndemo ready in {time.time() - t0:.0f} s. Reports: {root / 'indexes' / 'bl' / 'report.md'}, "
          f"{root / 'indexes' / 'ltd' / 'report.md'}", flush=True)
    if args.no_serve:
        return 0
    from app.cli.serve import serve
    from search import SearchService

    models = {n: str(ix.path.resolve()) for n, ix in indexes.items()}
    service = SearchService(models, config=Settings().search_config())
    service.load()
    return serve(Settings(models=models, load_in_background=False, allowed_hosts=hosts), host=args.host,
                 port=args.port, service=service)


def print_comparison(reports: dict[str, dict], with_shortcut: dict[str, dict], shortcut: str) -> None:
    """The test tables (without the shortcut, then with it) and one sentence on what they show."""
    from app.pipeline import comparison_table

    if not with_shortcut:
        print("\nBaseline (bl) vs LTD (ltd) on the test split:\n")
        print(comparison_table(reports))
        return
    print(f"\nBoth models were trained with the {shortcut!r} shortcut. Test WITHOUT it (what each model learned "
          "of the scenes; these indexes are served):\n")
    print(comparison_table(reports))
    print("\nTest WITH the shortcut (what matching by the number buys):\n")
    print(comparison_table(with_shortcut))
    bl, ltd = reports["bl"]["rsum"], reports["ltd"]["rsum"]
    bl_sc = with_shortcut["bl"]["rsum"]
    verdict = (f"LTD keeps {ltd - bl:+.1f} rsum more of the scenes than the baseline"
               if ltd > bl else f"here LTD did not keep more of the scenes than the baseline ({ltd - bl:+.1f} rsum)")
    print(f"\nIn one sentence: the baseline leans on the shortcut (rsum {bl_sc:.1f} with it, {bl:.1f} without), and "
          f"{verdict}, because its decoder must rebuild each caption's sentence embedding without the number "
          "(RESULTS.md §4b: 3 seeds).")
