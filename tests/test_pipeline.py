"""End-to-end: `ltd demo --no-serve` and `ltd experiment` (tiny grid, resume)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import TINY


def _demo_args(tmp_path, *extra):
    """`ltd demo --no-serve` on the tiny scenes; ``extra`` after TINY, so its --set wins."""
    return ["demo", "--out", str(tmp_path / "demo"), "--no-serve", "--no-progress",
            *[a for s in TINY for a in ("--set", s)], *extra]


@pytest.mark.slow
def test_demo_no_serve_prints_table_and_reuses(tmp_path, capsys, monkeypatch):
    """The default demo on the scenes: the small-batch presets (no shortcuts), one test table, the sentence
    with this run's difference and the 3-seed measurement; a re-run retrains nothing."""
    from app.cli import main
    from app.cli.demo import SMALL_BATCH_CLAIM

    monkeypatch.delenv("LTD_DATA_DIR", raising=False)
    args = _demo_args(tmp_path, "--set", "train.batch_size=16")  # TINY sets 32: keep the presets' batch
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("| metric | bl | ltd | Δ (ltd − bl) |") == 1 and "| rsum |" in out
    assert "In one sentence: trained with batches of 16" in out and SMALL_BATCH_CLAIM in out
    assert "shortcut" not in out.lower() and "Queries where the two models disagree most" in out
    root = tmp_path / "demo" / "synthetic"
    for n, mode in (("bl", "none"), ("ltd", "constraint")):
        cfg = yaml.safe_load((root / "runs" / n / "config.yaml").read_text())
        assert (cfg["data"]["shortcuts"], cfg["train"]["batch_size"], cfg["loss"]["mode"]) == ("none", 16, mode)
        assert json.loads((root / "indexes" / n / "report.json").read_text())["meta"]["relevance"] == "rougeL"
    mtimes = {p: p.stat().st_mtime for p in root.rglob("*.pt")}
    assert main(args) == 0  # re-running reuses everything
    assert {p: p.stat().st_mtime for p in root.rglob("*.pt")} == mtimes


def test_demo_sentence_reports_this_run_and_claims_the_measurement_only_for_its_setting(capsys):
    """The default scene demo's sentence: this run's difference, and the 3-seed number only when the batch
    is the presets' 16 (a --set train.batch_size=… run is not what RESULTS measured)."""
    from app.cli.demo import SMALL_BATCH_CLAIM, print_comparison

    reps = {"bl": {"rsum": 200.0}, "ltd": {"rsum": 190.5}}
    print_comparison(reps, {}, "none", "synthetic", 16)
    out = capsys.readouterr().out
    assert "LTD ends -9.5 rsum behind the baseline" in out and SMALL_BATCH_CLAIM in out
    print_comparison(reps, {}, "none", "synthetic", 128)
    out = capsys.readouterr().out
    assert "batches of 128 captions" in out and SMALL_BATCH_CLAIM not in out and "are for batch 16" in out
    print_comparison(reps, {}, "none", "karpathy", 128)
    assert "In one sentence" not in capsys.readouterr().out


def test_demo_marks_models_whose_captions_or_targets_saw_flickr30k_or_coco_captions(capsys, monkeypatch, tmp_path):
    from app.cli.demo import PRESETS, print_marks
    from training.config import load_config

    monkeypatch.setenv("LTD_DATA_DIR", str(tmp_path))
    print_marks({n: load_config(p) for n, p in zip(("bl", "ltd"), PRESETS["karpathy"])})
    out = capsys.readouterr().out.splitlines()  # MiniLM encodes both models' captions on Flickr8k
    assert [ln.split(":")[0] for ln in out] == ["ᴹ bl", "ᴹ ltd"] and "captions are encoded by MiniLM" in out[0]
    print_marks({n: load_config(p) for n, p in zip(("bl", "ltd"), PRESETS["synthetic"])})
    out = capsys.readouterr().out.splitlines()  # on the scenes only LTD's targets are MiniLM's
    assert len(out) == 1 and out[0].startswith("ᴹ ltd: its LTD targets come from all-MiniLM-L6-v2")


