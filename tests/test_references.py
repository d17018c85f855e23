"""Every repository path, module and symbol that prose names exists.

Readers trust a docstring that says "see ``indexer/index.py``" because the rest of the tree is accurate;
a rename that leaves it behind sends them nowhere. This test reads the prose — module, class and function
docstrings and ``#`` comments of every Python file, the README, the guides (docs/guides/*.md), the
Makefile and the other build files' comments — and resolves what it names:

- a repository path (``indexer/index.py``, ``ui/tabs/``, ``configs/*.yaml``), optionally with a symbol
  (``search/word_usage.py::occlusion_table``): the file or folder exists (a glob matches something), the
  symbol is defined in it;
- a dotted module path (``indexer.index.IndexDir``): the module exists and defines the name (a class
  member too, when it goes one level further);
- a bare file name (``prom.py``): a file of that name exists somewhere in the tree;
- a function of ours written as a call in backticks (```load_config()```, a snake_case name): a function,
  class or parameter of that name is defined somewhere in the tree.

What it cannot see: a reference to something that exists but is the wrong thing. The tests at the bottom
plant a dangling reference of each kind and check that it is caught.
"""
from __future__ import annotations

import ast
import os
import re
from functools import cache
from pathlib import Path

import pytest
import sources
from fastapi import FastAPI

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "indexer", "search", "app", "ui", "bench", "tests", "configs")
TOP_DIRS = (*PACKAGES, "docs", "grids", "docker", ".ci")
PY_SOURCES = ("training", "indexer", "search", "app", "ui", "bench", "tests", "docs/hooks.py", "docker")
PROSE_FILES = ("README.md", "docs/*.md", "docs/guides/*.md", "Makefile", "pyproject.toml", "mkdocs.yml", "Dockerfile",
               "docker/*.sh", ".ci/*")
# Records of what ran: they also name other repositories' files (a paper's training configs) and one-off scripts
# run once, so only their repository paths and modules are checked, not bare file names.
RECORDS = ("RESULTS.md", "BENCHMARKS.md", "docs/results/LOG.md")
# ``app`` is also what every FastAPI application object is called: ``app.state``, ``app.include_router``
# in prose are the object's attributes, not modules of the package.
FASTAPI_APP_ATTRIBUTES = set(dir(FastAPI)) | set(vars(FastAPI()))

_TOP = "|".join(re.escape(t) for t in TOP_DIRS)
PATH_RE = re.compile(rf"(?<![\w./~$=-])((?:{_TOP})/[\w./*<>{{}}-]*)(?:::(\w+))?")
MODULE_RE = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")
FILE_RE = re.compile(r"(?<![\w./~$-])([A-Za-z_][\w-]*\.(?:py|yaml|md|toml|sh))(?![\w/])")
CALL_RE = re.compile(r"`{1,2}([a-z][a-z0-9]*_[a-z0-9_]+)\([^`]*\)`{1,2}")  # a snake_case call, not dotted
# Library methods prose names without their object (``state_dict()`` of a torch module).
LIBRARY_METHODS = {"state_dict", "load_state_dict", "from_pretrained", "save_pretrained", "model_validate",
                   "model_dump", "mount_gradio_app", "include_router"}
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "toml", "sh", "txt", "css", "jsonl", "pt", "npy", "faiss", "png"}
TOP_LEVEL_DOMAINS = {"org", "com", "net", "io", "dev", "local", "internal"}  # search.example.org is a host
# Capitalised stand-ins in prose: grids/NAME.yaml, GRID.yaml, OTHER.md.
PLACEHOLDERS = {"NAME", "GRID", "OTHER", "X", "N", "FILE", "RUN", "DIR"}


# ---- what prose there is ------------------------------------------------------------------------------
def _parsed(path: Path) -> tuple[str, ast.Module]:
    return sources.text(path), sources.tree(path)


def _scopes(tree: ast.AST):
    """The module, then every class and function in it (statements only: expressions are not walked)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack += [c for c in getattr(node, field, ()) if isinstance(c, (ast.stmt, ast.excepthandler))]


def _python_prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each docstring and comment of a Python file."""
    out = list(sources.comments(path))
    tree = sources.tree(path)
    for node in _scopes(tree):
        doc = ast.get_docstring(node, clean=False)
        if doc:
            out.append((node.body[0].lineno, doc))
    return out


