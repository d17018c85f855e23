"""``LTD_*`` variables: one mechanism (pydantic-settings, prefix ``LTD_``), two models — the library's
(``training.env.Environment``) and the service's (``app.api.settings.Settings``). Every ``LTD_*`` name
the tree mentions is a field of one of them (or a variable a preset path expands, below), and no other
module reads one from ``os.environ`` itself.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import sources
from pydantic_settings import BaseSettings

from app.api.settings import Settings, load_settings
from training.config_base import ConfigError
from training.env import PREFIX, Environment, environment

ROOT = Path(__file__).resolve().parents[1]
READERS = {"training/env.py", "app/api/settings.py"}
# Not settings: names a preset's or a user's path expands (``${LTD_CLIP_DIR}/…``, training.prepare).
PATH_VARIABLES = {"LTD_DATA_DIR", "LTD_CLIP_DIR", "LTD_REGION_DIR"}
TEXT_FILES = ("*.md", "Makefile", "Dockerfile", "docs/guides/*.md", "configs/*.yaml", "grids/*.yaml", "docker/*",
              ".ci/*")


def _fields() -> set[str]:
    return {PREFIX + name.upper() for model in (Environment, Settings) for name in model.model_fields}


def test_both_models_are_pydantic_settings_with_the_prefix():
    for model in (Environment, Settings):
        assert issubclass(model, BaseSettings) and model.model_config["env_prefix"] == PREFIX


def test_every_variable_the_tree_names_is_a_setting():
    files = [p for top in ("training", "indexer", "search", "app", "ui", "bench", "tests") for p in (ROOT / top).rglob("*.py")]
    files += [p for pattern in TEXT_FILES for p in ROOT.glob(pattern) if p.is_file()]
    known = _fields() | PATH_VARIABLES
    unknown = {}
    for path in files:
        for name in re.findall(r"\bLTD_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
            if name not in known:
                unknown.setdefault(name, path.relative_to(ROOT).as_posix())
    assert not unknown, f"LTD_* names that no settings model defines: {unknown}"


def _reads_ltd_variable(node: ast.AST) -> bool:
    """``os.environ["LTD_X"]``, ``os.environ.get("LTD_X")``, ``os.getenv("LTD_X")`` (any constant LTD_ key)."""
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and node.args:
        key = node.args[0]
        f = node.func
        if not (isinstance(f, ast.Attribute) and f.attr in ("get", "getenv", "pop", "setdefault")):
            return False
    else:
        return False
    return isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith(PREFIX)


def test_only_the_two_models_read_ltd_variables():
    bad = []
    for top in ("training", "indexer", "search", "app", "ui"):
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in READERS:
                continue
            bad += [f"{rel}:{n.lineno}" for n in ast.walk(sources.tree(path)) if _reads_ltd_variable(n)]
    assert not bad, "read LTD_* variables through training.env.environment() or the settings:\n" + "\n".join(bad)


def test_the_checker_sees_each_way_of_reading():
    tree = ast.parse('os.environ["LTD_A"]\nos.environ.get("LTD_B")\nos.getenv("LTD_C")\nos.environ.get("HOME")\n')
    assert sum(_reads_ltd_variable(n) for n in ast.walk(tree)) == 3


def test_values_come_from_the_environment_and_empty_means_default(monkeypatch):
    monkeypatch.setenv("LTD_PROGRESS", "LOG")
    monkeypatch.setenv("LTD_CACHE_DIR", "")
    monkeypatch.setenv("LTD_MAX_K", "7")
    env = environment()
    assert env.progress == "log" and env.cache_dir == ""
    assert load_settings().max_k == 7


@pytest.mark.parametrize("var, value, load", [
    ("LTD_PROGRESS_INTERVAL", "soon", environment),
    ("LTD_FEATURE_DTYPE", "float8", environment),
    ("LTD_MAX_K", "many", load_settings),
])
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, var, value, load):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as e:
        load()
    assert len(str(e.value).splitlines()) == 1 and (var in str(e.value) or var[4:].lower() in str(e.value))
