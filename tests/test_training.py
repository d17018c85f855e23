"""Training: config validation, end-to-end runs through `ltd train`, resume determinism, checkpoints."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from conftest import TINY, tiny_config
from training.config import ConfigError, load_config


def _rows(run, kind="step"):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if json.loads(ln)["type"] == kind]


@pytest.mark.parametrize("override, message", [
    ("loss.eta=0", "loss.eta=0.0 must be > 0"),
    ("loss.eta=-1", "must be > 0"),
    ("train.batch_size=1", "train.batch_size=1 must be >= 2"),
    ("loss.mode=dual_loss", "loss.mode='dual_loss' is not valid; choose one of: none, dual, constraint"),
    ("loss.contrastive=hinge", "choose one of: infonce, triplet, ifm"),
    ("loss.etaa=0.2", "unknown config key 'loss.etaa'; valid keys here: contrastive"),
    ("train.epochs=two", "train.epochs: expected an integer"),
    ("data.shortcuts=bits:40", "data.shortcuts='bits:40' is not valid"),
    ("nonsense", "--set expects key=value"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config("synthetic_baseline", [override])


def test_config_yaml_roundtrip_and_presets(tmp_path):
    from training.config import config_from_dict, dump_config, list_presets

    assert {"synthetic_baseline", "flickr8k_baseline", "flickr8k_dual", "flickr8k_ltd"} <= set(list_presets())
    for name in list_presets():
        load_config(name)  # every shipped preset validates
    cfg = load_config("flickr8k_ltd", ["loss.eta=0.15", "train.seed=3"])
    assert cfg.loss.mode == "constraint" and cfg.loss.eta == 0.15 and cfg.train.seed == 3
    dump_config(cfg, tmp_path / "c.yaml")
    assert config_from_dict(yaml.safe_load((tmp_path / "c.yaml").read_text())) == cfg
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_missing_val_split_fails_at_start(tmp_path):
    from app.pipeline import train_run
    from conftest import write_karpathy

    p = write_karpathy(tmp_path, 6, splits=["train"] * 6)
    cfg = tiny_config(extra=[f"data.path={p}"])
    with pytest.raises(ConfigError, match="split 'val' .* is empty"):
        train_run(cfg, tmp_path / "run", show_progress=False)


@pytest.mark.slow
def test_two_epoch_run_through_main_beats_epoch0(tmp_path, capsys):
    from app.cli import main

    run = tmp_path / "run"
    args = ["train", "--config", "synthetic_baseline", "--out", str(run), "--no-progress"]
    for s in TINY + ["loss.mode=constraint", "loss.eta=0.5"]:
        args += ["--set", s]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    val = _rows(run, "val")
    assert [v["epoch"] for v in val] == [0, 1, 2]
    assert max(v["rsum"] for v in val[1:]) > val[0]["rsum"]
    assert summary["best_val_rsum"] == pytest.approx(max(v["rsum"] for v in val[1:]), abs=0.01)
    steps = _rows(run)
    assert all({"loss", "l_con", "l_rec", "lambda", "gap", "lr", "grad_norm"} <= set(r) for r in steps)
    assert all(0.0 <= r["lambda"] <= 100.0 for r in steps)
    for f in ("checkpoint.pt", "best.pt", "metrics.jsonl", "config.yaml"):
        assert (run / f).is_file()
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)  # plain types only: no allowlist needed
    assert {"model", "optimizer", "scheduler", "constraint", "epoch", "step", "config", "vocab", "versions",
            "rng"} <= set(ckpt)
    assert not any(k.startswith("image.backbone.") for k in ckpt["model"])  # frozen packaged backbone not stored
    # a second `ltd train` into the same folder refuses instead of overwriting
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    # plots
    assert main(["plot", str(run)]) == 0 and (run / "curves.png").stat().st_size > 10_000


class Killed(Exception):
    pass


def train_until_killed(monkeypatch, cfg, run_dir, when):
    """Run ``cfg`` and stop it (as a kill would) right after the checkpoint for which ``when(payload)``."""
    from app.pipeline import train_run
    from training import loop

    real_save = loop.save_checkpoint

    def save_then_die(path, payload):
        real_save(path, payload)
        if path.name == "checkpoint.pt" and when(payload):
            raise Killed

    monkeypatch.setattr(loop, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        train_run(cfg, run_dir, show_progress=False)
    monkeypatch.setattr(loop, "save_checkpoint", real_save)


@pytest.mark.slow
def test_resume_gives_identical_next_step_losses(tmp_path, monkeypatch):
    from app.pipeline import train_run

    extra = ["model.token_dropout=0.2", "model.crops=2", "model.feature_dropout=0.3",
             "train.epochs=3"]  # random choices inside steps
    full = train_run(tiny_config("constraint", extra), tmp_path / "full", show_progress=False)
    train_until_killed(monkeypatch, tiny_config("constraint", extra), tmp_path / "part", lambda p: p["epoch"] == 1)
    assert max(r["step"] for r in _rows(tmp_path / "part")) < max(r["step"] for r in _rows(full.run_dir))
    train_run(tiny_config("constraint", extra), tmp_path / "part", resume=True, show_progress=False)
    a, b = _rows(full.run_dir), _rows(tmp_path / "part")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for k in ("loss", "l_con", "l_rec", "lambda"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-6), (ra["step"], k)
    assert [v["rsum"] for v in _rows(full.run_dir, "val")] == pytest.approx([v["rsum"] for v in _rows(tmp_path / "part", "val")])


@pytest.mark.slow
def test_mid_epoch_checkpoint_resume(tmp_path, monkeypatch):
    """A run killed mid-epoch resumes from its last step checkpoint and replays the same steps."""
    from app.pipeline import train_run
    from training.checkpoint import load_checkpoint

    extra = ["train.checkpoint_every=2", "train.epochs=1"]
    full = train_run(tiny_config("none", extra), tmp_path / "full", show_progress=False)
    steps = _rows(full.run_dir)
    assert len(steps) >= 4
    train_until_killed(monkeypatch, tiny_config("none", extra), tmp_path / "mid", lambda p: p["step_in_epoch"] == 2)
    assert load_checkpoint(tmp_path / "mid" / "checkpoint.pt")["step_in_epoch"] == 2
    train_run(tiny_config("none", extra), tmp_path / "mid", resume=True, show_progress=False)
    assert [r["step"] for r in _rows(tmp_path / "mid")] == [r["step"] for r in steps]
    assert [r["loss"] for r in _rows(tmp_path / "mid")] == pytest.approx([r["loss"] for r in steps], rel=1e-5)


def test_constraint_and_dual_wiring_in_model(tmp_path):
    """The loop's combination uses the combiner: dual = L_con + β·L_rec on a real batch."""
    from training.losses import LossCombiner

    comb = LossCombiner("dual", beta=0.7)
    out = comb(torch.tensor(2.0), torch.tensor(0.5))
    assert float(out["loss"]) == pytest.approx(2.0 + 0.7 * 0.5)


