"""Training: config validation, end-to-end runs through `ltd train`, resume determinism, checkpoints."""
from __future__ import annotations

import json
import re

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
    ("loss.contrastive=hinge", "choose one of: infonce, triplet, mh, sh, ifm, order, sh_mh"),
    ("loss.etaa=0.2", "unknown config key 'loss.etaa' (did you mean 'eta'?); valid keys here: contrastive"),
    ("train.epochs=two", "train.epochs: expected an integer"),
    ("data.shortcuts=bits:40", "data.shortcuts='bits:40' is not valid"),
    ("nonsense", "--set expects key=value"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
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
    from conftest import write_karpathy

    from app.pipeline import train_run

    p = write_karpathy(tmp_path, 6, splits=["train"] * 6)
    cfg = tiny_config(extra=[f"data.path={p}"])
    with pytest.raises(ConfigError, match="split 'val' .* is empty"):
        train_run(cfg, tmp_path / "run")


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
        train_run(cfg, run_dir)
    monkeypatch.setattr(loop, "save_checkpoint", real_save)


@pytest.mark.slow
def test_resume_gives_identical_next_step_losses(tmp_path, monkeypatch):
    from app.pipeline import train_run

    extra = ["model.token_dropout=0.2", "model.crops=2", "model.feature_dropout=0.3",
             "train.epochs=3"]  # random choices inside steps
    full = train_run(tiny_config("constraint", extra), tmp_path / "full")
    train_until_killed(monkeypatch, tiny_config("constraint", extra), tmp_path / "part", lambda p: p["epoch"] == 1)
    assert max(r["step"] for r in _rows(tmp_path / "part")) < max(r["step"] for r in _rows(full.run_dir))
    train_run(tiny_config("constraint", extra), tmp_path / "part", resume=True)
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
    full = train_run(tiny_config("none", extra), tmp_path / "full")
    steps = _rows(full.run_dir)
    assert len(steps) >= 4
    train_until_killed(monkeypatch, tiny_config("none", extra), tmp_path / "mid", lambda p: p["step_in_epoch"] == 2)
    assert load_checkpoint(tmp_path / "mid" / "checkpoint.pt")["step_in_epoch"] == 2
    train_run(tiny_config("none", extra), tmp_path / "mid", resume=True)
    assert [r["step"] for r in _rows(tmp_path / "mid")] == [r["step"] for r in steps]
    assert [r["loss"] for r in _rows(tmp_path / "mid")] == pytest.approx([r["loss"] for r in steps], rel=1e-5)


def _initial_model_and_first_batch(cfg, data, epoch: int = 0):
    """The model a run starts from (same seed, same builder) and the caption indices of the first
    step of ``epoch``: what a hand computation of that step needs."""
    from training.loop import epoch_batches
    from training.models.dual_encoder import ModelDims, PretrainedParts, build_model

    torch.manual_seed(cfg.train.seed)
    dims = ModelDims(data.feat_dim, target_dim=int(data.targets.shape[1]) if data.targets is not None else 0)
    parts = PretrainedParts(data.word_embeddings, backbone=data.backbone)
    model = build_model(cfg, data.vocab, dims=dims, parts=parts).train()
    return model, epoch_batches(cfg.train.seed, epoch, len(data.train_texts), cfg.train.batch_size)[0]


def _embed(model, data, idx):
    """(image, caption) embeddings of training captions ``idx``, as a step computes them (single view)."""
    ids = torch.as_tensor(data.train_image_index[idx])
    img = model.encode_image_features(data.image_feats[ids].mean(1))
    txt = model.encode_text(model.text.prepare([data.train_texts[i] for i in idx], train=True))
    return img, txt, ids


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.parametrize("mode", ["dual", "constraint"])
def test_constraint_and_dual_wiring_in_model(tmp_path, mode):
    """Real training steps apply the combination: the first step's loss and gradient norm equal a hand
    computation of L_con + β·L_rec (dual) or L_con + λ·(L_rec/η − 1) (constraint) from the initial
    model; every logged step is composed that way; λ follows its ascent on the logged gaps (EMA
    momentum, projection), one step behind, and the trace file holds what was applied."""
    import torch.nn.functional as F

    from training.loop import train
    from training.losses import infonce_loss
    from training.losses.lambda_trace import read_lambda_trace
    from training.prepare import prepare

    beta, eta, lam0, lam_lr = 3.0, 0.5, 2.0, 0.05
    cfg = tiny_config(mode, ["train.epochs=1", f"loss.beta={beta}", f"loss.lambda_init={lam0}",
                             f"loss.lambda_lr={lam_lr}"])
    data = prepare(cfg)
    run = train(cfg, tmp_path / mode, data=data).run_dir
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 4

    # step 1 by hand: contrastive + weighted reconstruction, and the norm of its gradient
    model, idx = _initial_model_and_first_batch(cfg, data)
    img, txt, ids = _embed(model, data, idx)
    l_con = infonce_loss(img, txt, cfg.loss.tau, image_ids=ids)
    l_rec = (1 - F.cosine_similarity(model.decoder(txt), data.targets[idx], dim=-1)).mean()
    loss = l_con + (beta * l_rec if mode == "dual" else lam0 * (l_rec / eta - 1))
    loss.backward()
    gnorm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    first = rows[0]
    assert (first["l_con"], first["l_rec"]) == pytest.approx((float(l_con.detach()), float(l_rec.detach())), abs=2e-6)
    assert first["loss"] == pytest.approx(float(loss.detach()), abs=5e-6)
    assert first["grad_norm"] == pytest.approx(float(gnorm), rel=2e-6)

    if mode == "dual":
        for r in rows:
            assert "lambda" not in r
            assert r["loss"] == pytest.approx(r["l_con"] + beta * r["l_rec"], abs=5e-6), r["step"]
        return
    lam, momentum = lam0, None
    for r in rows:
        assert r["lambda"] == pytest.approx(lam, abs=1e-5), r["step"]
        assert r["gap"] == pytest.approx(r["l_rec"] / eta - 1, abs=5e-6)
        assert r["loss"] == pytest.approx(r["l_con"] + lam * r["gap"], abs=2e-5)
        # SGD(momentum 0.9, dampening 0.9, maximize): the buffer is an EMA of the gap, seeded by the first
        momentum = r["gap"] if momentum is None else 0.9 * momentum + 0.1 * r["gap"]
        lam = min(max(lam + lam_lr * momentum, 0.0), cfg.loss.lambda_max)
    assert len({r["lambda"] for r in rows}) == len(rows)  # it moved at every step
    trace, trace_eta = read_lambda_trace(run)
    assert trace_eta == eta and trace.tolist() == pytest.approx([r["lambda"] for r in rows], abs=1e-6)


def _hinges(img, txt, ids, margin):
    """(sum of hinges, max of hinges) by hand: both directions, summed over the batch; captions of the
    same image are not negatives."""
    s = img @ txt.t()
    pos = s.diagonal()
    neg = (ids[:, None] != ids[None, :]).float()
    c_i2t = (margin + s - pos[:, None]).clamp(min=0) * neg  # image i as query
    c_t2i = (margin + s - pos[None, :]).clamp(min=0) * neg  # caption j as query
    return float(c_i2t.sum() + c_t2i.sum()), float(c_i2t.max(1).values.sum() + c_t2i.max(0).values.sum())


@pytest.mark.slow
@pytest.mark.training
def test_sh_mh_curriculum_switches_after_patience_to_max_of_hinges(tmp_path, monkeypatch):
    """sh_mh trains with the sum of hinges until val rsum has not improved for `curriculum_patience`
    epochs, then with the max of hinges: the switch comes exactly then, is checkpointed, and the loss
    after it is the max of hinges of the model it switched with (the loss before it the sum)."""
    from training import loop
    from training.checkpoint import load_checkpoint, model_from_checkpoint
    from training.prepare import prepare

    cfg = tiny_config("none", ["loss.contrastive=sh_mh", "loss.curriculum_patience=2", "train.epochs=5"])
    data = prepare(cfg)
    rsums = iter([0.0, 10.0, 12.0, 11.0, 11.5, 30.0])  # epochs 0..5: gains at 1 and 2, none at 3 and 4
    real_save = loop.save_checkpoint

    def keep_switch_checkpoint(path, payload):
        real_save(path, payload)
        if path.name == "checkpoint.pt" and payload["epoch"] == 4 and payload["step_in_epoch"] == 0:
            real_save(tmp_path / "after_epoch4.pt", payload)

    monkeypatch.setattr(loop, "save_checkpoint", keep_switch_checkpoint)
    run = loop.train(cfg, tmp_path / "run", data=data, validate=lambda m: {"rsum": next(rsums)}).run_dir
    rows = _rows(run)
    assert {e: {r["contrastive"] for r in rows if r["epoch"] == e} for e in range(1, 6)} == {
        1: {"sh"}, 2: {"sh"}, 3: {"sh"}, 4: {"sh"}, 5: {"mh"}}
    ck = load_checkpoint(tmp_path / "after_epoch4.pt")
    assert (ck["contrastive"], ck["stale_epochs"]) == ("mh", 0)  # a resumed run continues with mh

    margin = cfg.loss.margin
    model, idx = _initial_model_and_first_batch(cfg, data)
    with torch.no_grad():
        sh, mh = _hinges(*_embed(model, data, idx), margin)
    assert rows[0]["l_con"] == pytest.approx(sh, rel=1e-5) and abs(sh - mh) > 1.0
    model, _, _ = model_from_checkpoint(ck)
    _, idx = _initial_model_and_first_batch(cfg, data, epoch=4)
    with torch.no_grad():
        sh, mh = _hinges(*_embed(model, data, idx), margin)
    first_mh = next(r for r in rows if r["epoch"] == 5)
    assert first_mh["l_con"] == pytest.approx(mh, rel=1e-5) and abs(sh - mh) > 1.0


@pytest.mark.slow
@pytest.mark.training
def test_itd_and_triplet_and_ifm_runs(tmp_path):
    from app.pipeline import train_run

    for extra in (["loss.mode=dual", "loss.decoder=itd", "train.epochs=1"],
                  ["loss.contrastive=triplet", "model.batchnorm=true", "train.epochs=1"],
                  ["loss.contrastive=ifm", "train.epochs=1"]):
        res = train_run(tiny_config("none", extra), tmp_path / "_".join(extra[0].split(".")))
        rows = _rows(res.run_dir)
        assert np.isfinite([r["loss"] for r in rows]).all()
        if "loss.decoder=itd" in extra:
            assert all("l_rec" in r for r in rows)


@pytest.mark.slow
@pytest.mark.training
def test_model_rebuilds_from_checkpoint_without_glove(tmp_path, monkeypatch):
    from app.pipeline import train_run
    from training.checkpoint import model_from_checkpoint
    from training.models import glove

    res = train_run(tiny_config("constraint", ["train.epochs=1"]), tmp_path / "r")
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
    res = train_run(tiny_config("none", extra), tmp_path / "r")
    ck = torch.load(res.run_dir / "best.pt", weights_only=True)
    assert ("text.st." in ck["excluded_prefixes"]) == (layers == 0)
    assert any(k.startswith("text.st.") for k in ck["model"]) == (layers > 0)
    assert "image.fne.mean" in ck["model"]  # FNE standardisation statistics travel with the model
    model, _, cfg = model_from_checkpoint(res.run_dir / "best.pt")
    e = model.embed_texts(["a red circle", "a red circle", "a blue square"])
    assert torch.allclose(e[0], e[1], atol=1e-5) and e.shape == (3, cfg.model.embed_dim)
    trainable = [n for n, p in model.text.st.named_parameters() if p.requires_grad]
    assert (len(trainable) > 0) == (layers > 0)


@pytest.mark.slow
@pytest.mark.training
def test_cpu_bf16_autocast_trains_close_to_fp32(tmp_path, monkeypatch):
    """train.cpu_amp=bf16 runs the steps under bf16 autocast (the model's matmuls see it; the losses
    stay float32): same first-step losses as fp32 within bf16 rounding, not bit-identical (so the
    autocast really applied), finite throughout; ``auto`` turns it on only where the CPU has native bf16."""
    from training import loop
    from training.loop import train
    from training.prepare import prepare

    cfg32 = tiny_config("constraint", ["train.epochs=1"])
    data = prepare(cfg32)
    seen = []
    encode = loop.DualEncoder.encode_text
    monkeypatch.setattr(loop.DualEncoder, "encode_text",
                        lambda self, *a, **k: (seen.append(torch.is_autocast_enabled("cpu")), encode(self, *a, **k))[1])
    rows = {}
    for amp in ("fp32", "bf16"):
        seen.clear()
        run = train(tiny_config("constraint", ["train.epochs=1", f"train.cpu_amp={amp}"]), tmp_path / amp,
                    data=data).run_dir
        assert seen and set(seen) == {amp == "bf16"}
        rows[amp] = _rows(run)
    a, b = rows["fp32"][0], rows["bf16"][0]
    assert b["l_con"] == pytest.approx(a["l_con"], rel=2e-2) and b["l_rec"] == pytest.approx(a["l_rec"], rel=2e-2)
    assert (a["l_con"], a["l_rec"]) != (b["l_con"], b["l_rec"])
    assert all(np.isfinite([r["loss"], r["l_con"], r["l_rec"], r["lambda"]]).all() for r in rows["bf16"])

    cfg_auto = tiny_config("constraint", ["train.epochs=1", "train.cpu_amp=auto"])
    for native in (False, True):
        monkeypatch.setattr(loop, "cpu_bf16_fast", lambda native=native: native)
        r = loop.set_up(cfg_auto, data, tmp_path / f"auto{native}")
        assert r.autocast_dtype == (torch.bfloat16 if native else None) and not r.scaler.is_enabled()
    with pytest.raises(ConfigError, match="train.cpu_amp='fp16' is not valid"):
        tiny_config(extra=["train.cpu_amp=fp16"])


@pytest.mark.slow
@pytest.mark.training
def test_train_fraction_keeps_the_captioners_labelled_half():
    """data.train_fraction trains a retrieval model (an SR-PL judge) on exactly the training images
    whose captions a captioner's SR-PL run with the same fraction and seed keeps, and nothing of the
    hidden half reaches its vocabulary or targets."""
    from training.config import ConfigError
    from training.data.karpathy import labelled_mask
    from training.prepare import load_dataset, prepare

    cfg = tiny_config("constraint", ["data.train_fraction=0.5", "train.seed=3"])
    full = load_dataset(cfg).split("train")
    data = prepare(cfg)
    kept = np.flatnonzero(labelled_mask(len(full.images), 0.5, 3))
    assert [im.index for im in data.train.images] == [full.images[i].index for i in kept]
    assert len(data.train_texts) == len(data.targets) == sum(len(full.image_to_captions[i]) for i in kept)
    assert data.train_texts == [c.raw for c, img in zip(full.captions, full.caption_to_image) if img in set(kept)]
    other = prepare(tiny_config("none", ["data.train_fraction=0.5", "data.train_subset_seed=4"]))
    assert {im.index for im in other.train.images} != {im.index for im in data.train.images}
    with pytest.raises(ConfigError, match="data.train_fraction"):
        tiny_config("none", ["data.train_fraction=0"])


def test_cuda_amp_dtype_picks_the_autocast_type(tmp_path, monkeypatch):
    """train.amp_dtype chooses the CUDA autocast type (fp16 with loss scaling, bf16 without), decided in
    one place (``loop.autocast_dtype``); ``train_step`` runs under exactly that type. No GPU here: a CPU
    run given the CUDA decision by hand takes the same branch, so the dtype the model's forward sees is
    the one the option names; anything else is a ConfigError."""
    from training import loop
    from training.prepare import prepare

    data = prepare(tiny_config("constraint"))
    seen = []
    encode = loop.DualEncoder.encode_text
    monkeypatch.setattr(loop.DualEncoder, "encode_text", lambda self, *a, **k: (
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None),
        encode(self, *a, **k))[1])
    batches = loop.epoch_batches(0, 0, len(data.train_texts), 8)
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        cfg = tiny_config("constraint", [f"train.amp_dtype={name}", "train.cpu_amp=fp32"])
        assert loop.autocast_dtype("cuda", cfg.train) == dtype
        assert loop.autocast_dtype("cuda", tiny_config(extra=[f"train.amp_dtype={name}", "train.amp=false"]).train) is None
        r = loop.set_up(cfg, data, tmp_path / name)
        assert r.autocast_dtype is None and not r.scaler.is_enabled()  # AMP is CUDA's only; cpu_amp fp32
        r.autocast_dtype = loop.autocast_dtype("cuda", cfg.train)
        seen.clear()
        out, _ = loop.train_step(r, batches[0], torch.Generator().manual_seed(0), None)
        assert seen == [dtype] and np.isfinite(float(out["loss"].detach()))
    assert loop.autocast_dtype("cpu", tiny_config(extra=["train.cpu_amp=bf16"]).train) == torch.bfloat16
    with pytest.raises(ConfigError, match="train.amp_dtype='fp32' is not valid"):
        tiny_config(extra=["train.amp_dtype=fp32"])
