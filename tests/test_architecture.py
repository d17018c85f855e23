"""The shape DESIGN.md promises, checked on the source: which package may import which, and files
and functions short enough to read.

    training ← indexer ← search ← app        ui ← (search; handed the service by app)

Parsed with ``ast`` (imports inside functions count too); a violation names the file and line.
Also: library modules import at their top (a short, commented list of lazy exceptions), and the
CLI's lazy imports each keep something heavy out of `ltd --help`.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
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


# ---- imports at the top -------------------------------------------------------------------------
# A library module imports at its top, so a reader sees its dependencies and a missing one fails at
# import. An import inside a function is allowed only where it buys something, here and with a comment
# at the import itself. (file, imported top-level package) → why it is lazy:
LAZY_IMPORTS = {
    # optional extras: the module must load where they are absent
    ("training/models/backbones.py", "torchvision"): "optional; no torchvision build matches torch 2.13 here",
    ("training/models/runtimes.py", "onnxruntime"): "optional extra .[fast]",
    ("training/models/runtimes.py", "openvino"): "optional extra .[fast]",
    ("training/models/text_runtimes.py", "openvino"): "optional extra .[fast]",
    ("indexer/caption_metrics.py", "pycocoevalcap"): "optional extra .[caption]",
    ("indexer/ray_engine.py", "ray"): "optional extra .[ray]",
    # seconds to import (python -X importtime), for one code path only
    ("training/models/clip.py", "transformers"): "CLIP classes ~3 s; CLIP models only",
    ("training/targets.py", "sentence_transformers"): "~5 s (loads transformers); frozen sentence models only",
    ("training/targets.py", "transformers"): "its logging, beside sentence_transformers",
    ("training/packaged_models.py", "sentence_transformers"): "~5 s; building the GloVe-mean model only",
    ("training/data/shortcuts.py", "sklearn"): "~1.2 s; the digits shortcut only",
    ("app/api/main.py", "gradio"): "~4 s; a server with the UI only (settings.ui)",
    ("app/api/main.py", "ui"): "the UI package imports gradio at its top",
    # a Ray actor reports its start-up time, which must include loading torch and the model code
    ("indexer/ray_engine.py", "torch"): "actor start-up",
    ("indexer/ray_engine.py", "indexer"): "actor start-up",
    ("indexer/ray_engine.py", "training"): "actor start-up",
}
CLI = "app/cli/"  # lazy on purpose, for `ltd --help` start-up time: checked by the next two tests


def _function_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(imported module, line) of every import statement inside a function (nested ones once)."""
    seen: dict[int, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        seen.setdefault(node.lineno, a.name)
                elif isinstance(node, ast.ImportFrom):
                    seen.setdefault(node.lineno, "." * node.level + (node.module or ""))
    return sorted(((m, line) for line, m in seen.items()), key=lambda x: x[1])


def test_library_modules_import_at_the_top():
    bad, used = [], set()
    for path in _sources(*PACKAGES):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(CLI):
            continue
        for module, line in _function_imports(ast.parse(path.read_text(), rel)):
            key = (rel, module.split(".")[0])
            if key in LAZY_IMPORTS:
                used.add(key)
            else:
                bad.append(f"{rel}:{line} imports {module} inside a function")
    stale = [f"{f} → {m}" for f, m in sorted(set(LAZY_IMPORTS) - used)]
    assert not bad, "move these imports to the top of the module (or justify them in LAZY_IMPORTS):\n" + "\n".join(bad)
    assert not stale, "LAZY_IMPORTS entries that match no import any more:\n" + "\n".join(stale)


def test_the_import_checker_sees_what_it_must():
    tree = ast.parse("import os\ndef f():\n    import torch\n    def g():\n        from .x import y\n"
                     "class C:\n    def m(self):\n        from a.b import c\n")
    assert _function_imports(tree) == [("torch", 3), (".x", 5), ("a.b", 8)]


def _loaded_by_cli_help() -> set[str]:
    code = "import sys; import app.cli.parser; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return set(out.stdout.split())


def test_cli_start_up_loads_no_heavy_library():
    """`ltd --help` builds every subcommand's parser; it stays quick (~25 ms of imports) because no
    subcommand module imports torch, numpy, faiss or the web stack at its top."""
    heavy = {"torch", "numpy", "faiss", "PIL", "transformers", "sentence_transformers", "fastapi", "gradio", "uvicorn",
             "matplotlib", "pydantic", "yaml"}
    assert not heavy & _loaded_by_cli_help()


def test_cli_lazy_imports_defer_something():
    """A lazy import in app/cli must defer a module that `ltd --help` does not load anyway."""
    loaded, bad = _loaded_by_cli_help(), []
    for path in _sources(CLI.rstrip("/")):
        rel = path.relative_to(ROOT).as_posix()
        for module, line in _function_imports(ast.parse(path.read_text(), rel)):
            if module in loaded:
                bad.append(f"{rel}:{line} imports {module} inside a function, but `ltd --help` loads it already")
    assert not bad, "\n".join(bad)
