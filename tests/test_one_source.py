"""One source for each rule, checked on the source: a second copy of a rule drifts from the first (the
request limits did: the OpenAPI document said 1,000 while the server allowed another value).

- file digests: ``training.fsio.sha256_file`` (``hashlib.file_digest``, no cache that a rewritten file
  could outlive);
- the Hugging Face environment: ``training/hf_env.py``;
- the text a model encoded for a caption: ``indexer.caption_texts.model_texts``;
- the request limits: the fields of ``search.SearchConfig`` (tests/test_request_limits.py checks that the
  REST schema and the UI follow them, and that the schema cleans queries with the service's
  ``search.encoding.clean_query``);
- ``LTD_*`` variables: tests/test_environment.py.
"""
from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

import sources

from app.api.settings import Settings
from search import SearchConfig
from training.fsio import sha256_file

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("training", "indexer", "search", "app", "ui")


def _sources(*tops: str) -> list[tuple[str, str, Path]]:
    return [(p.relative_to(ROOT).as_posix(), sources.text(p), p) for p in sources.python_files(*tops)]


def _own_nodes(fn: ast.AST):
    """The nodes of a function's body, not those of functions defined inside it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack += ast.iter_child_nodes(node)


def _hashes_a_file(fn: ast.AST) -> bool:
    """A function that both opens/reads a file and feeds a hashlib object (a file digest of its own)."""
    calls = [n for n in _own_nodes(fn) if isinstance(n, ast.Call)]
    names = {ast.unparse(c.func) for c in calls}
    hashes = any(n.startswith("hashlib.") for n in names)
    reads = any(n == "open" or n.endswith((".read_bytes", ".open")) for n in names)
    return hashes and reads


def test_files_are_hashed_by_one_helper():
    bad = []
    for rel, _, path in _sources(*LIBRARY, "bench"):
        if rel == "training/fsio.py":
            continue
        for node in ast.walk(sources.tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _hashes_a_file(node):
                bad.append(f"{rel}:{node.lineno} {node.name}")
    assert not bad, "hash files with training.fsio.sha256_file:\n" + "\n".join(bad)


def test_the_hash_checker_sees_a_hand_written_digest():
    code = ("def f(p):\n    h = hashlib.sha256()\n    with open(p, 'rb') as f:\n        h.update(f.read())\n"
            "    return h.hexdigest()\n")
    assert _hashes_a_file(ast.parse(code).body[0])


def test_the_digest_is_of_the_bytes_now(tmp_path):
    p = tmp_path / "w.bin"
    p.write_bytes(b"a" * 3_000_000)
    assert sha256_file(p) == hashlib.sha256(b"a" * 3_000_000).hexdigest()
    p.write_bytes(b"b" * 3_000_000)  # same path, same size, new bytes: a new digest (no cache by path)
    assert sha256_file(p) == hashlib.sha256(b"b" * 3_000_000).hexdigest()


def test_the_hugging_face_environment_is_set_in_one_place():
    pattern = re.compile(r"HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE|TOKENIZERS_PARALLELISM")
    bad = [rel for rel, text, _ in _sources(*LIBRARY, "bench", "tests") if rel != "training/hf_env.py"
           and rel != "tests/test_one_source.py" and pattern.search(text)]
    bad += [name for name in ("Makefile", "Dockerfile") if pattern.search((ROOT / name).read_text())]
    assert not bad, "set them with training.hf_env.set_hf_environment():\n" + "\n".join(bad)


def test_the_text_a_model_encoded_is_looked_up_in_one_place():
    bad = [rel for rel, text, _ in _sources(*LIBRARY, "bench") if rel != "indexer/caption_texts.py" and '"model_texts"' in text]
    assert not bad, "read caption texts as encoded with indexer.caption_texts.model_texts:\n" + "\n".join(bad)


def test_the_request_limits_are_declared_once():
    limits = {"max_k", "max_query_chars", "max_upload_bytes"}
    assert limits <= set(SearchConfig.model_fields)
    assert not limits & set(Settings.__dict__.get("__annotations__", {}))  # inherited, not declared again
    bad = [rel for rel, text, _ in _sources(*LIBRARY) if re.search(r"\bMAX_K\b|\bMAX_QUERY_CHARS\b|class UILimits", text)]
    assert not bad, bad

