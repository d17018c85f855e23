"""Progress output, one place for all of it: a tqdm bar on a terminal; elsewhere (a log file, CI, a
pipe) one log line every ``interval`` seconds and one at the end, instead of hundreds of redrawn bars.

    with progress(total=n, desc="image features", unit="img") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))

``LTD_PROGRESS=bar|log|off`` overrides the choice (``log`` also takes ``LTD_PROGRESS_INTERVAL`` seconds).
``pace=False`` leaves out the counter's own rate and time left, for a caller that knows better (runs
that go several at a time finish in bursts) and puts its own estimate in the postfix.
"""
from __future__ import annotations

import logging
import sys
import time

from tqdm.auto import tqdm

from training.env import environment

log = logging.getLogger("ltd.progress")


def _mode(disable: bool) -> str:
    if disable:
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


def bars(show: bool) -> bool:
    """Whether a library's own tqdm bar (sentence-transformers' encode, …) should be shown."""
    return _mode(not show) == "bar"


def progress(total: int | None = None, *, desc: str = "", unit: str = "it", initial: int = 0, disable: bool = False,
             leave: bool = True, pace: bool = True):
    """A progress counter (see the module doc): tqdm on a terminal, periodic log lines otherwise."""
    mode = _mode(disable)
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
