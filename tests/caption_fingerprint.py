"""Fingerprint tiny synthetic captioner runs over every path of its loop, bitwise (a tool, not a test).

    LTD_CACHE_DIR=/tmp/cfp/cache python tests/caption_fingerprint.py /tmp/cfp/before.json   # old code
    LTD_CACHE_DIR=/tmp/cfp/cache python tests/caption_fingerprint.py /tmp/cfp/after.json    # new code
    python tests/caption_fingerprint.py --compare /tmp/cfp/before.json /tmp/cfp/after.json

The retrieval loop's tool (``tests/train_fingerprint.py``) for ``training/captioning/loop.py``: per case
the metrics.jsonl lines (wall-clock ``seconds`` removed) and a sha256 of every tensor and plain value of
checkpoint.pt and best.pt. Cases: XE with dropout and scheduled sampling, SCST on CIDEr-D (greedy
baseline, and 3 samples with the mean of the others), SR-FL and SR-PL with a judge and distractors,
XE early stopping into SCST, SCST from ``train.init_from``, and killed-then-resumed runs (mid-epoch in
XE, mid-epoch in SCST, at the XE → SCST switch). The judge is trained once beside OUT and reused, so
its checkpoint (whose sha256 the captioner's checkpoints record) is the same file for both runs.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_fingerprint import Killed, compare, fingerprint_run  # noqa: E402

TINY = ["data.synthetic_images=60", "data.image_size=64", "data.min_word_count=2", "model.word_dim=32",
        "model.hidden=32", "model.att_dim=32", "xe.batch_size=8", "scst.batch_size=8", "train.log_every=1"]


def kill_after(when):
    """Patch the caption checkpoint writer so the run stops right after a checkpoint.pt where when(payload)."""
    from training.captioning import checkpoint as ck

    real = ck.save_caption_checkpoint

    def save_then_die(path, payload):
        real(path, payload)
        if Path(path).name == "checkpoint.pt" and when(payload):
            raise Killed

    ck.save_caption_checkpoint = save_then_die
    return lambda: setattr(ck, "save_caption_checkpoint", real)


def judge(out: Path) -> Path:
    from conftest import tiny_config

    from app.pipeline import train_run

    path = out.parent / "judge" / "best.pt"
    if not path.exists():
        train_run(tiny_config("none"), path.parent)
    return path


def cases(root: Path, judge_path: Path):
    from training.captioning.config import load_caption_config

    j = [f"train.retrieval={judge_path}"]
    c = lambda preset, extra: load_caption_config(preset, TINY + extra)  # noqa: E731
    yield "xe", c("caption_synthetic_xe", ["xe.epochs=3", "xe.ss_every=1", "xe.lr_decay_every=1"]), None
    yield "scst_greedy", c("caption_synthetic_scst_cider", ["xe.epochs=1", "scst.epochs=2"]), None
    yield "scst_mean3", c("caption_synthetic_scst_cider", ["xe.epochs=1", "scst.epochs=1", "scst.samples=3",
                                                           "scst.baseline=mean"]), None
    yield "sr_fl", c("caption_synthetic_sr_fl", ["xe.epochs=1", "scst.epochs=2", *j]), None
    yield "sr_pl", c("caption_synthetic_sr_pl", ["xe.epochs=1", "scst.epochs=1", "scst.h_min=1", "scst.h_max=5",
                                                 "scst.distractors=5", "scst.samples=3", "scst.baseline=mean", *j]), None
    yield "xe_patience", c("caption_synthetic_scst_cider", ["xe.epochs=6", "xe.patience=1", "scst.epochs=1"]), None
    yield "init_from", c("caption_synthetic_scst_cider", ["xe.epochs=0", "scst.epochs=1",
                                                          f"train.init_from={root / 'xe' / 'best.pt'}"]), None
    yield "resume_xe_mid", c("caption_synthetic_xe", ["xe.epochs=2", "train.checkpoint_every=2"]), \
        lambda p: p["stage"] == "xe" and p["epoch"] == 1 and p["step_in_epoch"] == 2
    yield "resume_scst_mid", c("caption_synthetic_sr_fl", ["xe.epochs=1", "scst.epochs=2", "train.checkpoint_every=3",
                                                           *j]), \
        lambda p: p["stage"] == "scst" and p["step_in_epoch"] > 0
    yield "resume_switch", c("caption_synthetic_scst_cider", ["xe.epochs=2", "scst.epochs=1"]), \
        lambda p: p["stage"] == "xe" and p["epoch"] == 2


def run_all(out: Path) -> None:
    from training.captioning.loop import train_captioner

    logging.basicConfig(level=logging.WARNING)
    root = Path(os.environ.get("FP_RUNS", out.parent / "runs"))
    shutil.rmtree(root, ignore_errors=True)
    result = {}
    for name, cfg, kill in cases(root, judge(out)):
        t, run = time.time(), root / name
        if kill is not None:
            restore = kill_after(kill)
            try:
                train_captioner(cfg, run)
                raise AssertionError(f"{name}: the kill never fired")
            except Killed:
                pass
            finally:
                restore()
            train_captioner(cfg, run, resume=True)
        else:
            train_captioner(cfg, run)
        result[name] = fingerprint_run(run)
        print(f"{name}: {time.time() - t:.1f}s, {len(result[name]['metrics'])} rows", flush=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    run_all(Path(sys.argv[1]))
