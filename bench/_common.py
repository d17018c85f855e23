"""Shared by the benchmark scripts: printing a result and replacing its BENCHMARKS.md section."""
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


def publish(section: str, text: str, write: bool, path: Path = BENCHMARKS) -> None:
    """Print a bench's rendered ``text``; with ``write`` (its ``--write``) it also replaces ``section``."""
    print(text)
    if write:
        replace_section(section, text, path)


def read_section(section: str, path: Path = BENCHMARKS) -> str | None:
    """The ``## …`` section whose heading line is `section` (to the next ``## `` heading), or None."""
    cur = path.read_text() if path.exists() else ""
    m = re.search(r"^" + re.escape(section) + r"\n.*?(?=^## |\Z)", cur, re.S | re.M)
    return m.group(0).rstrip("\n") + "\n" if m else None


# ---- sections several runs share -------------------------------------------------------------------
# One subsystem measured on several machines gets one section: a table with one column per machine
# (and precision) and one block per run with its machine, date and command. Each run owns its columns
# and its block, found by their HTML comment markers, and rewrites only those.
def markers(key: str) -> tuple[str, str]:
    return f"<!-- {key} -->", f"<!-- /{key} -->"


def replace_marked(text: str, key: str, body: str, *, append: bool = True) -> str:
    """``text`` with the block between ``key``'s markers replaced by ``body`` (the markers stay); a
    missing block is appended to the end of ``text`` when ``append``, else it is an error."""
    start, end = markers(key)
    block = f"{start}\n{body.strip(chr(10))}\n{end}"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        if not append:
            raise ValueError(f"no {start} … {end} block")
        return text.rstrip("\n") + "\n\n" + block + "\n"
    return text[:i] + block + text[j + len(end):]


def marked(text: str, key: str) -> str | None:
    """The text between ``key``'s markers, or None."""
    start, end = markers(key)
    i, j = text.find(start), text.find(end)
    return text[i + len(start):j].strip("\n") if 0 <= i < j else None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def set_columns(table: str, columns: dict[str, dict[str, str]], *, rows: list[str], order=None) -> str:
    """A markdown table (first column: row names) with ``columns`` (name → row name → cell) set: a
    column is replaced whole (its rows not given become empty), other columns are kept as they are;
    rows follow ``rows`` (unknown ones after, in their order) and a row left empty everywhere goes;
    ``order`` (a sort key on column names) places a new column among the others."""
    lines = [ln for ln in table.strip().splitlines() if ln.startswith("|")]
    head = _cells(lines[0])[1:] if lines else []
    table_rows = {(c := _cells(ln))[0]: dict(zip(head, c[1:])) for ln in lines[2:]}
    names = head + [c for c in columns if c not in head]
    if order is not None:
        names = sorted(names, key=order)
    for name, cells in columns.items():
        for r in set(table_rows) | set(cells):
            table_rows.setdefault(r, {})[name] = cells.get(r, "")
    rank = {r: i for i, r in enumerate(rows)}
    kept = sorted((r for r, cells in table_rows.items() if any(cells.get(c) for c in names)),
                  key=lambda r: rank.get(r, len(rank)))
    out = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    out += ["| " + " | ".join([r, *(table_rows[r].get(c, "") for c in names)]) + " |" for r in kept]
    return "\n".join(out)
