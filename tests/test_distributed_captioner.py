"""The captioner data parallel (training/captioning/steps.py) in real gloo process groups: XE on 2 × 4
images is 1 × 8's, SCST's self-retrieval judge ranks every process's captions against the whole global
batch, and `ltd caption train --nproc 2` runs XE then SCST end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_config
from ranks import run_ranks

TINY_CAP = ["data.synthetic_images=60", "data.image_size=64", "data.min_word_count=2", "model.word_dim=32",
            "model.hidden=32", "model.att_dim=32", "model.dropout=0", "xe.epochs=1", "scst.epochs=1",
            "xe.batch_size=8", "scst.batch_size=8", "train.log_every=1"]


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    from app.pipeline import train_run

    res = train_run(tiny_config("none"), tmp_path_factory.mktemp("judge") / "run")
    return str(res.run_dir / "best.pt")


def _sr_pl(judge: str) -> list[str]:
    return TINY_CAP + [f"train.retrieval={judge}", "scst.h_min=1", "scst.h_max=5", "scst.distractors=5"]


def _caption_steps(rank: int, world: int, judge: str, run_dir: str) -> dict:
    """Two XE steps, then one SR-PL SCST step whose reward calls are recorded."""
    from pathlib import Path

    from training.captioning import loop, steps
    from training.captioning.config import load_caption_config
    from training.captioning.data import prepare_captioning
    from training.captioning.xe import epoch_captions

    cfg = load_caption_config("caption_synthetic_sr_pl", _sr_pl(judge))
    run = loop.set_up(cfg, prepare_captioning(cfg), Path(run_dir))
    d, seed = run.data, cfg.train.seed
    batches = loop.epoch_batches(run, "xe", 0)
    caps = epoch_captions(d.train.image_to_captions, np.concatenate(batches), cfg.xe.captions_per_image,
                          np.random.default_rng([seed, 0, 0, 1]))
    xe = [steps.xe_step(run, batches[s], caps[8 * s : 8 * s + 8], 0.0, torch.Generator().manual_seed(s))["loss"]
          for s in range(2)]
    params = {k: v.clone() for k, v in run.model.state_dict().items()}
    calls, real = [], run.reward

    def recorded(ids, image_rows, refs, extra=None):
        calls.append({"rows": np.asarray(image_rows).tolist(), "extra": [] if extra is None else np.asarray(extra).tolist()})
        return real(ids, image_rows, refs, extra)

    recorded.uses_judge = real.uses_judge
    run.reward = recorded
    run.at.stage, run.optimizer = "scst", loop.stage_optimizer(cfg, run.model, "scst")
    steps.set_up_negatives(run)
    lab = loop.epoch_batches(run, "scst", 0)[0]
    row = steps.scst_step(run, lab, np.random.default_rng(7), torch.Generator().manual_seed(7 + rank))
    return {"xe": xe, "params": params, "calls": calls, "scst_loss": row["loss"]}


@pytest.mark.slow
def test_xe_is_one_process_and_the_judge_sees_the_global_batch(judge, tmp_path):
    one = _caption_steps(0, 1, judge, str(tmp_path / "one"))
    two = run_ranks(_caption_steps, 2, tmp_path, judge, str(tmp_path / "two"))
    for r in two:  # XE (no dropout, no scheduled sampling in epoch 1): the global batch's token mean
        assert r["xe"] == pytest.approx(one["xe"], rel=1e-5)
        for k, v in one["params"].items():
            torch.testing.assert_close(r["params"][k], v, rtol=0, atol=1e-4, msg=k)
    (single,), parts = one["calls"], [r["calls"][0] for r in two]
    everything = set(single["rows"]) | set(single["extra"])
    assert len(single["extra"]) == 5  # the distractors
    assert sorted(parts[0]["rows"] + parts[1]["rows"]) == sorted(single["rows"])  # each its share, no overlap
    for p in parts:  # every process's captions are ranked against the same candidates as one process's
        assert set(p["rows"]) | set(p["extra"]) == everything and len(p["rows"]) + len(p["extra"]) == len(everything)
    assert two[0]["scst_loss"] == two[1]["scst_loss"]  # the global (all-reduced) value on every process


@pytest.mark.slow
def test_ltd_caption_train_nproc_2_end_to_end(judge, tmp_path):
    from test_distributed import _finish, _launch

    args = ["caption", "train", "--config", "caption_synthetic_sr_pl", "--out", str(tmp_path / "run"), "--no-progress",
            "--nproc", "2"]
    for s in _sr_pl(judge):
        args += ["--set", s]
    code, out = _finish(_launch(args))
    assert code == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["run_dir"] == str(tmp_path / "run") and summary["best_val_cider"] >= 0
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))  # one writer
    assert {r["stage"] for r in steps} == {"xe", "scst"} and all("r_ret" in r for r in steps if r["stage"] == "scst")
    assert [r["epoch"] for r in rows if r["type"] == "val"] == [0, 1, 1]
