"""The CLI's error boundary (issue 36): a mistake the user can fix (``UserError``) is one line and exit
2; anything else is a bug or a machine problem and keeps its traceback, exit 1, with a request to
report it, instead of being disguised as a user error."""
from __future__ import annotations

import pytest

from app.cli import train as train_cli
from app.cli.parser import main
from training.errors import UserError, UserValueError


def _command_raising(monkeypatch, exc: BaseException) -> None:
    def cmd(args):
        raise exc
    monkeypatch.setattr(train_cli, "cmd_train", cmd)  # the parser reads the module's function when it is built


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"),
    ValueError("too many values to unpack (expected 2)"),
    MemoryError(),
    KeyError("model"),
])
def test_a_bug_prints_its_traceback_and_exits_1(monkeypatch, capsys, exc):
    _command_raising(monkeypatch, exc)
    assert main(["train"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and type(exc).__name__ in err
    assert f"ltd train: internal error ({type(exc).__name__})" in err and "please report it" in err


@pytest.mark.parametrize("exc", [UserError("data.path: no such file"), UserValueError("--jobs must be at least 1")])
def test_a_user_error_is_one_line_and_exit_2(monkeypatch, capsys, exc):
    _command_raising(monkeypatch, exc)
    assert main(["train"]) == 2
    assert capsys.readouterr().err == f"ltd train: error: {exc}\n"


def test_the_library_errors_users_can_fix_are_user_errors():
    from indexer.caption_metrics import CaptionMetricsError
    from indexer.vector_index import IndexDirError
    from training.checkpoint import CheckpointError
    from training.config import ConfigError
    from training.data.images import ImageError
    from training.data.karpathy import DatasetError
    from training.packaged_models import ModelNotInstalled

    for cls in (CaptionMetricsError, IndexDirError, CheckpointError, ConfigError, ImageError, DatasetError,
                ModelNotInstalled):
        assert issubclass(cls, UserError), cls
