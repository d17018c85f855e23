"""End to end on the tiny synthetic scenes: `ltd caption train` (XE → SCST with self-retrieval),
resume, eval (report.json + report.md), generate (JSON lines), presets, config errors, plots."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config

TINY_CAP = ["data.synthetic_images=60", "data.image_size=64", "data.min_word_count=2", "model.word_dim=32",
            "model.hidden=32", "model.att_dim=32", "xe.epochs=2", "scst.epochs=2", "xe.batch_size=8",
            "scst.batch_size=8", "train.log_every=1"]


def _sets(extra=()):
    out = []
    for s in TINY_CAP + list(extra):
        out += ["--set", s]
    return out


def _rows(run, kind="step"):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """A tiny retrieval model: the frozen self-retrieval judge."""
    from app.pipeline import train_run

    res = train_run(tiny_config("none"), tmp_path_factory.mktemp("judge") / "run")
    return res.run_dir / "best.pt"


@pytest.fixture(scope="module")
def sr_run(judge, tmp_path_factory):
    from app.cli import main

    run = tmp_path_factory.mktemp("cap") / "sr"
    assert main(["caption", "train", "--config", "caption_synthetic_sr_fl", "--retrieval", str(judge), "--out", str(run),
                 "--no-progress", *_sets()]) == 0
    return run


@pytest.mark.slow
def test_train_logs_reward_terms_and_writes_safe_checkpoints(sr_run):
    steps = _rows(sr_run)
    xe, scst = [r for r in steps if r["stage"] == "xe"], [r for r in steps if r["stage"] == "scst"]
    assert xe and scst and all("ss_prob" in r and "loss" in r for r in xe)
    assert all({"cider", "r_ret", "reward", "baseline", "cider_greedy", "r_ret_greedy"} <= set(r) for r in scst)
    assert all(r["r_ret"] <= 0 for r in scst)  # r_ret = −L_ret with a hinge loss
    val = _rows(sr_run, "val")
    assert [v["epoch"] for v in val] == [0, 1, 2, 1, 2] and all("self_R@1" in v and "cider" in v for v in val)
    for name in ("checkpoint.pt", "best.pt"):
        ck = torch.load(sr_run / name, weights_only=True)  # plain types only
        assert ck["kind"] == "ltd-captioner" and ck["judge"]["sha256"]
    assert torch.load(sr_run / "checkpoint.pt", weights_only=True)["stage"] == "scst"


@pytest.mark.slow
def test_eval_writes_a_report_with_every_metric(sr_run, judge, tmp_path, capsys):
    from app.cli import main

    out = tmp_path / "eval"
    assert main(["caption", "eval", "--checkpoint", str(sr_run / "best.pt"), "--retrieval", str(judge), "--beam", "3",
                 "--out", str(out), "--no-meteor", "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    for k in ("BLEU-1", "BLEU-4", "ROUGE-L", "CIDEr-D", "self_R@1", "self_R@5", "self_R@10", "unique_%", "novel_%"):
        assert k in report, k
    assert "METEOR" not in report and report["meta"]["meteor"] == "skipped"
    assert "SPICE is not computed" in report["meta"]["spice"]
    assert report["n_images"] == 6 and "Self-retrieval" in (out / "report.md").read_text()
    caps = json.loads((out / "captions.json").read_text())
    assert len(caps) == 6 and all(len(c["references"]) == 5 for c in caps)

    # --judge: the same captions under further judges; the same judge again gives the same numbers
    out2 = tmp_path / "eval2"
    assert main(["caption", "eval", "--checkpoint", str(sr_run / "best.pt"), "--retrieval", str(judge), "--beam", "3",
                 "--judge", f"again={judge}", "--out", str(out2), "--no-meteor", "--no-progress"]) == 0
    rep2 = json.loads((out2 / "report.json").read_text())
    again = rep2["judges"]["again"]
    assert {k: again[k] for k in ("self_R@1", "self_R@5", "self_R@10", "self_medr")} == \
        {k: rep2[k] for k in ("self_R@1", "self_R@5", "self_R@10", "self_medr")}
    assert rep2["CIDEr-D"] == report["CIDEr-D"] and "| again |" in (out2 / "report.md").read_text()
    capsys.readouterr()
    for bad, msg in ((f"x y={judge}", "expected NAME=CHECKPOINT"), (f"a={tmp_path / 'nope.pt'}", "does not exist")):
        assert main(["caption", "eval", "--checkpoint", str(sr_run / "best.pt"), "--judge", bad, "--no-progress"]) == 2
        assert msg in capsys.readouterr().err


@pytest.mark.slow
def test_generate_writes_json_lines_for_a_split_and_a_folder(sr_run, tmp_path, capsys):
    from PIL import Image

    from app.cli import main

    out = tmp_path / "val.jsonl"
    assert main(["caption", "generate", "--checkpoint", str(sr_run / "best.pt"), "--split", "val", "--beam", "2",
                 "--out", str(out), "--no-progress", "--dataset", ""]) == 0
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(lines) == 6 and all({"image_id", "filename", "caption"} <= set(r) for r in lines)
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.new("RGB", (80, 60), (200, 30, 30)).save(folder / "red.png")
    (folder / "broken.jpg").write_bytes(b"not an image")
    (folder / "notes.txt").write_text("ignored")
    capsys.readouterr()
    assert main(["caption", "generate", "--checkpoint", str(sr_run / "best.pt"), "--images", str(folder),
                 "--no-progress"]) == 0
    rows = {r["file"]: r for r in map(json.loads, capsys.readouterr().out.strip().splitlines())}
    assert set(rows) == {"red.png", "broken.jpg"} and "caption" in rows["red.png"] and "error" in rows["broken.jpg"]


@pytest.mark.slow
@pytest.mark.parametrize("baseline", [[], ["scst.samples=3", "scst.baseline=mean", "scst.distractors=5"]],
                         ids=["greedy", "mean_of_3"])
def test_resume_gives_the_same_next_steps(judge, tmp_path, monkeypatch, baseline):
    """SR-PL run killed after its first SCST epoch, resumed: the same steps and rewards as a run that
    never stopped (negatives, samples and dropout are seeded per step), with the paper's greedy
    baseline and with 3 samples per image, the mean of the others as the baseline and 5 distractors."""
    from training.captioning import checkpoint as ck
    from training.captioning.config import load_caption_config
    from training.captioning.loop import train_captioner

    cfg = lambda: load_caption_config("caption_synthetic_sr_pl", TINY_CAP + [  # noqa: E731
        f"train.retrieval={judge}", "scst.h_min=1", "scst.h_max=5", *baseline])
    full = train_captioner(cfg(), tmp_path / "full")
    real = ck.save_caption_checkpoint

    class Killed(Exception):
        pass

    def save_then_die(path, payload):
        real(path, payload)
        if path.name == "checkpoint.pt" and payload["stage"] == "scst" and payload["epoch"] == 1:
            raise Killed

    monkeypatch.setattr(ck, "save_caption_checkpoint", save_then_die)
    with pytest.raises(Killed):
        train_captioner(cfg(), tmp_path / "part")
    monkeypatch.setattr(ck, "save_caption_checkpoint", real)
    train_captioner(cfg(), tmp_path / "part", resume=True)
    a, b = _rows(full.run_dir), _rows(tmp_path / "part")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for k in ("loss", "cider", "r_ret", "reward", "baseline"):
            if k in ra:
                assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-6), (ra["step"], k)


@pytest.mark.slow
@pytest.mark.parametrize("negatives", ["moderate", "none"])
def test_unlabelled_images_enter_scst_only_in_sr_pl(judge, tmp_path, monkeypatch, negatives):
    """Half the captions hidden: SR-PL puts unlabelled images in the SCST batches; with
    scst.negatives=none (the labelled-half controls) neither a batch nor a distractor is ever unlabelled."""
    import numpy as np

    from training.captioning import steps
    from training.captioning.config import load_caption_config
    from training.captioning.data import prepare_captioning
    from training.captioning.loop import train_captioner

    seen, distractors, real_regions, real_distractors = [], [], steps.regions, steps.distractors

    def spy_regions(grid, rows):
        seen.append(np.asarray(rows).copy())
        return real_regions(grid, rows)

    def spy_distractors(r, rows, rng):
        out = real_distractors(r, rows, rng)
        distractors.append(out)
        return out

    monkeypatch.setattr(steps, "regions", spy_regions)  # the training steps' images
    monkeypatch.setattr(steps, "distractors", spy_distractors)
    cfg = load_caption_config("caption_synthetic_sr_pl", TINY_CAP + [
        f"train.retrieval={judge}", "scst.h_min=1", "scst.h_max=5", "xe.epochs=1", "scst.epochs=1",
        "scst.distractors=5", f"scst.negatives={negatives}"])
    d = prepare_captioning(cfg)
    train_captioner(cfg, tmp_path / "run", data=d)
    unlabelled = set(d.train_rows[~d.labelled].tolist())
    assert 0 < len(unlabelled) < len(d.train_rows)
    used = set(np.concatenate(seen).tolist())
    assert distractors and all(x is not None and len(x) == 5 for x in distractors)
    used_d = set(np.concatenate(distractors).tolist())
    if negatives == "none":
        assert not used & unlabelled and not used_d & unlabelled
    else:
        assert used & unlabelled and used_d & unlabelled


@pytest.mark.slow
def test_xe_only_run_of_an_sr_pl_preset_needs_no_judge(tmp_path):
    """The SR-PL presets' XE stage alone (scst.epochs=0) trains on the labelled half without a judge:
    the checkpoint every labelled-half SCST run then starts from."""
    from training.captioning.config import load_caption_config
    from training.captioning.loop import train_captioner

    cfg = load_caption_config("caption_synthetic_sr_pl", TINY_CAP + ["scst.epochs=0", "xe.epochs=1"])
    assert not cfg.needs_judge
    res = train_captioner(cfg, tmp_path / "xe")
    ck = torch.load(res.run_dir / "best.pt", weights_only=True)
    assert ck["stage"] == "xe" and 0 < len(ck["labelled"]) < 60


@pytest.mark.slow
def test_xe_stops_early_on_val_and_scst_starts_from_the_best_xe_epoch(tmp_path, monkeypatch):
    """xe.patience 2 with a scripted val CIDEr-D (best at XE epoch 2, then two epochs without a gain):
    XE ends after epoch 4 of at most 10, and SCST's first step starts from XE epoch 2's weights."""
    from training.captioning import loop
    from training.captioning.config import load_caption_config

    scripted = iter([0.0, 5.0, 7.0, 6.0, 6.5, 1.0])  # before training, XE epochs 1-4, SCST epoch 1
    monkeypatch.setattr(loop, "run_validation", lambda r, epoch: {"cider": next(scripted)})
    start, real_step = {}, loop.scst_step

    def spy_step(r, *a):
        start.setdefault("weights", {k: v.clone() for k, v in r.model.state_dict().items()})
        return real_step(r, *a)

    monkeypatch.setattr(loop, "scst_step", spy_step)
    cfg = load_caption_config("caption_synthetic_scst_cider", TINY_CAP + ["xe.epochs=10", "xe.patience=2", "scst.epochs=1"])
    run = loop.train_captioner(cfg, tmp_path / "run").run_dir
    assert sorted({r["epoch"] for r in _rows(run) if r["stage"] == "xe"}) == [1, 2, 3, 4]
    stop = _rows(run, "early_stop")
    assert [(r["epoch"], r["best_epoch"]) for r in stop] == [(4, 2)]
    best = torch.load(run / "best.pt", weights_only=True)
    assert best["stage"] == "xe" and best["epoch"] == 2
    assert all(torch.equal(start["weights"][k], best["model"][k]) for k in best["model"])
    assert torch.load(run / "checkpoint.pt", weights_only=True)["stage"] == "scst"


def test_config_errors_and_presets(tmp_path):
    from training.captioning.config import load_caption_config
    from training.config import ConfigError, list_presets

    names = list_presets("caption")
    assert {"caption_synthetic_xe", "caption_synthetic_scst_cider", "caption_synthetic_sr_fl", "caption_synthetic_sr_pl",
            "caption_flickr8k_xe", "caption_flickr8k_scst_cider", "caption_flickr8k_sr_fl",
            "caption_flickr8k_sr_pl"} <= set(names)
    assert not set(names) & set(list_presets())  # retrieval presets and caption presets stay apart
    fake = tmp_path / "judge.pt"
    fake.write_bytes(b"x")
    for name in names:
        load_caption_config(name, [f"train.retrieval={fake}"])
    with pytest.raises(ConfigError, match="need a frozen retrieval checkpoint"):
        load_caption_config("caption_synthetic_sr_fl")
    with pytest.raises(ConfigError, match="scst.retrieval_loss='hinge' is not valid"):
        load_caption_config("caption_synthetic_xe", ["scst.retrieval_loss=hinge"])
    with pytest.raises(ConfigError, match="unknown config key 'xe.epoch'"):
        load_caption_config("caption_synthetic_xe", ["xe.epoch=3"])
    with pytest.raises(ConfigError, match="mean needs scst.samples >= 2"):
        load_caption_config("caption_synthetic_xe", ["scst.baseline=mean"])
    with pytest.raises(ConfigError, match="scst.baseline='max' is not valid"):
        load_caption_config("caption_synthetic_xe", ["scst.baseline=max", "scst.samples=2"])
    with pytest.raises(ConfigError, match="scst.negatives=none keeps them out"):
        load_caption_config("caption_synthetic_sr_pl", [f"train.retrieval={fake}", "scst.alpha=0"])
    # CIDEr-only on the labelled half: no judge, the unlabelled images unused
    half = load_caption_config("caption_synthetic_sr_pl", ["scst.alpha=0", "scst.negatives=none"])
    assert not half.needs_judge and not half.uses_unlabelled and half.data.labelled_fraction < 1
    with pytest.raises(ConfigError, match="h_min"):
        load_caption_config("caption_synthetic_xe", ["scst.h_min=50", "scst.h_max=10"])


def test_cli_validates_inputs_before_loading_models(tmp_path, capsys):
    from app.cli import main

    assert main(["caption", "eval", "--checkpoint", str(tmp_path / "none.pt")]) == 2
    assert "caption checkpoint not found" in capsys.readouterr().err
    (tmp_path / "c.pt").write_bytes(b"x")
    assert main(["caption", "generate", "--checkpoint", str(tmp_path / "c.pt"), "--images", str(tmp_path / "nope")]) == 2
    assert "--images: folder not found" in capsys.readouterr().err
    assert main(["caption", "generate", "--checkpoint", str(tmp_path / "c.pt"), "--images", str(tmp_path)]) == 2
    assert "no image files" in capsys.readouterr().err
    assert main(["caption", "eval", "--checkpoint", str(tmp_path / "c.pt"), "--beam", "0"]) == 2
    assert "--beam must be" in capsys.readouterr().err
    assert main(["caption", "train", "--retrieval", str(tmp_path / "missing.pt")]) == 2
    assert "retrieval checkpoint not found" in capsys.readouterr().err


@pytest.mark.slow
def test_plot_draws_caption_curves(sr_run, tmp_path):
    from app.cli import main

    assert main(["plot", str(sr_run), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 1000
