"""Shared by the benchmark scripts: BENCHMARKS.md section replacement."""
from __future__ import annotations

import re
from pathlib import Path

from training.fsio import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"


def replace_section(section: str, text: str, path: Path = BENCHMARKS) -> None:
    """Replace the ``## …`` section whose heading line is `section` by `text` (appended when absent).

    The section runs to the next ``## `` heading; ``### `` subsections belong to it. The file is
    written through a temp file and renamed, so an interrupted bench never leaves it half-written.
    """
    cur = path.read_text() if path.exists() else "# Benchmarks\n"
    pat = re.compile(r"^" + re.escape(section) + r"\n.*?(?=^## |\Z)", re.S | re.M)
    body = text.rstrip("\n") + "\n"
    new = pat.sub(lambda _: body + "\n", cur, count=1) if pat.search(cur) else cur.rstrip("\n") + "\n\n" + body
    atomic_write_text(path, new.rstrip("\n") + "\n")
