"""The shape the README promises ("Architecture: where things are"), checked on the source: which
package may import which, and files and functions short enough to read.

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
import sources

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
            for name, line in _imported_packages(sources.tree(path)):
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
        text = sources.text(path)
        n = len(text.splitlines())
        if n > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(sources.tree(path)):
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
    ("indexer/caption_metrics.py", "pycocoevalcap"): "optional extra .[caption]",
    ("indexer/ray_engine.py", "ray"): "optional extra .[ray]",
    # seconds to import (python -X importtime), for one code path only
    ("training/models/clip.py", "transformers"): "CLIP classes ~3 s; CLIP models only",
    ("training/models/hf_towers.py", "transformers"): "SigLIP / text tower classes ~3 s; those towers only",
    ("training/models/tower_files.py", "transformers"): "AutoTokenizer ~2 s; pretrained towers only",
    ("training/models/open_clip_text.py", "ftfy"): "optional (extra towers): open_clip's text repair",
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
        for module, line in _function_imports(sources.tree(path)):
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
        for module, line in _function_imports(sources.tree(path)):
            if module in loaded:
                bad.append(f"{rel}:{line} imports {module} inside a function, but `ltd --help` loads it already")
    assert not bad, "\n".join(bad)


# ---- docstrings: the contract of every public function of the service layers ---------------------
DOCUMENTED = ("search", "app/api")
DOCSTRINGS_PENDING: set[str] = set()  # files exempt for now (none)


def _undocumented(tree: ast.Module, classes: bool) -> list[tuple[int, str]]:
    """(line, name) of each public module-level function, class method (and, with ``classes``, class)
    without a docstring of at least a few words."""
    def short(node) -> bool:
        return len((ast.get_docstring(node) or "").split()) < 4

    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_") and short(node):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            if classes and short(node):
                out.append((node.lineno, f"class {node.name}"))
            out += [(m.lineno, f"{node.name}.{m.name}") for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_") and short(m)]
    return out


def test_public_functions_of_search_and_api_say_what_they_are_for():
    """What each takes, what it raises, whether it may be called from many threads: a docstring on every
    public function and method of search/ and app/api/, and every public class of search/ (the API's
    schemas are documented field by field for the OpenAPI document instead)."""
    bad = []
    for path in _sources(*DOCUMENTED):
        rel = path.relative_to(ROOT).as_posix()
        if rel in DOCSTRINGS_PENDING:
            continue
        tree = sources.tree(path)
        bad += [f"{rel}:{line} {name}" for line, name in _undocumented(tree, classes=rel.startswith("search/"))]
    assert not bad, "public functions without a docstring:\n" + "\n".join(bad)


def test_the_docstring_checker_sees_what_it_must():
    tree = ast.parse('def f():\n    pass\ndef _g():\n    pass\nclass C:\n    def m(self):\n        """Does x."""\n'
                     '    def n(self):\n        """Does the n thing well."""\n')
    assert _undocumented(tree, classes=True) == [(1, "f"), (5, "class C"), (6, "C.m")]


# ---- values threaded through the call stack (issue 54) -------------------------------------------
# Ceilings that only go down: functions with more than MAX_PARAMS parameters (none outside app/cli, whose
# command functions mirror their flags; a Gradio callback with more inputs takes them as a set, one dict), and
# the signatures that thread `show_progress` or `device` by hand. A new long signature wants a dataclass of
# options (an IndexRequest, an ExtractionSpec), a new flag a process setting (see docs/architecture.md).
# Progress and the compute device are process settings (training/progress.py, training/device.py), so
# no signature takes `show_progress`. Three take a `device` because it is their subject, not a value
# passed along: `training.device.to_device(x, device)` puts a batch where a given model already is (a
# model's place is a fact about it, which the setting does not override), and two pure questions about
# a named device: `training.distributed.backend_for(device)` (gloo or NCCL) and
# `training.data.gpu_decode.unavailable(device)` (why JPEGs cannot be decoded there).
MAX_PARAMS = 7
CEILINGS = {"long_signatures": 0, "show_progress": 0, "device": 3}


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def threaded_values(paths: list[Path]) -> dict[str, list[str]]:
    """Per ceiling, the functions that count against it (``file:line name``)."""
    out: dict[str, list[str]] = {k: [] for k in CEILINGS}
    for path in paths:
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        for node in ast.walk(sources.tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names, where = _parameters(node), f"{rel}:{node.lineno} {node.name}"
                if len(names) > MAX_PARAMS and not rel.startswith(CLI):
                    out["long_signatures"].append(where)
                for flag in ("show_progress", "device"):
                    if flag in names:
                        out[flag].append(where)
    return out


def test_threaded_values_do_not_grow():
    found = threaded_values(_sources(*PACKAGES))
    over = {k: v for k, v in found.items() if len(v) > CEILINGS[k]}
    assert not over, "\n".join(f"{k}: {len(v)} > {CEILINGS[k]}\n  " + "\n  ".join(v) for k, v in over.items())


def test_the_signature_counter_sees_what_it_must(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class C:\n    def m(self, a, b, c, d, e, f, *, show_progress=True): ...\n"
                   "def f(a, b, c, d, e, f, g, h, device='cpu'): ...\nasync def g(*, device): ...\n")
    found = threaded_values([src])
    assert [w.split()[1] for w in found["long_signatures"]] == ["f"]  # m has 7 without self: at the limit
    assert [w.split()[1] for w in found["show_progress"]] == ["m"]
    assert sorted(w.split()[1] for w in found["device"]) == ["f", "g"]