@pytest.mark.slow
def test_demo_shortcuts_trains_with_them_and_tests_without_and_with(tmp_path, capsys, monkeypatch):
    """`ltd demo --shortcuts`: the SVL presets in their own folder, test without and with the shortcut."""
    from app.cli import main

    monkeypatch.delenv("LTD_DATA_DIR", raising=False)
    assert main(_demo_args(tmp_path, "--shortcuts")) == 0
    out = capsys.readouterr().out
    assert out.count("| metric | bl | ltd | Δ (ltd − bl) |") == 2 and "| rsum |" in out  # without, with the shortcut
    assert "Test WITHOUT it" in out and "Test WITH the shortcut" in out and "In one sentence:" in out
    root = tmp_path / "demo" / "synthetic_svl"
    for n in ("bl", "ltd"):
        assert yaml.safe_load((root / "runs" / n / "config.yaml").read_text())["data"]["shortcuts"] == "unique"
        clean = json.loads((root / "indexes" / n / "manifest.json").read_text())
        with_sc = json.loads((root / "indexes" / f"{n}_shortcut" / "manifest.json").read_text())
        assert clean.get("shortcuts", "none") == "none" and with_sc["shortcuts"] == "unique"
    assert main(_demo_args(tmp_path, "--shortcuts", "--dataset", str(tmp_path))) == 2  # the scenes' setting only
    assert "--shortcuts is the synthetic scenes'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("shortcuts", [False, True], ids=["default", "shortcuts"])
def test_demo_captioning_trains_the_control_and_the_referee_and_reuses(tmp_path, capsys, monkeypatch, shortcuts):
    """`ltd demo --captioning`: the referee (a recipe and seed no judge has), XE, then from XE SCST with
    CIDEr-D only and SR-FL under each judge (the demo's two models; with --shortcuts two clean ones are
    trained); the table under the referee and the sentence; a re-run retrains and re-evaluates nothing."""
    from test_caption_cli import TINY_CAP

    from app.cli import main
    from app.cli.demo_captioning import REFEREE

    monkeypatch.delenv("LTD_DATA_DIR", raising=False)
    args = _demo_args(tmp_path, "--captioning", *(["--shortcuts"] if shortcuts else []))
    for s in TINY_CAP:
        if not s.startswith("data.synthetic_images"):
            args += ["--caption-set", s]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| captioner | CIDEr-D | unique % | self-R@1, referee | self-R@10, referee |" in out
    for row in ("cross-entropy only", "SCST, CIDEr-D only", "SR-FL, baseline judge", "SR-FL, LTD judge"):
        assert f"| {row} |" in out
    assert "self-R@10 under the referee against SCST with CIDEr-D only in this run" in out
    assert "the 3-seed measurement is for the scene presets unchanged" in out  # --caption-set: not the presets
    root = tmp_path / "demo" / ("synthetic_svl" if shortcuts else "synthetic")
    judges = {j: (root / "runs" / (f"judge_{j}" if shortcuts else j) / "best.pt").resolve() for j in ("bl", "ltd")}
    ref_cfg = yaml.safe_load((root / "runs" / "referee" / "config.yaml").read_text())
    preset, sets = REFEREE["synthetic_svl" if shortcuts else "synthetic"]
    assert ref_cfg["train"]["seed"] == 1 and ref_cfg["train"]["name"] == preset and sets == ["train.seed=1"]
    for j in ("bl", "ltd"):
        judge_cfg = yaml.safe_load((judges[j].parent / "config.yaml").read_text())
        assert (judge_cfg["train"]["seed"], judge_cfg["data"]["shortcuts"]) == (0, "none")
    xe = (root / "captioners" / "xe" / "best.pt").resolve()
    for name, judge in (("scst", ""), ("sr_bl", str(judges["bl"])), ("sr_ltd", str(judges["ltd"]))):
        cfg = yaml.safe_load((root / "captioners" / name / "config.yaml").read_text())
        assert Path(cfg["train"]["init_from"]) == xe and cfg["train"]["retrieval"] == judge
        assert (cfg["scst"]["alpha"] == 0) == (name == "scst")
        rep = json.loads((root / "captioners" / name / "eval_test" / "report.json").read_text())
        assert set(rep["judges"]) == {"referee", "bl", "ltd"} and rep["meta"]["dataset"]["split"] == "test"
    assert json.loads((root / "indexes" / "referee" / "manifest.json").read_text())["dataset"]["split"] == "test"
    mtimes = {p: p.stat().st_mtime for p in root.rglob("*.pt")} | {p: p.stat().st_mtime for p in root.rglob("report.json")}
    served = {}
    monkeypatch.setattr("app.cli.demo.serve", lambda settings, **kw: served.update(settings=settings, **kw) or 0)
    assert main([a for a in args if a != "--no-serve"]) == 0  # re-running reuses every run, index and report …
    assert {p: p.stat().st_mtime for p in mtimes} == mtimes
    # … and serves the four captioners beside the retrieval models and the referee (uvicorn replaced)
    settings, svc, caps = served["settings"], served["service"], served["captions"]
    assert set(settings.captioners) == {"xe", "scst", "sr_bl", "sr_ltd"} and set(settings.models) == {"bl", "ltd", "referee"}
    assert served["host"] == "127.0.0.1"
    image_id = int(svc.registry.get("referee").index.images.meta["ids"][0])
    body = caps.caption_image(image_id=image_id, beam=1)
    assert [c.captioner for c in body.captions] == ["xe", "scst", "sr_bl", "sr_ltd"]
    for cap in body.captions:
        if cap.caption.strip():  # the referee's rank on every caption; a judge is marked for its SR-FL captioner
            flags = {r.model: (r.teacher, r.referee) for r in cap.retrieval}
            assert flags["referee"] == (False, True)
            if not shortcuts:  # the judges are the served bl and ltd (with --shortcuts: clean judges, not served)
                assert flags["bl"] == (cap.captioner == "sr_bl", False)
                assert flags["ltd"] == (cap.captioner == "sr_ltd", False)


