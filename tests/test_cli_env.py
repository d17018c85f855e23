"""The OpenMP wait policy the `ltd` process picks for itself (app/cli/__init__.py) before torch loads."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBE = "import sys; sys.argv = {argv!r}; import app.cli, os; print(os.environ.get('OMP_WAIT_POLICY', '<unset>'))"


def _policy(argv: list[str], **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], cwd=ROOT, env={**base, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("argv, expected", [
    (["ltd", "serve", "--model", "bl=x"], "PASSIVE"),
    (["ltd", "-v", "serve"], "PASSIVE"),
    (["ltd", "train", "--config", "flickr8k_ltd"], "<unset>"),   # OpenMP default: spin, then sleep
    (["ltd", "demo", "--no-serve"], "<unset>"),
    (["ltd"], "<unset>"),
])
def test_wait_policy_by_command(argv, expected):
    assert _policy(argv) == expected


def test_user_setting_wins():
    assert _policy(["ltd", "serve"], OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert _policy(["ltd", "train"], OMP_WAIT_POLICY="PASSIVE") == "PASSIVE"
