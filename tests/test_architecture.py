"""The shape DESIGN.md promises, checked on the source: which package may import which, and files
and functions short enough to read.

    training ← indexer ← search ← app        ui ← (search; handed the service by app)

Parsed with ``ast`` (imports inside functions count too); a violation names the file and line.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "indexer", "search", "app", "ui")
FORBIDDEN = {  # package → packages it must never import
    "training": {"indexer", "search", "app", "ui"},
    "indexer": {"search", "app", "ui"},
    "search": {"app", "ui"},
    "ui": {"app", "training"},
}
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources(*tops: str) -> list[Path]:
    return sorted(p for t in tops for p in (ROOT / t).rglob("*.py"))


def _imported_packages(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module.split(".")[0], node.lineno))
    return out


def test_imports_flow_one_way():
    bad = []
    for pkg, banned in FORBIDDEN.items():
        for path in _sources(pkg):
            for name, line in _imported_packages(ast.parse(path.read_text(), str(path))):
                if name in banned:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from app.api.main import create_app\nimport training.config\n")
    assert sorted(_imported_packages(tree)) == [("app", 2), ("training", 3)]


@pytest.mark.parametrize("top", [*PACKAGES, "bench"])
def test_files_and_functions_are_short(top):
    long_files, long_functions = [], []
    for path in _sources(top):
        text = path.read_text()
        n = len(text.splitlines())
        if n > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)
