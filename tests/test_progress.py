"""Progress output: a bar on a terminal, a few log lines elsewhere (not hundreds of redrawn bars)."""
from __future__ import annotations

import logging

from training import progress as p


def test_log_mode_writes_a_line_per_interval_and_one_at_the_end(monkeypatch, caplog):
    monkeypatch.setenv("LTD_PROGRESS", "log")
    monkeypatch.setenv("LTD_PROGRESS_INTERVAL", "1000")
    clock = iter([0.0, 500.0, 1500.0, 1500.0, 1600.0, 2000.0])  # start, 3 updates (+1 for the line), close
    monkeypatch.setattr(p.time, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="ltd.progress"):
        with p.progress(100, desc="image features", unit="img") as bar:
            assert isinstance(bar, p.LogProgress)
            bar.update(10)  # t=500: not yet
            bar.update(40)  # t=1500: one line
            bar.update(50)  # t=1600: not yet
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("image features: 50/100 (50 %) img in 1500 s")
    assert lines[1].startswith("image features: 100/100 (100 %) img in 2000 s")


def test_mode_follows_the_terminal_and_the_override(monkeypatch):
    monkeypatch.delenv("LTD_PROGRESS", raising=False)
    monkeypatch.setattr(p.sys.stderr, "isatty", lambda: False)
    assert p._mode(False) == "log" and not p.bars(True)
    monkeypatch.setattr(p.sys.stderr, "isatty", lambda: True)
    assert p._mode(False) == "bar" and p.bars(True) and not p.bars(False)
    monkeypatch.setenv("LTD_PROGRESS", "off")
    assert isinstance(p.progress(5), p._Off)
    assert p._mode(True) == "off"


def test_progress_iter_yields_every_item(monkeypatch):
    monkeypatch.setenv("LTD_PROGRESS", "off")
    assert list(p.progress_iter(range(5), desc="x")) == [0, 1, 2, 3, 4]
