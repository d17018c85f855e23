"""A finished run stays reusable when the config gains an option (its default = the old behaviour),
and still conflicts when the saved run really differs."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.pipeline import _state
from training.captioning.config import CaptionConfig
from training.config import load_config


def _saved_run(run_dir: Path, saved: dict) -> Path:
    run_dir.mkdir()
    for name in ("checkpoint.pt", "best.pt"):
        (run_dir / name).write_bytes(b"x")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    return run_dir


def _without(d: dict, section: str, key: str) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    del out[section][key]
    return out


def test_a_run_saved_before_an_option_existed_is_reused(tmp_path):
    cfg = load_config("synthetic_baseline")
    old = _saved_run(tmp_path / "old", _without(cfg.to_dict(), "model", "text_pool"))  # as saved before text_pool
    assert _state(cfg, old, lambda ckpt: True) == "done"
    assert _state(cfg, old, lambda ckpt: False) == "partial"
    # ... but not when today's config sets the new option away from its default
    assert _state(load_config("synthetic_baseline", ["model.text_pool=max"]), old, lambda ckpt: True) == "conflict"


@pytest.mark.parametrize("change", ["value", "removed_key", "not_a_dict"])
def test_a_really_different_saved_run_conflicts(tmp_path, change):
    cfg = load_config("synthetic_baseline")
    saved = cfg.to_dict()
    if change == "value":
        saved["loss"]["tau"] = 0.5
    elif change == "removed_key":
        saved["model"]["an_option_that_was_removed"] = 1
    else:
        saved["model"] = "gru"
    assert _state(cfg, _saved_run(tmp_path / change, saved), lambda ckpt: True) == "conflict"


def test_caption_runs_get_the_same_rule(tmp_path):
    cfg = CaptionConfig()
    d = cfg.to_dict()
    section = next(k for k, v in d.items() if isinstance(v, dict) and v)
    key = next(iter(d[section]))
    assert _state(cfg, _saved_run(tmp_path / "cap", _without(d, section, key)), lambda ckpt: True) == "done"