def _plain_prose(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text().splitlines()
    if path.suffix == ".md":
        return list(enumerate(lines, 1))
    # build files: only their comments are prose
    return [(i, line[line.index("#"):]) for i, line in enumerate(lines, 1) if "#" in line]


def prose_sources() -> list[Path]:
    """Every file whose prose is checked (records included)."""
    files = {ROOT / r for r in RECORDS}
    for top in PY_SOURCES:
        p = ROOT / top
        files |= {p} if p.is_file() else set(p.rglob("*.py"))
    for pattern in PROSE_FILES:
        files |= {p for p in ROOT.glob(pattern) if p.is_file()}
    return sorted(files)


# ---- what exists --------------------------------------------------------------------------------------
@cache
def _tree_files() -> tuple[frozenset[str], frozenset[str]]:
    """(every relative path, every file name) in the tree, outside caches and the venv."""
    skip = {".git", ".venv", "__pycache__", "site", ".pytest_cache", ".ruff_cache", "node_modules", "artifacts"}
    rels, names = set(), set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        base = Path(folder).relative_to(ROOT)
        for name in dirs + files:
            rels.add((base / name).as_posix())
            names.add(name)
    return frozenset(rels), frozenset(names)


@cache
def _module_names(path: Path) -> dict[str, ast.AST | None]:
    """Top-level names a module defines (functions, classes, assignments, imports) → their node."""
    names: dict[str, ast.AST | None] = {}
    for node in _parsed(path)[1].body:
        _bind(node, names)
    return names


def _bind(node: ast.AST, names: dict[str, ast.AST | None]) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names[node.name] = node
    elif isinstance(node, ast.Assign):
        for t in node.targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    names[n.id] = None
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        names[node.target.id] = None
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for a in node.names:
            names[(a.asname or a.name).split(".")[0]] = None
    elif isinstance(node, (ast.If, ast.Try, ast.With)):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                _bind(child, names)
        for h in getattr(node, "handlers", []):
            for child in h.body:
                _bind(child, names)


def _class_names(node: ast.ClassDef) -> set[str]:
    names: dict[str, ast.AST | None] = {}
    for child in node.body:
        _bind(child, names)
    return set(names)


@cache
def _defined_anywhere() -> frozenset[str]:
    """Every function, class, method and parameter name in the tree's Python files."""
    out = set()
    for top in PY_SOURCES:
        p = ROOT / top
        for f in ({p} if p.is_file() else p.rglob("*.py")):
            for node in _scopes(_parsed(f)[1]):
                if not isinstance(node, ast.Module):
                    out.add(node.name)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # ``on_loaded(entry)``: a parameter
                    a = node.args
                    out |= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x}
    return frozenset(out)


def _module_file(dotted: str) -> Path | None:
    base = ROOT / dotted.replace(".", "/")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _resolve_symbol(module: Path, parts: list[str]) -> str | None:
    """None when ``parts`` (a name, then maybe a member) resolve in ``module``, else what is missing."""
    names = _module_names(module)
    if parts[0] not in names:
        return parts[0]
    node = names[parts[0]]
    if len(parts) > 1 and isinstance(node, ast.ClassDef) and parts[1] not in _class_names(node):
        return f"{parts[0]}.{parts[1]}"
    return None


def _check_path(raw: str, symbol: str | None) -> str | None:
    path = raw.rstrip(".,:;)")
    for stop in "<{":  # placeholders: runs/<name>/…, {a,b}: the part before them must exist
        path = path.split(stop)[0]
    path = path.rstrip("/")
    if Path(path).stem in PLACEHOLDERS:
        path = Path(path).parent.as_posix()
    rels, _ = _tree_files()
    if "*" in path:
        if not any(ROOT.glob(path)):
            return f"{raw} (matches nothing)"
        return None
    if path not in rels:
        if f"{path}.py" in rels:  # ``training/fsio``: the module, written as a path
            return None
        head, _, name = path.rpartition("/")
        if "." in name and not name.endswith(".py") and f"{head}/{name.split('.')[0]}.py" in rels:
            return _check_module(path.replace("/", "."))  # ``bench/_common.replace_section``
        return f"{path} (no such file or folder)"
    if symbol and path.endswith(".py"):
        missing = _resolve_symbol(ROOT / path, [symbol])
        if missing:
            return f"{path}::{symbol} (not defined there)"
    return None


