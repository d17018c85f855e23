"""Shared fixtures: an isolated cache, small datasets written by the tests themselves, and the
real Flickr8k copy when LTD_DATA_DIR points at it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.hf_env import set_hf_environment

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
set_hf_environment()

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Feature/target caches of the tests never touch the user's ~/.cache/ltd, and the UI's uploads
    (Gradio's folder) go to one private folder of the session from the start."""
    old = {k: os.environ.get(k) for k in ("LTD_CACHE_DIR", "GRADIO_TEMP_DIR")}
    os.environ["LTD_CACHE_DIR"] = str(tmp_path_factory.mktemp("ltd_cache"))
    os.environ["GRADIO_TEMP_DIR"] = str(tmp_path_factory.mktemp("gradio_uploads"))
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def write_karpathy(root: Path, n_images: int = 6, *, name: str = "dataset_test.json", splits=None,
                   caps_per_image: int = 5, image_size: int = 48, with_images: bool = True, seed: int = 0,
                   filepath: str | None = None) -> Path:
    """A small Karpathy-format dataset with real JPEG files; returns the JSON path."""
    rng = np.random.default_rng(seed)
    splits = splits or (["train"] * (n_images - 2) + ["val", "test"])
    words = ["red", "blue", "dog", "cat", "runs", "sits", "on", "grass", "a", "big", "small", "car"]
    images = []
    sid = 0
    img_dir = root / (filepath if filepath is not None else "images")
    img_dir.mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        fn = f"img{i:03d}.jpg"
        if with_images:
            arr = (rng.random((image_size, image_size, 3)) * 255).astype(np.uint8)
            Image.fromarray(arr).save(img_dir / fn, quality=90)
        sents = []
        for _ in range(caps_per_image):
            toks = list(rng.choice(words, size=int(rng.integers(3, 8))))
            raw = " ".join(toks).capitalize() + " ."
            sents.append({"raw": raw, "tokens": toks, "imgid": i, "sentid": sid})
            sid += 1
        im = {"filename": fn, "imgid": i, "split": splits[i], "sentids": [s["sentid"] for s in sents], "sentences": sents}
        if filepath is not None:
            im["filepath"] = filepath
        images.append(im)
    path = root / name
    path.write_text(json.dumps({"dataset": "test", "images": images}))
    return path


@pytest.fixture
def no_outside_network():
    """Name resolution and connections to any host but loopback are refused and recorded (tests/netguard.py);
    the test fails if anything was attempted. Yields the list of attempts."""
    import netguard

    seen: list[str] = []
    undo = netguard.install(seen.append)
    try:
        yield seen
    finally:
        undo()
    assert not seen, f"the code under test tried to reach outside hosts: {seen}"


@pytest.fixture
def small_dataset(tmp_path) -> Path:
    return write_karpathy(tmp_path, 8)


def flickr8k_json() -> Path | None:
    d = os.environ.get("LTD_DATA_DIR")
    if not d:
        return None
    p = Path(d) / "dataset_flickr8k.json"
    return p if p.is_file() else None


requires_flickr8k = pytest.mark.realdata  # skipped when LTD_DATA_DIR holds no Flickr8k (below)

# ---- test tiers -------------------------------------------------------------------------------------
# `make check` runs `pytest -m "not slow"` (the fast tier, no training, browser or real data); `make test`
# runs everything. The markers (pyproject.toml) are applied here where they follow from what a test uses,
# so that none can be forgotten: a test that needs one of these session fixtures trains models.
TRAINING_FIXTURES = {"tiny_index_pair", "pair_service", "tiny_captioner"}


def _only_slow_tests(path: Path) -> bool:
    """The module marks itself slow (``pytestmark``), or every test in it is marked slow or training: read
    from its source, so that the fast tier does not import it (schemathesis, gradio, … take seconds)."""
    import ast

    tree = ast.parse(path.read_text())
    marks = lambda node: {ast.unparse(d) for d in getattr(node, "decorator_list", [])}  # noqa: E731
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            if "pytest.mark.slow" in ast.unparse(node.value) or "pytest.mark.training" in ast.unparse(node.value):
                return True
    tests = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")]
    return bool(tests) and all(marks(t) & {"pytest.mark.slow", "pytest.mark.training"} for t in tests)


