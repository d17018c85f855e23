"""The embedded synthetic dataset: deterministic, well-formed, and its captions are true."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.data import synthetic
from training.data import synthetic_scenes as syn
from training.data.karpathy import load_karpathy
from training.data.synthetic import (
    SYNTHETIC_JSON_NAME,
    captions_for,
    generate_synthetic,
    render_scene,
    scene_spec,
)

N, SIZE = 40, 64


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    return generate_synthetic(tmp_path_factory.mktemp("syn_a"), n_images=N, seed=3, image_size=SIZE,
                              workers=1)


def _files(json_path: Path) -> dict[str, bytes]:
    """The dataset's files (not the empty lock file that serialises concurrent generators)."""
    root = json_path.parent
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---------------------------------------------------------------------------------------------
# A small parser for the caption grammar, used to check that every claim holds for the scene.
# ---------------------------------------------------------------------------------------------
ADJ = {w: ("size", v) for v, ws in syn.SIZE_WORDS.items() for w in ws}
ADJ |= {w: ("pattern", v) for v, ws in syn.PATTERN_WORDS.items() for w in ws}
ADJ |= {w: ("colour", v) for v, ws in syn.COLOUR_WORDS.items() for w in ws}
BG_ADJ = {w: ("colour", v) for v, ws in syn.COLOUR_WORDS.items() for w in ws}
BG_ADJ |= {t: ("pattern", v) for v, ws in syn.BG_PATTERN_WORDS.items() for w in ws for t in w.split()}
BG_ADJ["gradient"] = ("pattern", "gradient")
NOUNS: dict[str, tuple[str | None, bool]] = {"object": (None, False), "shape": (None, False),
                                             "objects": (None, True), "shapes": (None, True)}
for shape, words in syn.SHAPE_WORDS.items():
    for w in words:
        w = w.replace(" ", "")  # "plus sign" → "plussign"
        NOUNS[w] = (shape, False)
        NOUNS[w + ("es" if w.endswith(("s", "x")) else "s")] = (shape, True)
NUMBERS = {"single": 1} | {w: n for n, w in syn.NUMBER_WORDS.items()}
FILLER = {"a", "an", "the", "there", "is", "are", "image", "picture", "of", "with", "on", "and",
          "including", "just", "only"}
PHRASES = {p: f"@pos:{k}" for k, ps in syn.POSITION_PHRASES.items() for p in ps}
PHRASES |= {p: f"@rel:{k}" for k, ps in syn.RELATION_WORDS.items() for p in ps}
PHRASES |= {p: f"@post:{k}" for k, ps in syn.PATTERN_POST.items() for p in ps}


def _prepare(caption: str) -> list[str]:
    s = " " + caption.replace(",", "") + " "
    for k, ps in syn.BG_PATTERN_POST.items():
        for p in ps:
            s = s.replace(f" background {p} ", f" background @bgpost:{k} ")
    for p in sorted(PHRASES, key=len, reverse=True):  # longest first: "at the top left" before "at the top"
        s = s.replace(f" {p} ", f" {PHRASES[p].replace(' ', '_')} ")
    s = s.replace(" plus signs ", " plussigns ").replace(" plus sign ", " plussign ")
    return s.split()


def _matches(obj: dict, np_: dict) -> bool:
    return (all(obj[a] == v for a, v in np_["adjs"])
            and np_["shape"] in (None, obj["shape"])
            and np_["post"] in (None, obj["pattern"])
            and np_["pos"] in (None, obj["position"]))