def test_caption_sentence_quotes_the_measurement_only_for_the_scene_presets(capsys):
    from app.cli.demo_captioning import CAPTION_MEASURED, print_caption_comparison

    def rep(cider, r10):
        return {"CIDEr-D": cider, "unique_%": 50.0, "judges": {"referee": {"self_R@1": 5.0, "self_R@10": r10}}}

    reps = {"xe": rep(40.0, 30.0), "scst": rep(45.0, 31.0), "sr_bl": rep(44.0, 34.5), "sr_ltd": rep(44.5, 33.0)}
    print_caption_comparison(reps, "synthetic", 4.0)
    out = capsys.readouterr().out
    assert "| SR-FL, baseline judge | 44.0 | 50.0 | 5.0 | 34.5 |" in out and "+3.5 self-R@10" in out
    assert "CIDEr-D + 4 · self-retrieval" in out and CAPTION_MEASURED in out
    print_caption_comparison(reps, "synthetic", 4.0, customised=True)
    assert CAPTION_MEASURED not in capsys.readouterr().out
    print_caption_comparison(reps, "karpathy", 1.0)
    assert CAPTION_MEASURED not in capsys.readouterr().out


@pytest.mark.slow
def test_experiment_grid_runs_and_resumes(tmp_path, capsys):
    from app.cli import main

    grid = {"name": "tiny", "base": "synthetic_baseline", "set": TINY + ["train.epochs=1"], "seeds": [0, 1],
            "cells": [{"name": "baseline", "set": ["loss.mode=none"]},
                      {"name": "ltd", "set": ["loss.mode=constraint"], "sweep": {"loss.eta": [0.3, 0.6]}}]}
    gpath = tmp_path / "grid.yaml"
    gpath.write_text(yaml.safe_dump(grid))
    out = tmp_path / "exp"
    assert main(["experiment", "--config", str(gpath), "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    sel = res["selection"]["ltd"]
    assert sel["param"] == "loss.eta" and sel["chosen"] in (0.3, 0.6)
    assert sel["chosen"] == max((0.3, 0.6), key=lambda v: sel["val_rsum"][str(v)])  # chosen on val, not test
    assert {(r["cell"], r["seed"]) for r in res["runs"]} == {("baseline", 0), ("baseline", 1), ("ltd", 0), ("ltd", 1)}
    s = res["summary"]["baseline"]["test"]["rsum"]
    assert s["n"] == 2 and s["values"] == [r["reports"]["test"]["rsum"] for r in res["runs"] if r["cell"] == "baseline"]
    md = (out / "results.md").read_text()
    assert "| baseline |" in md and "± " in md and "**" in md
    assert list((out / "plots").rglob("curves.png")) and (out / "plots" / "cells.png").stat().st_size > 10_000
    # resume: a second invocation trains nothing (checkpoints untouched) and reproduces the results
    mtimes = {p: p.stat().st_mtime for p in out.rglob("checkpoint.pt")}
    assert len(mtimes) == 2 * 2 + 1  # 2 sweep values × seed 0 (one reused by the main phase) + seed 1 for each cell
    # (through the parallel path: two worker processes, one torch thread each)
    assert main(["experiment", "--config", str(gpath), "--out", str(out), "--jobs", "2"]) == 0
    assert {p: p.stat().st_mtime for p in out.rglob("checkpoint.pt")} == mtimes
    res2 = json.loads((out / "results.json").read_text())
    assert res2["summary"] == res["summary"]
    # training time survives resumption (read from metrics.jsonl, not from the skipped invocation)
    assert [r["train_s"] for r in res2["runs"]] == [r["train_s"] for r in res["runs"]]
    assert all(r["train_s"] > 0 for r in res2["runs"]) and "## Training time" in (out / "results.md").read_text()
    pair = res2["paired"][0]
    assert pair["bootstrap"]["resampling"] == "images" and pair["verdict"] and pair["rsum"]["n"] == 2
    # --render: nothing trained; a run without its test report (a grid still running) is left out
    (out / "indexes" / "baseline" / "seed1" / "test" / "report.json").unlink()
    assert main(["experiment", "--config", str(gpath), "--out", str(out), "--render"]) == 0
    assert {p: p.stat().st_mtime for p in out.rglob("checkpoint.pt")} == mtimes
    part = json.loads((out / "results.json").read_text())
    assert part["partial"] and {(r["cell"], r["seed"]) for r in part["runs"]} == {("baseline", 0), ("ltd", 0), ("ltd", 1)}
    assert part["missing"] == [{"label": "baseline", "seed": 1, "state": "trained; index or evaluation missing"}]
    assert "**Partial**" in (out / "results.md").read_text()
    assert "Missing (1): baseline seed 1: trained; index or evaluation missing." in (out / "results.md").read_text()
    from app.experiment_report import render_results
    part["missing"] += [{"label": "ltd", "seed": s, "state": "not started"} for s in (2, 3)]
    assert "Missing (3): baseline seed 1: trained; index or evaluation missing; 2 not started." in render_results(part)
    # --render without --config: a results.json whose runs are gone (a docs/results copy) keeps its bootstrap
    copy = tmp_path / "copy"
    copy.mkdir()
    for r in res2["runs"]:
        r["index_root"] = str(tmp_path / "gone")
    (copy / "results.json").write_text(json.dumps({**res2, "paired": [{**pair, "bootstrap": {
        k: v for k, v in pair["bootstrap"].items() if k != "resampling"}}]}))
    assert main(["experiment", "--render", "--out", str(copy)]) == 0
    again = json.loads((copy / "results.json").read_text())["paired"][0]
    assert again["bootstrap"]["resampling"] == "queries" and again["bootstrap"]["rsum"] == pair["bootstrap"]["rsum"]
    assert "† older runs" in (copy / "results.md").read_text()


def test_a_grid_runs_its_seeds_one_after_another(tmp_path, monkeypatch):
    """Every cell of the grid's first seed is scheduled before any cell of its second, so a grid stopped part-way (a session's
    end) holds whole seeds for the seed-matched comparisons; the sweep runs before them all."""
    from app import experiment
    from app.grid import load_grid

    grid = {"set": TINY, "seeds": [2, 0, 1],
            "cells": [{"name": "a"}, {"name": "b", "sweep": {"loss.eta": [0.3, 0.6]}}, {"name": "c", "seeds": [0, 1]}]}
    gpath = tmp_path / "grid.yaml"
    gpath.write_text(yaml.safe_dump(grid))
    calls = []
    monkeypatch.setattr(experiment, "_run_all", lambda js, n, collect=False, **kw: calls.append([(j.cell, j.seed) for j in js]) or [])
    monkeypatch.setattr(experiment, "_choose", lambda g, r, v: {"b": {"param": "loss.eta", "chosen": 0.6, "val_rsum": {}}})
    monkeypatch.setattr(experiment, "paired_statistics", lambda *a: [])
    monkeypatch.setattr(experiment, "write_results", lambda *a: None)
    experiment.run_grid(load_grid(gpath), tmp_path / "exp")
    assert calls[1] == [("b", 2), ("b", 2)]  # the sweep, on the grid's first seed
    assert calls[2] == [("a", 2), ("b", 2), ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)]


def test_grid_progress_counts_the_runs_a_killed_grid_finished_from_the_start(monkeypatch, caplog):
    """A resumed grid's bar starts at the runs already finished and moves once for each run that trains,
    so its pace and time left are those of the training runs, not of reports re-read in a second."""
    from app import experiment

    jobs = [experiment.Job(cell=c, seed=s, overrides=[], run_dir="", index_root="", eval_splits=[], eval_shortcuts=[],
                           relevance=None, base="", label=c) for c, s in (("a", 0), ("b", 0), ("a", 1))]
    monkeypatch.setattr(experiment, "_collect_job",
                        lambda j: {"cell": j.cell, "seed": j.seed} if (j.cell, j.seed) == ("b", 0) else None)
    monkeypatch.setattr(experiment, "_run_job", lambda j: {"cell": j.cell, "seed": j.seed})
    monkeypatch.setenv("LTD_PROGRESS", "log")
    monkeypatch.setenv("LTD_PROGRESS_INTERVAL", "1e-9")
    with caplog.at_level(logging.INFO, logger="ltd.progress"):
        out = experiment._run_all(jobs, 1, desc="grid runs")
    assert [(r["cell"], r["seed"]) for r in out] == [("a", 0), ("b", 0), ("a", 1)]  # the jobs' order
    lines = [r.getMessage() for r in caplog.records]
    assert [ln.split(" run in")[0] for ln in lines] == ["grid runs: 2/3 (67 %)", "grid runs: 3/3 (100 %)",
                                                        "grid runs: 3/3 (100 %)"]  # two runs trained, then close
    assert lines[0].endswith("last=a seed 0") and lines[1].endswith("last=a seed 1")


def test_time_left_of_runs_that_go_several_at_a_time():
    """Runs that start together end together: counting finished runs would call the first one's pace the
    grid's (1 run in 20 min, 11 left: ~3.7 h). _TimeLeft follows the workers' schedule instead, so with
    equal durations it is exact at every finished run."""
    from app.experiment import _TimeLeft

    for n, workers, d in ((12, 2, 20.0), (7, 3, 5.0), (2, 4, 3.0)):
        # the true schedule: each run starts on the worker that frees up first
        free, ends = [0.0] * min(workers, n), []
        for _ in range(n):
            start = min(free)
            free[free.index(start)] = start + d
            ends.append(start + d)
        left = _TimeLeft(n, workers, 0.0)
        for k, end in enumerate(sorted(ends)):
            left.finished(d, end)
            assert left.seconds(end) == pytest.approx(max(ends) - end), (n, workers, k)
    # between finished runs the runs in flight count down; one that outlasts the mean is taken to end now
    left = _TimeLeft(3, 2, 0.0)
    left.finished(10.0, 10.0)  # in flight: the run started at 0 and the third, started at 10
    assert left.seconds(12.0) == pytest.approx(8.0) and left.seconds(25.0) == 0.0


def _fake_run_job(job):  # module level: the worker processes unpickle it by name
    return {"cell": job.cell, "seed": job.seed, "wall_s": 0.01}


def test_grid_progress_with_two_jobs_shows_the_schedules_time_left(monkeypatch, caplog):
    from app import experiment

    jobs = [experiment.Job(cell="a", seed=s, overrides=[], run_dir="", index_root="", eval_splits=[],
                           eval_shortcuts=[], relevance=None, base="", label="a") for s in range(4)]
    monkeypatch.setattr(experiment, "_collect_job", lambda j: {"cell": j.cell, "seed": j.seed} if j.seed == 2 else None)
    monkeypatch.setattr(experiment, "_run_job", _fake_run_job)
    monkeypatch.setenv("LTD_PROGRESS", "log")
    monkeypatch.setenv("LTD_PROGRESS_INTERVAL", "1e-9")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with caplog.at_level(logging.INFO, logger="ltd.progress"):
        out = experiment._run_all(jobs, 2, desc="grid runs")
    assert [r["seed"] for r in out] == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and lines[0].startswith("grid runs: 2/4 (50 %) run in ")  # 3 trained, then close
    assert all("left=~" in ln for ln in lines) and not any("/s" in ln or "/run" in ln for ln in lines)
    assert lines[-1].endswith("left=~0 s")


def test_a_missing_runs_state_is_read_from_its_log(tmp_path):
    """`--render` of a grid still running says where each missing run stands: not started, how many of
    its epochs it trained (a torn last log line is skipped), or trained and waiting for its evaluation."""
    from app import experiment

    run = tmp_path / "run"
    job = experiment.Job(cell="b", seed=3, overrides=TINY + ["train.epochs=5"], run_dir=str(run), index_root="",
                         eval_splits=[], eval_shortcuts=[], relevance=None, base="synthetic_baseline", label="b@eta=0.2")
    assert experiment._job_state(job) == {"label": "b@eta=0.2", "seed": 3, "state": "not started"}
    run.mkdir()
    rows = [{"type": "val", "epoch": 0}] + [{"type": "epoch", "epoch": e, "seconds": 10.0} for e in (1, 2)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"type": "epo')
    assert experiment._job_state(job)["state"] == "epoch 2 of 5 trained"
    assert experiment._train_seconds(run / "metrics.jsonl") == 20.0
    (run / "metrics.jsonl").write_text("\n".join(json.dumps({"type": "epoch", "epoch": e}) for e in range(1, 6)))
    assert experiment._job_state(job)["state"] == "trained; index or evaluation missing"


def test_experiment_grid_validation(tmp_path):
    from app.grid import load_grid
    from training.config import ConfigError

    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump({"cells": [{"name": "a", "set": ["loss.mode=nope"]}]}))
    with pytest.raises(ConfigError, match="loss.mode='nope' is not valid"):
        load_grid(p)
    p.write_text(yaml.safe_dump({"cells": [{"name": "a"}, {"name": "a"}]}))
    with pytest.raises(ConfigError, match="unique 'name'"):
        load_grid(p)
    p.write_text(yaml.safe_dump({"cellz": []}))
    with pytest.raises(ConfigError, match="unknown config key 'cellz' \\(did you mean 'cells'\\?\\); valid keys here: name, base, set"):
        load_grid(p)


def test_experiment_extra_set_is_common_and_validated(tmp_path):
    from app.grid import load_grid
    from training.config import ConfigError

    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump({"set": ["train.epochs=2"], "cells": [{"name": "a", "set": ["loss.mode=constraint"]}]}))
    g = load_grid(p, ["loss.eta=0.15"])
    assert g.common == ["train.epochs=2", "loss.eta=0.15"] and g.raw["set"] == g.common
    with pytest.raises(ConfigError, match="eta"):
        load_grid(p, ["loss.eta=-1"])


