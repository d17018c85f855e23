"""The repository's Python sources, read and parsed once per test session: the architecture, reference,
one-source and environment tests all walk the whole tree, and parsing ~300 files is most of their time."""
from __future__ import annotations

import ast
import io
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@cache
def text(path: Path) -> str:
    return Path(path).read_text()


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(text(path), str(path))


@cache
def comments(path: Path) -> tuple[tuple[int, str], ...]:
    """(line, text) of every ``#`` comment of a Python file."""
    return tuple((tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text(path)).readline)
                 if tok.type == tokenize.COMMENT)


def python_files(*tops: str) -> list[Path]:
    """Every ``*.py`` under the given top-level folders (or the file itself), sorted."""
    out = []
    for top in tops:
        p = ROOT / top
        out += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return out