def check_caption(caption: str, spec: dict) -> None:
    """Raise AssertionError if any claim of `caption` is false for `spec` (or a word is unknown)."""
    objs, bg = spec["objects"], spec["background"]
    toks, items, i = _prepare(caption), [], 0
    while i < len(toks):
        t = toks[i]
        if t.startswith("@rel:"):
            items.append(("rel", t[5:]))
        elif t.startswith("@pos:"):
            assert items and items[-1][0] == "np", f"position without an object in {caption!r}"
            items[-1][1]["pos"] = t[5:].replace("_", " ")
        elif t.startswith("@post:"):
            assert items and items[-1][0] == "np", f"pattern without an object in {caption!r}"
            items[-1][1]["post"] = t[6:]
        elif t in NUMBERS or t in ADJ or t in BG_ADJ or t in NOUNS or t == "background":
            j = i
            while j < len(toks) and toks[j] not in NOUNS and toks[j] != "background":
                assert toks[j] in NUMBERS or toks[j] in ADJ or toks[j] in BG_ADJ, f"bad phrase in {caption!r}"
                j += 1
            assert j < len(toks), f"adjectives without a noun in {caption!r}"
            run, noun = toks[i:j], toks[j]
            if noun == "background":
                for w in run:
                    assert w in BG_ADJ, f"{w!r} cannot describe a background in {caption!r}"
                    attr, value = BG_ADJ[w]
                    assert bg[attr] == value, f"background is not {w!r} in {caption!r}: {bg}"
                if j + 1 < len(toks) and toks[j + 1].startswith("@bgpost:"):
                    assert bg["pattern"] == toks[j + 1][8:], f"background pattern wrong in {caption!r}"
                    j += 1
            else:
                number = NUMBERS[run.pop(0)] if run and run[0] in NUMBERS else None
                assert all(w in ADJ for w in run), f"{run} cannot describe an object in {caption!r}"
                shape, plural = NOUNS[noun]
                assert plural == (number is not None and number > 1), f"number/noun mismatch in {caption!r}"
                items.append(("np", {"adjs": [ADJ[w] for w in run], "shape": shape, "number": number,
                                     "post": None, "pos": None}))
            i = j
        else:
            assert t in FILLER, f"unknown word {t!r} in {caption!r}"
        i += 1
    nps = [np_ for kind, np_ in items if kind == "np"]
    for np_ in nps:
        n_match = sum(_matches(o, np_) for o in objs)
        if np_["number"] is None:
            assert n_match >= 1, f"no object fits {np_} in {caption!r}: {objs}"
        else:
            assert n_match == np_["number"], f"{n_match} objects fit counted {np_} in {caption!r}: {objs}"
    for k, (kind, rel) in enumerate(items):
        if kind != "rel":
            continue
        assert 0 < k < len(items) - 1 and items[k - 1][0] == items[k + 1][0] == "np", caption
        a_np, b_np = items[k - 1][1], items[k + 1][1]
        assert any(rel in syn._relations(a, b) for a in objs for b in objs
                   if a is not b and _matches(a, a_np) and _matches(b, b_np)), \
            f"relation {rel!r} false in {caption!r}: {objs}"


# ---------------------------------------------------------------------------------------------
# Captions (pure functions)
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_captions_are_true_distinct_and_five_for_many_scenes() -> None:
    kinds_seen = set()
    for i in range(1500):
        rng = np.random.default_rng([11, i])
        spec = scene_spec(rng)
        caps = captions_for(spec, rng)
        assert len(caps) == 5 and len(set(caps)) == 5, caps
        assert 1 <= len(spec["objects"]) <= 4
        for c in caps:
            check_caption(c, spec)
            kinds_seen.update(w for w in ("left", "above", "two", "three", "corner", "background", "with")
                              if w in c.split())
    assert kinds_seen == {"left", "above", "two", "three", "corner", "background", "with"}


def test_checker_catches_false_captions() -> None:
    spec = {"objects": [
        {"shape": "circle", "colour": "red", "size": "large", "pattern": "striped", "position": "top left",
         "cell": [0, 0], "bbox": [0.05, 0.05, 0.35, 0.35], "rgb": [214, 39, 40]},
        {"shape": "square", "colour": "blue", "size": "small", "pattern": "plain", "position": "bottom right",
         "cell": [2, 2], "bbox": [0.75, 0.75, 0.93, 0.93], "rgb": [35, 85, 215]}],
        "background": {"colour": "green", "pattern": "dotted", "rgb": [44, 160, 60]}, "texture_seed": 1}
    check_caption("a big striped red disc in the top left corner to the left of a small blue square", spec)
    check_caption("two objects on a dotted green background", spec)
    for false in ("a blue circle", "a red square", "a small circle", "a square with stripes",
                  "a red circle at the bottom", "a blue square above a red circle", "two circles",
                  "a red circle next to a blue square", "three objects", "a striped background",
                  "a single object", "a yellow triangle"):
        with pytest.raises(AssertionError):
            check_caption(false, spec)
    # Generated captions for this hand-made scene never bind attributes to the wrong object.
    for seed in range(300):
        for c in captions_for(spec, np.random.default_rng(seed)):
            check_caption(c, spec)


def test_scene_geometry() -> None:
    for i in range(300):
        spec = scene_spec(np.random.default_rng([5, i]))
        objs = spec["objects"]
        assert len({tuple(o["cell"]) for o in objs}) == len(objs)  # one object per grid cell
        for o in objs:
            x0, y0, x1, y1 = o["bbox"]
            assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
            row, col = o["cell"]
            assert (int((y0 + y1) / 2 * 3), int((x0 + x1) / 2 * 3)) == (row, col)
            assert o["position"] == syn.POSITIONS[row][col]
            assert (x1 - x0 > 0.28) == (o["size"] == "large")
            assert o["colour"] != spec["background"]["colour"]
        for a in objs:
            for b in objs:
                if a is not b:
                    assert not syn._overlaps(a["bbox"], b["bbox"], pad=0.0)