def _check_module(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[-1] in FILE_SUFFIXES | TOP_LEVEL_DOMAINS:  # ``search.py``: a file name, checked as one
        return None
    if parts[0] == "app" and parts[1] in FASTAPI_APP_ATTRIBUTES:
        return None
    for i in range(len(parts), 0, -1):
        module = _module_file(".".join(parts[:i]))
        if module is None:
            continue
        if i == len(parts):
            return None
        missing = _resolve_symbol(module, parts[i:])
        return f"{dotted} ({'.'.join(parts[:i])} has no {missing})" if missing else None
    return f"{dotted} (no such module)"


def _check_call(name: str) -> str | None:
    if name in _defined_anywhere() or name in LIBRARY_METHODS:
        return None
    return f"{name}() (defined nowhere in the tree)"


def dangling(text: str, *, bare_names: bool = True) -> list[str]:
    """What ``text`` names that does not exist, one line each (``bare_names``: file names without a
    folder too)."""
    out = []
    for m in PATH_RE.finditer(text):
        out.append(_check_path(m.group(1), m.group(2)))
    for m in MODULE_RE.finditer(text):
        out.append(_check_module(m.group(1).rstrip(".")))
    _, names = _tree_files()
    for m in FILE_RE.finditer(text) if bare_names else ():
        if m.group(1) not in names and m.group(1).split(".")[0] not in PLACEHOLDERS:
            out.append(f"{m.group(1)} (no file of that name)")
    for m in CALL_RE.finditer(text):
        out.append(_check_call(m.group(1)))
    return [x for x in out if x]


def test_every_reference_resolves():
    bad = []
    for path in prose_sources():
        rel = path.relative_to(ROOT).as_posix()
        chunks = _python_prose(path) if path.suffix == ".py" else _plain_prose(path)
        for line, text in chunks:
            bad += [f"{rel}:{line}: {d}" for d in dangling(text, bare_names=rel not in RECORDS)]
    assert not bad, "prose names what does not exist:\n" + "\n".join(bad)


# ---- the checker catches what it must ----------------------------------------------------------------
@pytest.mark.parametrize("planted", [
    "the UI is built by ui/blocks.py",                      # a path
    "see ``search/word_usage.py::no_such_function``",       # a symbol in a path
    "``ui.blocks.build_ui(service)``",                      # a module
    "``indexer.index.no_such_name``",                       # a module's name
    "``training.config.RunConfig.no_such_field``",          # a class member
    "request counters from prom_v0.py",                     # a bare file name
    "call ``build_everything_please()``",                   # a call
    "one per file under configs/nothing_*.yaml",            # a glob
])
def test_a_planted_dangling_reference_is_caught(planted):
    assert dangling(planted), planted


@pytest.mark.parametrize("fine", [
    "the UI is built by ui/app.py (``ui.app.build_ui``), REST in app/api/routers/",
    "``training.config.load_config`` and ``search/word_usage.py::occlusion_table``, training/fsio",
    "runs/<name>/best.pt, configs/*.yaml, grids/NAME.yaml; app.state holds the registry; ``load_config()``",
    "bench/_common.replace_section; search.example.org; ``torch.load()``, ``len()``",
])
def test_existing_references_pass(fine):
    assert dangling(fine) == []


def test_a_planted_reference_in_a_source_file_fails_the_scan(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Loads models (see indexer/gone.py)."""\nx = 1  # and ``search.nothing``\n')
    found = [d for _, t in _python_prose(src) for d in dangling(t)]
    assert any("indexer/gone.py" in d for d in found) and any("search.nothing" in d for d in found)
