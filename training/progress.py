"""Progress output, one place for all of it: a tqdm bar on a terminal; elsewhere (a log file, CI, a
pipe) one log line every ``interval`` seconds and one at the end, instead of hundreds of redrawn bars.

    with progress(total=n, desc="image features", unit="img") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))

``LTD_PROGRESS=bar|log|off`` overrides the choice (``log`` also takes ``LTD_PROGRESS_INTERVAL`` seconds).
``pace=False`` leaves out the counter's own rate and time left, for a caller that knows better (runs
that go several at a time finish in bursts) and puts its own estimate in the postfix.

Whether progress is shown at all is a display setting of the whole process, read here, not a
parameter handed down the call stack: ``set_progress(False)`` turns it off (a data-parallel rank other
than the main one does, ``training.distributed``), and ``with quiet():`` turns it off for a block and
restores it after (blocks nest; a grid job, a training run's validation). It is module state behind a
lock, not a context variable, so worker threads see it: a quiet block silences the counters every
thread starts while it lasts (counters already running go on). Child processes (data-parallel ranks,
grid jobs, local Ray workers) do not share it; they inherit the environment, and ``LTD_PROGRESS=off``
there is read here like any other value: ``quiet_everywhere()`` sets both for its block, which is what
``--no-progress`` does for the whole command (``app.cli.parser``).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

from training.env import environment, exported

log = logging.getLogger("ltd.progress")


_lock = threading.Lock()
_enabled = True  # set_progress
_quiet = 0  # open quiet() blocks, every thread's


def progress_enabled() -> bool:
    """Whether progress is shown now: not turned off by ``set_progress`` or an open ``quiet()`` block."""
    with _lock:
        return _enabled and not _quiet


def set_progress(enabled: bool) -> None:
    """Show progress (the default) or not, for the whole process."""
    global _enabled
    with _lock:
        _enabled = enabled


@contextmanager
def quiet() -> Iterator[None]:
    """No progress output while the block runs (in any thread); the setting comes back after it."""
    global _quiet
    with _lock:
        _quiet += 1
    try:
        yield
    finally:
        with _lock:
            _quiet -= 1


@contextmanager
def quiet_everywhere() -> Iterator[None]:
    """``quiet()`` here, and ``LTD_PROGRESS=off`` for the processes started in the block (``--no-progress``)."""
    with quiet(), exported(progress="off"):
        yield


def _mode() -> str:
    if not progress_enabled():
        return "off"
    return environment().progress or ("bar" if sys.stderr.isatty() else "log")


class LogProgress:
    """tqdm's counting interface (update, set_postfix, close, context manager) that writes lines."""

    def __init__(self, total: int | None = None, initial: int = 0, desc: str = "", unit: str = "it",
                 interval: float | None = None, pace: bool = True):
        self.total, self.n, self.desc, self.unit, self.pace = total, initial, desc, unit, pace
        self.interval = interval if interval is not None else environment().progress_interval
        self.start = self.last = time.monotonic()
        self.start_n = initial
        self.postfix = ""
        self.closed = False

    def _line(self) -> str:
        elapsed = time.monotonic() - self.start
        rate = (self.n - self.start_n) / elapsed if elapsed > 0 else 0.0
        done = f"{self.n:,}" + (f"/{self.total:,} ({100 * self.n / self.total:.0f} %)" if self.total else "")
        if not self.pace:
            return f"{self.desc}: {done} {self.unit} in {duration(elapsed)}{self.postfix}"
        eta = f", ~{duration((self.total - self.n) / rate)} left" if self.total and rate > 0 and self.n < self.total else ""
        # slow items (a grid's runs: minutes each) read better as time per item than as 0.0 a second
        pace = f"{rate:.1f} {self.unit}/s" if rate >= 0.1 or rate == 0 else f"{duration(1 / rate)}/{self.unit}"
        return f"{self.desc}: {done} {self.unit} in {duration(elapsed)} ({pace}{eta}){self.postfix}"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            log.info(self._line())

    def set_postfix(self, **kv) -> None:
        self.postfix = ", " + ", ".join(f"{k}={v}" for k, v in kv.items()) if kv else ""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            log.info(self._line())

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def duration(seconds: float) -> str:
    """``"42 s"``, ``"17 min"`` or ``"3.4 h"``: a time a person reads at a glance."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Off(LogProgress):
    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        self.closed = True


def bars() -> bool:
    """Whether a library's own tqdm bar (sentence-transformers' encode, …) should be shown."""
    return _mode() == "bar"


def progress(total: int | None = None, *, desc: str = "", unit: str = "it", initial: int = 0, disable: bool = False,
             leave: bool = True, pace: bool = True):
    """A progress counter (see the module doc): tqdm on a terminal, periodic log lines otherwise.
    ``disable`` turns this one off (a counter too short to be worth a line), whatever the setting."""
    mode = "off" if disable else _mode()
    if mode == "bar":
        fmt = None if pace else "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave, bar_format=fmt)
    if mode == "off":
        return _Off(total, initial, desc, unit)
    return LogProgress(total, initial, desc, unit, pace=pace)


def progress_iter(iterable, *, total: int | None = None, desc: str = "", unit: str = "it", disable: bool = False):
    """Iterate with progress (one update per item)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    with progress(total, desc=desc, unit=unit, disable=disable) as bar:
        for item in iterable:
            yield item
            bar.update(1)
