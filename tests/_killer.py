"""Crashes as real kills: a script that SIGKILLs itself just before its N-th file-system call.

``killer_script(calls, body)`` is a Python script: ``body`` runs with the ``os`` functions named in
``calls`` wrapped to count, and the process kills itself (SIGKILL: no ``finally``, no ``atexit``, no
flush) just before the call whose number is the script's first argument; 0 never kills, so a run with
0 counts the calls there are. ``body`` reads its own arguments from ``sys.argv[2:]`` and finds the
count so far in ``count``. A test runs it once with 0, then once per N, and checks what each kill
left on disk.
"""
from __future__ import annotations

import textwrap

PREAMBLE = '''\
import os, signal, sys

kill_at, count = int(sys.argv[1]), 0


def counted(fn):
    def wrapper(*a, **k):
        global count
        count += 1
        if count == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*a, **k)
    return wrapper


for name in {calls!r}:
    setattr(os, name, counted(getattr(os, name)))
'''


def killer_script(calls: tuple[str, ...], body: str) -> str:
    """The preamble that counts ``calls`` (names of ``os`` functions) and kills at argv[1], then ``body``."""
    return PREAMBLE.format(calls=tuple(calls)) + "\n" + textwrap.dedent(body).lstrip("\n")