def test_render_is_deterministic_rgb_and_sized() -> None:
    spec = scene_spec(np.random.default_rng(0))
    a, b = render_scene(spec, 96), render_scene(spec, 96)
    assert a.mode == "RGB" and a.size == (96, 96)
    assert a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------------------------
# The dataset on disk
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_byte_identical_across_runs_and_worker_counts(generated: Path, tmp_path: Path) -> None:
    again = generate_synthetic(tmp_path / "b", n_images=N, seed=3, image_size=SIZE, workers=2)
    assert again.name == SYNTHETIC_JSON_NAME
    files_a, files_b = _files(generated), _files(again)
    assert sorted(files_a) == sorted(files_b) and len(files_a) == N + 1
    assert files_a == files_b
    other = generate_synthetic(tmp_path / "c", n_images=N, seed=4, image_size=SIZE, workers=2)
    assert other.read_bytes() != generated.read_bytes()


def test_json_layout_splits_and_captions(generated: Path) -> None:
    data = json.loads(generated.read_text())
    assert data["dataset"] == "synthetic" and data["seed"] == 3
    assert data["generator_version"] == synthetic.GENERATOR_VERSION
    images = data["images"]
    assert [im["imgid"] for im in images] == list(range(N))
    splits = [im["split"] for im in images]
    assert (splits.count("train"), splits.count("val"), splits.count("test")) == (32, 4, 4)
    sentids = [s for im in images for s in im["sentids"]]
    assert sentids == list(range(5 * N))
    for im in images:
        assert im["filename"] == f"{im['imgid']:06d}.jpg" and im["filepath"] == "images"
        assert len(im["sentences"]) == 5 and len({s["raw"] for s in im["sentences"]}) == 5
        assert [s["sentid"] for s in im["sentences"]] == im["sentids"]
        for s in im["sentences"]:
            assert s["imgid"] == im["imgid"]
            assert s["tokens"] == re.findall(r"[a-z0-9]+", s["raw"].lower())
            check_caption(s["raw"], im)  # the record is the scene spec
        assert {"shape", "colour", "size", "position", "bbox"} <= set(im["objects"][0])
        assert {"colour", "pattern"} <= set(im["background"])
    # The project's generic Karpathy reader serves it.
    ds = load_karpathy(generated)
    assert ds.split_counts() == {"train": 32, "val": 4, "test": 4}
    assert len(ds.split("test").captions) == 20


def test_images_decode_at_size_and_match_record(generated: Path) -> None:
    data = json.loads(generated.read_text())
    for im in data["images"]:
        with Image.open(generated.parent / im["filepath"] / im["filename"]) as img:
            img.load()
            assert img.format == "JPEG" and img.mode == "RGB" and img.size == (SIZE, SIZE)
    # A record re-renders to the same picture (up to JPEG loss).
    im = data["images"][0]
    with Image.open(generated.parent / "images" / im["filename"]) as img:
        stored = np.asarray(img.convert("RGB"), dtype=np.float32)
    rendered = np.asarray(render_scene(im, SIZE), dtype=np.float32)
    assert np.abs(stored - rendered).mean() < 8


def test_reuses_existing_output(generated: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = {p: p.stat().st_mtime_ns for p in generated.parent.rglob("*") if p.is_file()}
    with caplog.at_level(logging.INFO, logger="training.data.synthetic"):
        again = generate_synthetic(generated.parent, n_images=N, seed=3, image_size=SIZE, workers=1)
    assert again == generated
    assert "reusing" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_regenerates_when_arguments_change(tmp_path: Path) -> None:
    first = generate_synthetic(tmp_path, n_images=20, seed=1, image_size=48, workers=1)
    second = generate_synthetic(tmp_path, n_images=12, seed=2, image_size=48, workers=1)
    assert first == second
    data = json.loads(second.read_text())
    assert data["seed"] == 2 and len(data["images"]) == 12
    assert len(list((tmp_path / "images").glob("*.jpg"))) == 12  # stale images removed
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_images": 9}, "n_images"),
        ({"n_images": 10.5}, "n_images"),
        ({"seed": -1}, "seed"),
        ({"image_size": 16}, "image_size"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction \\+ test_fraction"),
        ({"n_images": 10, "val_fraction": 0.49, "test_fraction": 0.5}, "no training images"),
        ({"workers": 0}, "workers"),
    ],
)
def test_bad_arguments_raise(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"n_images": 20, "image_size": 48} | kwargs
    with pytest.raises(ValueError, match=message):
        generate_synthetic(tmp_path, **args)
    assert not (tmp_path / SYNTHETIC_JSON_NAME).exists()