@pytest.mark.slow
def test_shipped_grids_are_valid(monkeypatch, tmp_path):
    from app.grid import load_grid

    monkeypatch.setenv("LTD_DATA_DIR", str(tmp_path))
    grids = sorted((Path(__file__).parent.parent / "grids").glob("*.yaml"))
    assert len(grids) >= 5
    for g in grids:
        assert load_grid(g).cells


def test_seed_matched_differences_and_their_t_interval():
    from scipy import stats

    from app.experiment_report import render_results
    from app.experiment_stats import seed_matched

    def run(cell, seed, rsum, ndcg):
        return {"cell": cell, "seed": seed, "reports": {"test": {"rsum": rsum, "t2i_nDCG@25_rougeL": ndcg}}}

    runs = [run("baseline", 0, 100.0, 0.60), run("baseline", 1, 110.0, 0.61), run("baseline", 2, 90.0, 0.62),
            run("ltd", 2, 93.0, 0.63), run("ltd", 0, 104.0, 0.60), run("ltd", 1, 109.0, 0.64),
            run("itd", 0, 120.0, 0.70)]  # one seed: no paired row
    summary = {"baseline": {"test": {}}, "ltd": {"test": {}}, "itd": {"test": {}}}
    results = {"name": "g", "base": "b", "common": [], "seeds": [0, 1, 2], "eval_split": "test",
               "val_split": "val", "selection": {}, "runs": runs, "summary": summary,
               "machine": {"cpu": "x", "cores": 2}}
    d = seed_matched(results, "test", "baseline", "ltd")
    assert seed_matched(results, "test", "baseline", "itd") is None
    assert d["values"] == [4.0, -1.0, 3.0] and d["ahead"] == 2 and d["seeds"] == [0, 1, 2]
    assert abs(d["mean"] - 2.0) < 1e-9 and abs(d["std"] - 2.6457513) < 1e-6
    lo, hi = stats.t.interval(0.95, 2, loc=2.0, scale=stats.sem([4.0, -1.0, 3.0]))
    assert (d["lo"], d["hi"]) == pytest.approx((lo, hi))
    md = render_results(results)
    assert "## Paired comparisons" in md
    assert f"| test | baseline | ltd | +2.0 ± 2.6 | 2/3 | [{lo:+.1f}, {hi:+.1f}] | – | not shown (~" in md


