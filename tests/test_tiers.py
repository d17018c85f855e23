"""The two test tiers: `make check` runs ruff and every test not marked slow; `make test` runs all of them.
The markers that imply slow (training, browser, realdata) and the fast tier's skipping of modules that
hold only slow tests (tests/conftest.py) are checked here on planted sources."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from conftest import TRAINING_FIXTURES, _only_slow_tests

ROOT = Path(__file__).resolve().parents[1]


def test_the_make_targets_run_the_tiers():
    make = (ROOT / "Makefile").read_text()
    check = make.split("\ncheck:", 1)[1].split("\n\n", 1)[0]
    assert "ruff check" in check and '-m "not slow"' in check
    test = make.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "system-deps" in test.splitlines()[0] and "pytest $(PYTEST_ARGS)" in test  # all of it, after the apt target
    assert re.search(r"^system-deps: browser-deps java-deps$", make, re.M)


def test_the_markers_are_declared():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} == {"slow", "training", "realdata", "browser"}


@pytest.mark.parametrize("source, only_slow", [
    ("import pytest\npytestmark = pytest.mark.slow\ndef test_a():\n    pass\n", True),
    ("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.training]\ndef test_a():\n    pass\n", True),
    ("import pytest\n@pytest.mark.slow\ndef test_a():\n    pass\n@pytest.mark.training\ndef test_b():\n    pass\n", True),
    ("import pytest\n@pytest.mark.slow\ndef test_a():\n    pass\ndef test_b():\n    pass\n", False),
    ("def helper():\n    pass\n", False),
])
def test_modules_of_slow_tests_are_recognised_from_their_source(tmp_path, source, only_slow):
    path = tmp_path / "test_x.py"
    path.write_text(source)
    assert _only_slow_tests(path) is only_slow


@pytest.mark.training
def test_a_training_mark_implies_slow(request):
    assert request.node.get_closest_marker("slow") is not None


def test_the_trained_session_fixtures_are_the_ones_conftest_defines():
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    for name in TRAINING_FIXTURES:
        assert re.search(rf"^def {name}\(", conftest, re.M), name
