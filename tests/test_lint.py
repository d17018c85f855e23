"""ruff (lint + import order, configured in pyproject.toml) over the whole repository, so that `make test`
catches an unused import, a shadowed name or a late-binding closure the same way it catches a failing test."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (it comes with the test extra: pip install -e '.[test]')")
def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (
        f"ruff found problems (most are fixed by `ruff check --fix .`):\n{proc.stdout}{proc.stderr}")
