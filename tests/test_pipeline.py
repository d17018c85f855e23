"""End-to-end: `ltd demo --no-serve` and `ltd experiment` (tiny grid, resume)."""
from __future__ import annotations

import json
from pathlib import Path

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
    assert "batches of 128 captions" in out and SMALL_BATCH_CLAIM not in out and "is for batch 16" in out
    print_comparison(reps, {}, "none", "karpathy", 128)
    assert "In one sentence" not in capsys.readouterr().out


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
def test_demo_captioning_trains_judges_and_captioners_and_reuses(tmp_path, capsys, monkeypatch):
    """`ltd demo --shortcuts --captioning`: clean judges (the demo's shortcut models cannot judge), XE, SR-FL
    under each judge started from XE, every captioner evaluated under both judges; a re-run retrains
    nothing. (Without --shortcuts the judges are the demo's own two models: no judge runs.)"""
    from app.cli import main
    from test_caption_cli import TINY_CAP

    monkeypatch.delenv("LTD_DATA_DIR", raising=False)
    args = _demo_args(tmp_path, "--shortcuts", "--captioning")
    for s in TINY_CAP:
        if not s.startswith("data.synthetic_images"):
            args += ["--caption-set", s]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| captioner | BLEU-4 | CIDEr-D | unique_% | self R@1 (bl judge) |" in out
    for name in ("xe", "sr_bl", "sr_ltd"):
        assert f"| {name} |" in out
    root = tmp_path / "demo" / "synthetic_svl"
    for j in ("bl", "ltd"):
        assert yaml.safe_load((root / "runs" / f"judge_{j}" / "config.yaml").read_text())["data"]["shortcuts"] == "none"
        cfg = yaml.safe_load((root / "captioners" / f"sr_{j}" / "config.yaml").read_text())
        assert Path(cfg["train"]["retrieval"]) == (root / "runs" / f"judge_{j}" / "best.pt").resolve()
        assert Path(cfg["train"]["init_from"]) == (root / "captioners" / "xe" / "best.pt").resolve()
    rep = json.loads((root / "captioners" / "sr_ltd" / "eval_test" / "report.json").read_text())
    assert set(rep["judges"]) == {"bl", "ltd"} and rep["meta"]["dataset"]["split"] == "test"
    mtimes = {p: p.stat().st_mtime for p in root.rglob("*.pt")} | {p: p.stat().st_mtime for p in root.rglob("report.json")}
    assert main(args) == 0  # re-running reuses every run and report
    assert {p: p.stat().st_mtime for p in mtimes} == mtimes


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


def test_shipped_grids_are_valid(monkeypatch, tmp_path):
    from app.grid import load_grid

    monkeypatch.setenv("LTD_DATA_DIR", str(tmp_path))
    grids = sorted((Path(__file__).parent.parent / "grids").glob("*.yaml"))
    assert len(grids) >= 5
    for g in grids:
        assert load_grid(g).cells


def test_paired_differences_match_by_seed():
    from app.experiment import paired_differences, render_results

    def run(cell, seed, rsum, ndcg):
        return {"cell": cell, "seed": seed, "reports": {"test": {"rsum": rsum, "t2i_nDCG@25_rougeL": ndcg}}}

    runs = [run("baseline", 0, 100.0, 0.60), run("baseline", 1, 110.0, 0.61), run("baseline", 2, 90.0, 0.62),
            run("ltd", 2, 93.0, 0.63), run("ltd", 0, 104.0, 0.60), run("ltd", 1, 109.0, 0.64),
            run("itd", 0, 120.0, 0.70)]  # one seed: no paired row
    summary = {"baseline": {"test": {}}, "ltd": {"test": {}}, "itd": {"test": {}}}
    results = {"name": "g", "base": "b", "common": [], "seeds": [0, 1, 2], "eval_split": "test",
               "val_split": "val", "selection": {}, "runs": runs, "summary": summary,
               "machine": {"cpu": "x", "cores": 2}}
    d = paired_differences(results, "test")
    assert set(d) == {"ltd"} and d["ltd"]["values"] == [4.0, -1.0, 3.0] and d["ltd"]["ahead"] == 2
    assert abs(d["ltd"]["mean"] - 2.0) < 1e-9 and abs(d["ltd"]["std"] - 2.6457513) < 1e-6
    md = render_results(results)
    assert "## Paired comparisons" in md
    assert "| test | baseline | ltd | +2.0 ± 2.6 | 2/3 | – | +0.0133 ± 0.0153 | 2/3 | – |" in md


def test_grid_overrides_substitute_seed_next_seed_and_out(tmp_path):
    from app.grid import substitute

    sets = ["loss.lambda_schedule={out}/runs/c/seed{next_seed}", "x.y={seed}"]
    assert substitute(sets, 2, [0, 1, 2], tmp_path) == [f"loss.lambda_schedule={tmp_path}/runs/c/seed0", "x.y=2"]
    assert substitute(sets, 0, [0, 1, 2], tmp_path)[0].endswith("seed1")


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
