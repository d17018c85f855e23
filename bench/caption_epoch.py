"""Captioner epoch times on cached grid features (run on demand, not a test).

    python bench/caption_epoch.py --config caption_flickr8k_sr_fl --retrieval JUDGE.pt [--steps 20] [--set k=v]

Runs ``--steps`` XE steps and ``--steps`` SCST steps of the real training loop's step functions and
extrapolates to one epoch of each stage; also times beam-5 generation (captions/s) on val images.
The machine may be shared: the numbers are what this run saw, not a benchmark of a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> dict:
    from training.captioning import loop
    from training.captioning.config import load_caption_config
    from training.captioning.data import prepare_captioning, regions
    from training.captioning.inference import decode_regions
    from training.captioning.steps import scst_step, set_up_negatives, xe_step
    from training.captioning.xe import epoch_captions
    from training.device import pick_device, using_device

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="caption_flickr8k_sr_fl")
    ap.add_argument("--retrieval", default="")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args(argv)
    sets = args.set + ([f"train.retrieval={args.retrieval}"] if args.retrieval else [])
    cfg = load_caption_config(args.config, sets)
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    with tempfile.TemporaryDirectory() as tmp, using_device(pick_device(cfg.train.device)):
        data = prepare_captioning(cfg)
        run = loop.set_up(cfg, data, Path(tmp) / "run")
        d, out = run.data, {"config": args.config, "threads": torch.get_num_threads(), "sets": args.set}
        batches = loop.epoch_batches(run, "xe", 0)
        caps = epoch_captions(d.train.image_to_captions, np.concatenate(batches), cfg.xe.captions_per_image,
                              np.random.default_rng(0))
        off = np.cumsum([0] + [len(b) for b in batches])
        gen = torch.Generator().manual_seed(0)
        n = min(args.steps, len(batches))
        t = time.perf_counter()
        for s in range(n):
            xe_step(run, batches[s], caps[off[s]:off[s + 1]], 0.25, gen)
        out["xe_step_s"] = (time.perf_counter() - t) / n
        out["xe_epoch_s"] = out["xe_step_s"] * len(batches)
        run.at.stage, run.optimizer = "scst", loop.stage_optimizer(cfg, run.model, "scst")
        set_up_negatives(run)
        sb = loop.epoch_batches(run, "scst", 0)
        n = min(args.steps, len(sb))
        t = time.perf_counter()
        for s in range(n):
            scst_step(run, sb[s], np.random.default_rng(s), gen)
        out["scst_step_s"] = (time.perf_counter() - t) / n
        out["scst_epoch_s"] = out["scst_step_s"] * len(sb)
        rows = d.val_rows[:200]
        t = time.perf_counter()
        for i in range(0, len(rows), 50):
            decode_regions(run.model, regions(d.grid, rows[i:i + 50]), d.vocab, beam=5)
        out["beam5_captions_per_s"] = len(rows) / (time.perf_counter() - t)
        t = time.perf_counter()
        loop.run_validation(run, epoch=0)
        out["val_s"] = time.perf_counter() - t
        out["xe_steps_per_epoch"], out["scst_steps_per_epoch"] = len(batches), len(sb)
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}))
    return out


if __name__ == "__main__":
    main()