def test_t_interval_matches_scipy_and_the_verdict_needs_both_intervals():
    from scipy import stats

    from app.experiment_stats import t_interval, verdict

    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 9):
        x = rng.normal(1.0, 2.0, n)
        got = t_interval(list(x))
        lo, hi = stats.t.interval(0.95, n - 1, loc=x.mean(), scale=stats.sem(x))
        assert (got["lo"], got["hi"]) == pytest.approx((lo, hi)) and got["n"] == n
        # the fewest seeds whose interval would exclude 0 at this mean and sd
        need = got["seeds_needed"]
        half = lambda m, x=x: stats.t.ppf(0.975, m - 1) * x.std(ddof=1) / np.sqrt(m)  # noqa: E731
        assert need > 50 or (half(need) < abs(x.mean()) and (need == 2 or half(need - 1) >= abs(x.mean())))
    ahead = t_interval([5.0, 6.0, 7.0])
    assert verdict(ahead, None) == "ahead"
    assert verdict(ahead, {"lo": 0.5, "hi": 3.0, "resampling": "images"}) == "ahead"
    assert verdict(ahead, {"lo": -0.5, "hi": 3.0, "resampling": "images"}) == "not shown (test set)"
    assert verdict(ahead, {"lo": -0.5, "hi": 3.0, "resampling": "queries"}) == "ahead"  # † not used
    assert verdict(t_interval([-5.0, -6.0, -7.0]), None) == "behind"
    assert verdict(t_interval([6.0, -1.0, 3.0]), None).startswith("not shown (~")
    assert verdict(None, None) == "–"


