"""Progress output: a bar on a terminal, a few log lines elsewhere (not hundreds of redrawn bars)."""
from __future__ import annotations

import argparse
import logging
import os
import threading

import pytest

from app.cli.parser import _process_settings
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
    assert lines[0].startswith("image features: 50/100 (50 %) img in 25 min (30 s/img, ~25 min left)")
    assert lines[1].startswith("image features: 100/100 (100 %) img in 33 min")


def test_log_lines_read_fast_items_per_second_and_slow_ones_as_time_each(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(p.time, "monotonic", lambda: now[0])
    fast = p.LogProgress(total=1000, desc="captions", unit="cap", interval=0)
    now[0] = 10.0
    fast.update(500)  # 50 a second: 10 s left
    assert fast._line() == "captions: 500/1,000 (50 %) cap in 10 s (50.0 cap/s, ~10 s left)"
    now[0] = 0.0
    slow = p.LogProgress(total=20, initial=2, desc="grid runs", unit="run", interval=0)
    now[0] = 3 * 3600.0
    slow.update(9)  # 9 trained in 3 h (the 2 a killed grid had finished do not count): 9 left, 3 h
    slow.set_postfix(last="baseline seed 3")
    assert slow._line() == "grid runs: 11/20 (55 %) run in 3.0 h (20 min/run, ~3.0 h left), last=baseline seed 3"
    assert [p.duration(x) for x in (0, 119, 120, 7199, 7200, 90000)] == ["0 s", "119 s", "2 min", "120 min", "2.0 h", "25.0 h"]


def test_mode_follows_the_terminal_and_the_override(monkeypatch):
    monkeypatch.delenv("LTD_PROGRESS", raising=False)
    monkeypatch.setattr(p.sys.stderr, "isatty", lambda: False)
    assert p._mode() == "log" and not p.bars()
    monkeypatch.setattr(p.sys.stderr, "isatty", lambda: True)
    assert p._mode() == "bar" and p.bars()
    assert isinstance(p.progress(5, disable=True), p._Off)
    monkeypatch.setenv("LTD_PROGRESS", "off")
    assert isinstance(p.progress(5), p._Off) and not p.bars()


def test_quiet_turns_progress_off_in_every_thread_until_the_last_block_ends(monkeypatch):
    monkeypatch.setenv("LTD_PROGRESS", "log")
    seen = []

    def other_thread():
        seen.append((p.progress_enabled(), type(p.progress(3))))

    with p.quiet():
        with p.quiet():  # nested: the outer block still holds
            pass
        assert not p.progress_enabled() and not p.bars() and isinstance(p.progress(3), p._Off)
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen == [(False, p._Off)]
    assert p.progress_enabled() and type(p.progress(3)) is p.LogProgress
    with pytest.raises(RuntimeError), p.quiet():  # an exception ends the block too
        raise RuntimeError
    assert p.progress_enabled()


def test_set_progress_is_the_process_default(monkeypatch):
    monkeypatch.setenv("LTD_PROGRESS", "log")
    try:
        p.set_progress(False)
        assert not p.progress_enabled() and isinstance(p.progress(3), p._Off)
    finally:
        p.set_progress(True)
    assert p.progress_enabled()


def test_progress_iter_yields_every_item(monkeypatch):
    monkeypatch.setenv("LTD_PROGRESS", "off")
    assert list(p.progress_iter(range(5), desc="x")) == [0, 1, 2, 3, 4]


def test_no_progress_quiets_the_command_and_the_processes_it_starts(monkeypatch):
    monkeypatch.setenv("LTD_PROGRESS", "log")
    with _process_settings(argparse.Namespace(no_progress=True)):
        assert not p.progress_enabled() and os.environ["LTD_PROGRESS"] == "off"
    assert p.progress_enabled() and os.environ["LTD_PROGRESS"] == "log"
    monkeypatch.delenv("LTD_PROGRESS")
    with _process_settings(argparse.Namespace(no_progress=False)):
        assert p.progress_enabled() and "LTD_PROGRESS" not in os.environ
    with p.quiet_everywhere():
        assert os.environ["LTD_PROGRESS"] == "off"
    assert "LTD_PROGRESS" not in os.environ
