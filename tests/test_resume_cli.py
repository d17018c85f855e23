"""Issue 35, finding 11: `ltd train --resume --out RUN` continues RUN with RUN/config.yaml.

Before: it rebuilt the default preset (and failed on a size mismatch against the checkpoint), and a
run that died before its first checkpoint silently started a different run."""
from __future__ import annotations

import logging
import shutil

import pytest
import torch
from conftest import TINY

from app.cli import main

SETS = [a for s in TINY for a in ("--set", s)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "run"
    assert main(["train", "--out", str(out), "--no-progress", *SETS]) == 0
    return out


@pytest.mark.slow
@pytest.mark.training
def test_resume_reads_the_runs_own_config(run, capsys):
    # the default preset's sizes differ from the run's (embed_dim 64 here): reading it would fail
    assert main(["train", "--resume", "--out", str(run), "--no-progress"]) == 0
    assert main(["train", "--resume", "--out", str(run), "--no-progress", "--set", "model.embed_dim=64"]) == 0


@pytest.mark.slow
@pytest.mark.training
def test_resume_refuses_a_command_line_that_changes_the_run(run, capsys):
    assert main(["train", "--resume", "--out", str(run), "--set", "train.epochs=5"]) == 2
    err = capsys.readouterr().err
    assert "would change train.epochs" in err and "another --out" in err
    assert main(["train", "--resume", "--out", str(run), "--config", "synthetic_ltd"]) == 2
    assert "would change" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.training
def test_a_run_that_died_before_its_first_checkpoint_says_so(run, tmp_path, caplog):
    dead = tmp_path / "dead"
    dead.mkdir()
    shutil.copy(run / "config.yaml", dead / "config.yaml")  # written at start; no checkpoint.pt yet
    with caplog.at_level(logging.WARNING):
        assert main(["train", "--resume", "--out", str(dead), "--no-progress"]) == 0
    assert "stopped before its first checkpoint" in caplog.text
    ckpt = torch.load(dead / "best.pt", weights_only=True, map_location="cpu")
    assert ckpt["config"]["model"]["embed_dim"] == 64  # the run's config, not the default preset's


def test_resume_of_nothing_is_an_error(tmp_path, capsys):
    assert main(["train", "--resume", "--out", str(tmp_path / "none")]) == 2
    assert "holds no run" in capsys.readouterr().err
