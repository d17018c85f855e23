"""The captioner's training loop (training/captioning/loop.py) against a simple reference, and resumed
after a real kill.

The reference is the loop's documented contract written out plainly: the model seeded by
``train.seed``; epoch e of stage k shuffles with a generator seeded by (seed, k, e); XE draws the
epoch's captions from (seed, 0, e, 1) and sets lr = lr · decay^(e // every); step s seeds its torch
generator and the global one (dropout) with a draw of (seed, k, e, s); SCST samples one caption per
image against the greedy caption's reward; every step clamps the gradients and takes one Adam step
(a fresh Adam for SCST). Losses and weights must match the loop bit for bit.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from training.captioning.config import load_caption_config
from training.captioning.data import FEAT_CHANNELS, prepare_captioning, regions
from training.captioning.decoding import sample
from training.captioning.inference import decode_regions, specials
from training.captioning.loop import train_captioner
from training.captioning.model import build_captioner
from training.captioning.scst import RewardSpec, SelfRetrievalReward, scst_loss
from training.captioning.xe import epoch_captions, feedback_probability, xe_loss

ROOT = Path(__file__).resolve().parents[1]
PRESET = "caption_synthetic_scst_cider"
TINY = ["data.synthetic_images=60", "data.image_size=64", "data.min_word_count=2", "model.word_dim=32",
        "model.hidden=32", "model.att_dim=32", "xe.batch_size=8", "scst.batch_size=8", "train.log_every=1",
        "xe.epochs=2", "scst.epochs=1", "xe.ss_every=1", "xe.ss_step=0.2", "xe.lr_decay_every=1"]


@pytest.fixture(scope="module")
def data():
    return prepare_captioning(load_caption_config(PRESET, TINY))


def _seeded(*key) -> tuple[int, torch.Generator]:
    seed = int(np.random.default_rng(list(key)).integers(2**62))
    torch.manual_seed(seed)
    return seed, torch.Generator().manual_seed(seed)


def _step(model, opt, loss, clip) -> float:
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.grad.clamp_(-clip, clip)
    opt.step()
    return round(float(loss.detach()), 6)  # as metrics.jsonl writes it


def reference(cfg, d) -> tuple[list[float], dict]:
    """Per-step losses and final weights of XE epochs then SCST epochs, written out plainly."""
    v, seed, xe, sc = d.vocab, cfg.train.seed, cfg.xe, cfg.scst
    torch.manual_seed(seed)
    model = build_captioner(len(v), FEAT_CHANNELS, cfg.model, v.pad_id, v.bos_id)
    losses, opt = [], torch.optim.Adam(model.parameters(), lr=xe.lr)
    for e in range(xe.epochs):
        order = np.random.default_rng([seed, 0, e]).permutation(d.labelled_images)
        caps = epoch_captions(d.train.image_to_captions, order, xe.captions_per_image,
                              np.random.default_rng([seed, 0, e, 1]))
        opt.param_groups[0]["lr"] = xe.lr * xe.lr_decay ** (e // xe.lr_decay_every)
        for s, i in enumerate(range(0, len(order), xe.batch_size)):
            _, gen = _seeded(seed, 0, e, s)
            model.train()
            targets = d.targets[caps[i : i + xe.batch_size].reshape(-1)]
            loss = xe_loss(model, regions(d.grid, d.train_rows[order[i : i + xe.batch_size]]), targets,
                           xe.captions_per_image, feedback_probability(e, xe.ss_every, xe.ss_step, xe.ss_max), gen)
            losses.append(_step(model, opt, loss, xe.grad_clip))
    reward = SelfRetrievalReward(d.train_cider, None, eos_id=v.eos_id, spec=RewardSpec(cider_eos=sc.cider_eos))
    opt = torch.optim.Adam(model.parameters(), lr=sc.lr)
    for e in range(sc.epochs):
        order = np.random.default_rng([seed, 1, e]).permutation(len(d.labelled_images))
        batches = [b for b in (order[i : i + sc.batch_size] for i in range(0, len(order), sc.batch_size)) if len(b) > 1]
        for s, lab in enumerate(batches):
            _, gen = _seeded(seed, 1, e, s)
            model.train()
            rows = d.train_rows[d.labelled_images[lab]]
            reg = regions(d.grid, rows)
            greedy = decode_regions(model, reg, v)
            model.train()
            ctx = model.encode(reg)
            ids, lp, mask = sample(lambda w, st, ctx=ctx: model.step(w, ctx, st), model.init_state(len(lab)), len(lab),
                                   v.max_len, specials(v), temperature=sc.temperature, generator=gen)
            r = reward(torch.cat([ids, greedy]), rows, lab.astype(np.int64)).total
            losses.append(_step(model, opt, scst_loss(lp, mask, r[: len(lab)], r[len(lab):]), sc.grad_clip))
    return losses, model.state_dict()


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
@pytest.mark.training
def test_xe_then_scst_is_the_simple_reference(data, tmp_path):
    cfg = load_caption_config(PRESET, TINY)
    res = train_captioner(cfg, tmp_path / "run", data=data)
    losses, weights = reference(cfg, data)
    steps = [r for r in _rows(res.run_dir) if r["type"] == "step"]
    assert [r["stage"] for r in steps] == ["xe"] * 12 + ["scst"] * 6 and [r["step"] for r in steps] == list(range(1, 19))
    assert [r["loss"] for r in steps] == losses
    assert [r["ss_prob"] for r in steps[:12]] == [0.0] * 6 + [0.2] * 6
    _same_tensors(torch.load(res.run_dir / "checkpoint.pt", weights_only=True)["model"], weights)


KILLED = textwrap.dedent('''
    import json, os, signal, sys
    from pathlib import Path
    import torch
    from training.captioning import checkpoint as ck
    from training.captioning.config import load_caption_config
    from training.captioning.loop import train_captioner

    run, stage, preset, sets = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    torch.set_num_threads(int(sys.argv[5]))  # the parent's: a float sum over other threads differs in its last bits
    real = ck.save_caption_checkpoint

    def save_then_die(path, payload):
        real(path, payload)
        if Path(path).name == "checkpoint.pt" and payload["stage"] == stage and payload["step_in_epoch"] > 0:
            os.kill(os.getpid(), signal.SIGKILL)

    ck.save_caption_checkpoint = save_then_die
    train_captioner(load_caption_config(preset, sets), run)
''')


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.parametrize("stage", ["xe", "scst"])
def test_a_run_killed_mid_epoch_resumes_as_if_never_stopped(data, tmp_path, stage):
    """SIGKILL right after a mid-epoch checkpoint (XE, then SCST): the resumed run logs the same rows
    and ends on the same weights and optimiser state as a run that never stopped."""
    sets = TINY + ["xe.epochs=1", "train.checkpoint_every=2"]
    full = train_captioner(load_caption_config(PRESET, sets), tmp_path / "full", data=data)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "part"), stage, PRESET, json.dumps(sets),
                           str(torch.get_num_threads())], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ck = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    assert (ck["stage"], ck["epoch"], ck["step_in_epoch"]) == (stage, 0, 2)
    train_captioner(load_caption_config(PRESET, sets), tmp_path / "part", resume=True, data=data)
    assert _rows(tmp_path / "part") == _rows(full.run_dir)
    for name in ("checkpoint.pt", "best.pt"):
        a, b = (torch.load(p / name, weights_only=True) for p in (full.run_dir, tmp_path / "part"))
        _same_tensors(a["model"], b["model"])
    a, b = (torch.load(p / "checkpoint.pt", weights_only=True)["optimizer"]["state"] for p in (full.run_dir, tmp_path / "part"))
    for k in a:
        _same_tensors(a[k], b[k])
