"""``train.init_from``: a run that starts from another run's weights (fine-tuning a pretrained model)."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config


def _val_rows(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"val"' in ln]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    from app.pipeline import train_run

    run = tmp_path_factory.mktemp("init_from") / "ltd"
    train_run(tiny_config("constraint"), run)  # with a decoder: a later baseline drops it
    return run


@pytest.mark.slow
@pytest.mark.training
def test_fine_tuning_starts_where_the_source_ended(pretrained, tmp_path):
    from app.pipeline import train_run
    from training.checkpoint import load_checkpoint

    src = load_checkpoint(pretrained / "best.pt")
    cfg = tiny_config(extra=[f"train.init_from={pretrained / 'best.pt'}", "train.epochs=1"])
    train_run(cfg, tmp_path / "ft")
    start = _val_rows(tmp_path / "ft")[0]
    assert start["epoch"] == 0 and start["rsum"] == pytest.approx(src["best"]["rsum"], abs=1e-6)
    scratch = tiny_config(extra=["train.epochs=1"])
    train_run(scratch, tmp_path / "scratch")
    assert _val_rows(tmp_path / "scratch")[0]["rsum"] != pytest.approx(start["rsum"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.training
def test_a_source_that_does_not_fit_is_refused(pretrained, tmp_path):
    from training.checkpoint import CheckpointError, init_from_checkpoint
    from training.data.vocab import Vocab
    from training.models.dual_encoder import build_model

    cfg = tiny_config(extra=["model.embed_dim=32"])
    vocab = Vocab.from_dict(torch.load(pretrained / "best.pt", weights_only=True)["vocab"])
    model = build_model(cfg, vocab)
    with pytest.raises(CheckpointError, match=r"do not fit this model \(\d+ tensors, e.g. .* vs "):
        init_from_checkpoint(model, pretrained / "best.pt")


@pytest.mark.slow
@pytest.mark.training
def test_a_new_decoder_keeps_its_initialisation(pretrained, tmp_path):
    from training.checkpoint import init_from_checkpoint, load_checkpoint, model_from_checkpoint

    model, _, _ = model_from_checkpoint(pretrained / "best.pt")
    before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("decoder.")}
    state = load_checkpoint(pretrained / "best.pt")["model"]
    bl = {k: v for k, v in state.items() if not k.startswith("decoder.")}
    path = tmp_path / "bl.pt"
    torch.save({**load_checkpoint(pretrained / "best.pt"), "model": bl}, path)
    fresh = init_from_checkpoint(model, path)
    assert fresh and all(k.startswith("decoder.") for k in fresh)  # the packaged CNN is not "fresh"
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.slow
@pytest.mark.training
def test_a_grid_can_sweep_fine_tuning_of_its_own_pretrained_cell(tmp_path):
    """A ``first`` cell trains before the sweeps, so that sweeps may start from it (``{out}``, ``{seed}``)."""
    import yaml
    from conftest import TINY

    from app.cli import main

    init = "train.init_from={out}/runs/pretrained/seed{seed}/best.pt"
    grid = {"name": "ft", "base": "synthetic_baseline", "set": TINY + ["train.epochs=1"], "seeds": [0],
            "cells": [{"name": "pretrained", "first": True},
                      {"name": "fine_tuned", "set": [init], "sweep": {"optim.lr": [1e-4, 1e-3]}}]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    assert main(["experiment", "--config", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "exp")]) == 0
    res = json.loads((tmp_path / "exp" / "results.json").read_text())
    assert {r["cell"] for r in res["runs"]} == {"pretrained", "fine_tuned"} and len(res["sweep_runs"]) == 2
    pre = _val_rows(tmp_path / "exp" / "runs" / "pretrained" / "seed0")[-1]["rsum"]
    for run in (tmp_path / "exp" / "runs").glob("fine_tuned@*/seed0"):
        assert _val_rows(run)[0]["rsum"] == pytest.approx(pre, abs=1e-6)  # each sweep run starts from it
    grid["cells"][0]["sweep"] = {"optim.lr": [1e-3]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    from app.grid import load_grid
    from training.config import ConfigError

    with pytest.raises(ConfigError, match="cannot sweep"):
        load_grid(tmp_path / "g.yaml")