def test_itd_and_triplet_and_ifm_runs(tmp_path):
    from app.pipeline import train_run

    for extra in (["loss.mode=dual", "loss.decoder=itd", "train.epochs=1"],
                  ["loss.contrastive=triplet", "model.batchnorm=true", "train.epochs=1"],
                  ["loss.contrastive=ifm", "train.epochs=1"],
                  ["loss.contrastive=sh_mh", "loss.curriculum_patience=1", "train.epochs=2"]):
        res = train_run(tiny_config("none", extra), tmp_path / "_".join(extra[0].split(".")), show_progress=False)
        rows = _rows(res.run_dir)
        assert np.isfinite([r["loss"] for r in rows]).all()
        if "loss.decoder=itd" in extra:
            assert all("l_rec" in r for r in rows)


def test_model_rebuilds_from_checkpoint_without_glove(tmp_path, monkeypatch):
    from app.pipeline import train_run
    from training.checkpoint import model_from_checkpoint
    from training.models import glove

    res = train_run(tiny_config("constraint", ["train.epochs=1"]), tmp_path / "r", show_progress=False)
    monkeypatch.setattr(glove, "_packaged_index", lambda: (_ for _ in ()).throw(AssertionError("GloVe read")))
    model, vocab, cfg = model_from_checkpoint(res.run_dir / "best.pt")
    emb = model.embed_texts(["a red circle", "a blue square"])
    assert emb.shape == (2, cfg.model.embed_dim)
    assert torch.allclose(emb.norm(dim=1), torch.ones(2), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [0, 1])
def test_sbert_caption_encoder_frozen_and_partial(tmp_path, layers):
    """The sentence-transformers caption encoder: frozen (embeddings cached, not saved in the
    checkpoint) or with its top layer fine-tuned (saved), with FNE image features and linear heads."""
    from app.pipeline import train_run
    from training.checkpoint import model_from_checkpoint

    extra = ["model.text_encoder=sbert", f"model.sbert_train_layers={layers}", "model.image_features=fne",
             "model.image_head=linear", "train.epochs=1"]
    res = train_run(tiny_config("none", extra), tmp_path / "r", show_progress=False)
    ck = torch.load(res.run_dir / "best.pt", weights_only=True)
    assert ("text.st." in ck["excluded_prefixes"]) == (layers == 0)
    assert any(k.startswith("text.st.") for k in ck["model"]) == (layers > 0)
    assert "image.fne.mean" in ck["model"]  # FNE standardisation statistics travel with the model
    model, _, cfg = model_from_checkpoint(res.run_dir / "best.pt")
    e = model.embed_texts(["a red circle", "a red circle", "a blue square"])
    assert torch.allclose(e[0], e[1], atol=1e-5) and e.shape == (3, cfg.model.embed_dim)
    trainable = [n for n, p in model.text.st.named_parameters() if p.requires_grad]
    assert (len(trainable) > 0) == (layers > 0)
