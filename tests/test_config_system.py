"""The one config system (issue 36): every shipped preset and grid and every run config kept under
docs/results/ loads under today's models; a bad key or choice is one line naming it (exit 2 from the
CLI); renamed keys migrate; the environment and the service settings report bad values the same way."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.cli.parser import main
from app.grid import load_grid
from training.captioning.config import CaptionConfig
from training.config import Config, ModelConfig, load_config
from training.config_base import ConfigError, list_presets, load_layers, load_saved

ROOT = Path(__file__).resolve().parent.parent


def _old_yamls() -> list[Path]:
    return sorted((ROOT / "docs" / "results").rglob("*.yaml"))


def test_every_preset_loads(tmp_path):
    judge = tmp_path / "judge.pt"
    judge.write_bytes(b"x")
    assert len(list_presets("train")) >= 20 and len(list_presets("caption")) >= 4
    for name in list_presets("train"):
        assert isinstance(load_config(name), Config)
    for name in list_presets("caption"):  # SR presets need a judge checkpoint to exist
        assert isinstance(load_layers(CaptionConfig, name, [f"train.retrieval={judge}"], kind="caption"), CaptionConfig)


@pytest.mark.slow
def test_every_grid_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("LTD_DATA_DIR", str(tmp_path))
    grids = sorted((ROOT / "grids").glob("*.yaml")) + [p for p in _old_yamls() if p.name == "grid.yaml"]
    assert len(grids) >= 20
    for g in grids:
        assert load_grid(g).cells, g


@pytest.mark.slow
def test_every_old_run_config_under_docs_results_loads():
    runs = [p for p in _old_yamls() if p.name != "grid.yaml"]
    assert len(runs) >= 50
    kinds = set()
    for p in runs:
        sections = set(yaml.safe_load(p.read_text()))
        cfg = load_saved(CaptionConfig if "xe" in sections else Config, p)
        kinds.add(type(cfg))
        # what it holds is what the file says: no key dropped or changed on the way in
        saved = yaml.safe_load(p.read_text())
        dumped = cfg.to_dict()
        assert all(dumped[s][k] == v or (isinstance(v, int) and dumped[s][k] == float(v))
                   for s, sec in saved.items() for k, v in sec.items()), p
    assert kinds == {Config, CaptionConfig}


@pytest.mark.parametrize("argv, line", [
    (["train", "--set", "loss.mode=nope"],
     "loss.mode='nope' is not valid; choose one of: none, dual, constraint, replay"),
    (["train", "--set", "model.text_hiden=64"],
     "unknown config key 'model.text_hiden' (did you mean 'text_hidden'?); valid keys here: backbone, "),
    (["train", "--set", "model.crops=3"], "model.crops=3 is not valid; choose one of: 1, 2, 10"),
    (["train", "--set", "train.epochs=two"], "train.epochs: expected an integer, got 'two'"),
    (["caption", "train", "--config", "caption_synthetic_xe", "--set", "scst.negatives=worst"],
     "scst.negatives='worst' is not valid; choose one of: moderate, random, hardest, none"),
    (["caption", "train", "--config", "caption_synthetic_xe", "--set", "xe.epoch=3"],
     "unknown config key 'xe.epoch' (did you mean 'epochs'?)"),
])
def test_cli_config_errors_are_one_line_exit_2(argv, line, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and line in err, err


def test_cli_grid_errors_are_one_line_exit_2(capsys, tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"cells": [{"name": "a", "sett": ["loss.mode=dual"]}]}))
    assert main(["experiment", "--config", str(grid), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown config key 'cells[0].sett' (did you mean 'set'?)" in err, err


def test_sections_pass_alone_and_compare_as_values():
    cfg = load_config(None, ["model.embed_dim=64"])
    assert isinstance(cfg.model, ModelConfig) and cfg.model == ModelConfig(embed_dim=64)
    assert load_saved(Config, cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"model.resize=100 must be 0 or >= model.image_size"):
        load_config(None, ["model.resize=100"])


def test_environment_is_read_in_one_place_and_checked(monkeypatch, tmp_path):
    from training.env import default_cache_dir, environment

    monkeypatch.setenv("LTD_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path and default_cache_dir("elsewhere") == Path("elsewhere")
    monkeypatch.setenv("LTD_PROGRESS", "sometimes")
    with pytest.raises(ConfigError, match="environment variable LTD_PROGRESS='sometimes' is not valid; "
                                          "choose one of: bar, log, off"):
        environment()
    library = [p for top in ("training", "indexer", "search") for p in (ROOT / top).rglob("*.py")
               if p.name != "env.py"]
    readers = [str(p.relative_to(ROOT)) for p in library
               if "os.environ.get(\"LTD_" in p.read_text() or "getenv(\"LTD_" in p.read_text()]
    assert readers == []


def test_service_settings_share_the_search_fields_and_the_error_line(monkeypatch):
    from app.api.settings import Settings, load_settings
    from search import SearchConfig

    assert set(SearchConfig.model_fields) < set(Settings.model_fields)
    monkeypatch.setenv("LTD_MAX_K", "7")
    assert load_settings(device="cpu").search_config() == SearchConfig(max_k=7)
    monkeypatch.setenv("LTD_VERIFY_INDEX", "never")
    with pytest.raises(ConfigError, match="verify_index='never' is not valid; choose one of: hash, counts"):
        load_settings()