def test_grid_overrides_substitute_seed_next_seed_and_out(tmp_path):
    from app.grid import substitute

    sets = ["loss.lambda_schedule={out}/runs/c/seed{next_seed}", "x.y={seed}"]
    assert substitute(sets, 2, [0, 1, 2], tmp_path) == [f"loss.lambda_schedule={tmp_path}/runs/c/seed0", "x.y=2"]
    assert substitute(sets, 0, [0, 1, 2], tmp_path)[0].endswith("seed1")


def test_reported_evaluations_leave_out_val_unless_the_grid_reports_on_it():
    from app.experiment_report import reported_tags

    summary = {"a": {"val": {}, "test": {}, "test_sc-unique": {}}}
    assert reported_tags({"summary": summary, "val_split": "val", "eval_split": "test"}) == ["test", "test_sc-unique"]
    # a grid that chooses nothing may report val itself (grids/data_parallel.yaml: test stays unused)
    assert reported_tags({"summary": {"a": {"val": {}}}, "val_split": "val", "eval_split": "val"}) == ["val"]


def test_the_clean_preset_is_the_grids_headline_cell(monkeypatch, tmp_path):
    """configs/flickr8k_clean.yaml must be exactly the recipe whose 3 seeds RESULTS.md reports."""
    from app.grid import load_grid
    from training.config import load_config

    monkeypatch.setenv("LTD_DATA_DIR", str(tmp_path))
    grid = load_grid(Path(__file__).parent.parent / "grids" / "flickr8k_clean.yaml")
    cell = next(c for c in grid.cells if c.name == "fne_gru_maxpool")
    measured = load_config(grid.base, grid.common + cell.set + ["train.name=flickr8k_clean"]).to_dict()
    preset = load_config("flickr8k_clean").to_dict()
    for d in (measured, preset):  # the grid's base is the MiniLM preset; its sbert options do not apply to a bi-GRU
        d["model"] = {k: v for k, v in d["model"].items() if not k.startswith("sbert_")}
    assert preset == measured