def pytest_ignore_collect(collection_path: Path, config):
    """With ``-m "not slow"``, a module with nothing but slow tests is not even imported."""
    if "not slow" in (config.getoption("markexpr") or "") and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and _only_slow_tests(collection_path):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    have_flickr8k = flickr8k_json() is not None
    for item in items:
        if TRAINING_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.training)
        if any(item.get_closest_marker(m) for m in ("training", "browser", "realdata")):
            item.add_marker(pytest.mark.slow)  # each of these implies slow
        if item.get_closest_marker("realdata") and not have_flickr8k:
            item.add_marker(pytest.mark.skip(reason="needs the Flickr8k dataset: set LTD_DATA_DIR (CI does)"))


TINY = ["data.synthetic_images=60", "model.image_size=64", "model.embed_dim=64", "model.text_hidden=64",
        "model.head_hidden=128", "model.decoder_hidden=128", "train.epochs=2", "train.batch_size=32",
        "train.log_every=1", "optim.warmup_steps=5", "optim.lr=1e-3"]


def tiny_config(mode: str = "none", extra: list[str] | tuple[str, ...] = ()):
    """A config that trains in seconds on the tiny synthetic dataset."""
    from training.config import load_config

    sets = list(TINY) + ([f"loss.mode={mode}", "loss.eta=0.5"] if mode != "none" else []) + list(extra)
    return load_config("synthetic_baseline", sets)


@pytest.fixture(scope="session")
def tiny_index_pair(tmp_path_factory):
    """Two trained tiny models (baseline, LTD constraint) on the synthetic test split, indexed and
    evaluated: {"bl": index_dir, "ltd": index_dir, "dataset": json, "runs": {...}}."""
    from app.pipeline import train_run
    from indexer.build import IndexRequest, build_dataset_index
    from indexer.evaluate import evaluate_index, write_report
    from training.prepare import resolve_dataset_path

    root = tmp_path_factory.mktemp("tiny_pair")
    out = {"runs": {}}
    for name, mode in (("bl", "none"), ("ltd", "constraint")):
        cfg = tiny_config(mode)
        res = train_run(cfg, root / "runs" / name)
        ds = resolve_dataset_path("", synthetic_images=60)
        ix = build_dataset_index(res.run_dir / "best.pt", ds, "test", IndexRequest(root / "indexes" / name))
        write_report(ix, evaluate_index(ix))
        out[name], out["dataset"] = ix.path, ds
        out["runs"][name] = res.run_dir
    return out


TINY_CAPTIONER = ["data.synthetic_images=60", "data.image_size=64", "data.min_word_count=2", "model.word_dim=32",
                  "model.hidden=32", "model.att_dim=32", "xe.epochs=2", "xe.batch_size=8", "train.log_every=1"]


def pair_settings(pair: dict, **kw):
    """Settings of an in-process app serving ``tiny_index_pair`` (no UI unless asked; models loaded before
    the first request; default threads)."""
    from app.api.settings import Settings

    base = dict(models={"bl": str(pair["bl"]), "ltd": str(pair["ltd"])}, ui=False, load_in_background=False,
                torch_threads=0, faiss_threads=0)
    return Settings(**(base | kw))


@pytest.fixture(scope="module")
def pair_service(tiny_index_pair):
    """A loaded search service over ``tiny_index_pair``, shared by a module's tests."""
    svc = pair_settings(tiny_index_pair).search_service()
    svc.registry.load()
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def tiny_captioner(tiny_index_pair, tmp_path_factory) -> Path:
    """A tiny XE captioner on the same synthetic scenes as ``tiny_index_pair``: its best.pt."""
    from app.cli import main

    run = tmp_path_factory.mktemp("captioner") / "xe"
    sets = [a for s in TINY_CAPTIONER for a in ("--set", s)]
    assert main(["caption", "train", "--config", "caption_synthetic_xe", "--out", str(run), "--no-progress", *sets]) == 0
    return run / "best.pt"