def test_a_set_sweep_tunes_several_keys_per_value(tmp_path):
    """``sweep: {set: [[k=v, ...], ...]}``: each value is a setting of several keys (a baseline tuned over τ
    and the learning rate); its overrides are validated up front and its label names every key."""
    from app.grid import load_grid, sweep_label, sweep_sets
    from training.config import ConfigError
    from training.errors import UserError

    v = ["loss.tau=0.1", "optim.lr=2.5e-4"]
    assert sweep_sets("set", v) == v and sweep_sets("loss.eta", 0.2) == ["loss.eta=0.2"]
    assert sweep_label("bl", "set", v) == "bl@tau=0.1,lr=2.5e-4"
    assert sweep_label("ltd", "loss.eta", 0.2) == "ltd@eta=0.2"
    with pytest.raises(ValueError, match="KEY=VALUE"):
        sweep_sets("set", "loss.tau=0.1")
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump({"cells": [{"name": "a", "sweep": {"set": [v, ["loss.tau=-1", "optim.lr=1e-3"]]}}]}))
    with pytest.raises(ConfigError, match="tau"):
        load_grid(p)
    p.write_text(yaml.safe_dump({"cells": [{"name": "a", "sweep": {"set": [["nope"]]}}]}))
    with pytest.raises(UserError, match="cell a: a 'set' sweep value is a list of KEY=VALUE"):
        load_grid(p)
