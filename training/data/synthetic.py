"""The embedded default dataset: procedurally generated captioned scenes (no download needed).

Each image shows 1-4 flat shapes (shape, colour, size, optional stripes/dots) on a textured,
coloured background, each in its own cell of a 3x3 grid so position words are unambiguous. Each
image gets 5 captions that are always true but mention *different subsets* of the scene (another
focus object, other attributes, a relation, a count, the background), so every caption carries
shared and caption-specific information. That is what makes contrastive feature suppression
visible: a purely contrastive model can match image and caption on the most salient object alone;
a model that must also reconstruct the caption's sentence embedding (LTD) has to keep the rest.

Output is the Karpathy split layout served by ``training/data/karpathy.py``: ``OUT/images/NNNNNN.jpg``
and ``OUT/dataset_synthetic.json``. Each image record also carries its ground truth (``objects``,
``background``, ``texture_seed``), which is exactly the scene spec: ``render_scene(record, size)``
re-renders it. Everything is a pure function of (seed, image index), so the output is
byte-identical for any number of worker processes.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import re
import time
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from training.fsio import atomic_write_text

log = logging.getLogger(__name__)

SYNTHETIC_JSON_NAME = "dataset_synthetic.json"
GENERATOR_VERSION = 1  # bump whenever output changes for the same arguments (invalidates reuse)
CAPTIONS_PER_IMAGE = 5
JPEG_QUALITY = 90
_TOKEN_RE = re.compile(r"[a-z0-9]+")
_IMAGE_NAME_RE = re.compile(r"^\d{6,}\.jpg$")

# ---------------------------------------------------------------------------------------------
# Vocabulary. Canonical attribute values (what the JSON stores) → the words captions may use.
# ---------------------------------------------------------------------------------------------
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (214, 39, 40),
    "green": (44, 160, 60),
    "blue": (35, 85, 215),
    "yellow": (245, 212, 35),
    "orange": (247, 133, 20),
    "purple": (130, 55, 180),
    "pink": (246, 140, 195),
    "white": (245, 245, 245),
    "black": (28, 28, 28),
    "gray": (128, 128, 128),
    "brown": (125, 78, 38),
}
COLOUR_WORDS: dict[str, tuple[str, ...]] = {c: (c,) for c in COLOURS} | {"gray": ("gray", "grey")}
OBJECT_COLOURS = ("red", "green", "blue", "yellow", "orange", "purple", "pink", "white", "black")
BACKGROUND_COLOURS = tuple(COLOURS)
# Minimum RGB distance between the background colour and any object colour in the same scene, so
# objects stay visible (rules out e.g. orange on yellow, pink on white, black on brown).
_MIN_CONTRAST = 110.0
_ALLOWED_OBJECT_COLOURS = {
    bg: tuple(c for c in OBJECT_COLOURS
              if np.linalg.norm(np.subtract(COLOURS[c], COLOURS[bg])) >= _MIN_CONTRAST)
    for bg in BACKGROUND_COLOURS
}

SHAPES = ("circle", "square", "triangle", "star", "diamond", "cross")
SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc"),
    "square": ("square",),
    "triangle": ("triangle",),
    "star": ("star",),
    "diamond": ("diamond",),
    "cross": ("cross", "plus sign"),
}
SIZES = ("small", "large")
SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little"), "large": ("large", "big")}
# Half of the object's side, as a fraction of the image side. Large is ~2x small: easy to tell apart.
_HALF_SIDE = {"small": (0.075, 0.095), "large": (0.15, 0.18)}

OBJECT_PATTERNS = ("plain", "striped", "dotted")
PATTERN_WORDS: dict[str, tuple[str, ...]] = {  # adjectives before the noun
    "plain": ("plain", "solid"),
    "striped": ("striped",),
    "dotted": ("dotted", "spotted"),
}
PATTERN_POST: dict[str, tuple[str, ...]] = {  # "a red circle with stripes"
    "striped": ("with stripes",),
    "dotted": ("with dots", "with spots", "with polka dots"),
}
BACKGROUND_PATTERNS = ("plain", "striped", "checkered", "dotted", "speckled", "gradient")
_BG_PATTERN_P = (0.2, 0.2, 0.15, 0.15, 0.15, 0.15)
BG_PATTERN_WORDS: dict[str, tuple[str, ...]] = {
    "plain": ("plain",),
    "striped": ("striped",),
    "checkered": ("checkered", "checked"),
    "dotted": ("dotted", "spotted", "polka dot"),
    "speckled": ("speckled",),
    "gradient": ("shaded",),
}
BG_PATTERN_POST: dict[str, tuple[str, ...]] = {  # "a green background with stripes"
    "striped": ("with stripes",),
    "checkered": ("with checks",),
    "dotted": ("with dots", "with spots"),
    "speckled": ("with speckles",),
}

# 3x3 grid: cell (row, col) → position name; phrases say where the object's centre is.
POSITIONS = (
    ("top left", "top", "top right"),
    ("left", "centre", "right"),
    ("bottom left", "bottom", "bottom right"),
)
POSITION_PHRASES: dict[str, tuple[str, ...]] = {
    "top left": ("in the top left corner", "at the top left", "in the upper left corner"),
    "top": ("at the top", "near the top", "at the top centre"),
    "top right": ("in the top right corner", "at the top right", "in the upper right corner"),
    "left": ("on the left", "on the left side", "at the left"),
    "centre": ("in the centre", "in the middle"),
    "right": ("on the right", "on the right side", "at the right"),
    "bottom left": ("in the bottom left corner", "at the bottom left", "in the lower left corner"),
    "bottom": ("at the bottom", "near the bottom", "at the bottom centre"),
    "bottom right": ("in the bottom right corner", "at the bottom right", "in the lower right corner"),
}
# Relations between two objects, decided on grid cells (see _relations).
RELATION_WORDS: dict[str, tuple[str, ...]] = {
    # No bare "left of": after "at the bottom" it would read as "at the bottom left of".
    "left": ("to the left of",),
    "right": ("to the right of",),
    "above": ("above",),
    "below": ("below", "under", "beneath"),
    "next": ("next to", "beside", "near"),
}
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
OBJECT_NOUNS = ("object", "shape")


# ---------------------------------------------------------------------------------------------
# Scene specs: plain JSON-able dicts, sampled from a numpy Generator.
# ---------------------------------------------------------------------------------------------
def _pick(rng: np.random.Generator, options) -> str:
    return options[int(rng.integers(len(options)))]


def _overlaps(a: list[float], b: list[float], pad: float = 0.01) -> bool:
    return a[0] < b[2] + pad and b[0] < a[2] + pad and a[1] < b[3] + pad and b[1] < a[3] + pad


def _place(rng: np.random.Generator, cell: int, size: str, placed: list[list[float]]) -> list[float] | None:
    """A bbox whose centre lies well inside grid cell `cell` and that overlaps nothing placed."""
    row, col = divmod(cell, 3)
    for _ in range(12):
        h = float(rng.uniform(*_HALF_SIDE[size]))
        centre = []
        for c in (col, row):  # x from the column, y from the row
            lo, hi = max(c / 3 + 0.04, h + 0.02), min((c + 1) / 3 - 0.04, 1 - h - 0.02)
            centre.append(float(rng.uniform(lo, hi)))
        box = [round(v, 4) for v in (centre[0] - h, centre[1] - h, centre[0] + h, centre[1] + h)]
        if not any(_overlaps(box, other) for other in placed):
            return box
    return None


def scene_spec(rng: np.random.Generator) -> dict:
    """Sample one scene: {"objects": [...], "background": {...}, "texture_seed": int}."""
    bg_colour = _pick(rng, BACKGROUND_COLOURS)
    bg_pattern = BACKGROUND_PATTERNS[int(rng.choice(len(BACKGROUND_PATTERNS), p=_BG_PATTERN_P))]
    allowed = _ALLOWED_OBJECT_COLOURS[bg_colour]
    n_objects = int(rng.integers(1, 5))
    cells = rng.permutation(9)[:n_objects]
    objects: list[dict] = []
    for cell in cells:
        colour, shape = _pick(rng, allowed), _pick(rng, SHAPES)
        if objects and rng.random() < 0.3:  # repeat an attribute now and then: makes counts worth saying
            other = objects[int(rng.integers(len(objects)))]
            colour, shape = (other["colour"], shape) if rng.random() < 0.6 else (colour, other["shape"])
        size = _pick(rng, SIZES)
        pattern = OBJECT_PATTERNS[int(rng.choice(3, p=(0.6, 0.2, 0.2)))]
        box = _place(rng, int(cell), size, [o["bbox"] for o in objects])
        if box is None and size == "large":
            size, box = "small", _place(rng, int(cell), "small", [o["bbox"] for o in objects])
        if box is None:
            continue  # no room in this cell: the scene gets one object fewer
        rgb = [int(np.clip(v + rng.integers(-12, 13), 0, 255)) for v in COLOURS[colour]]
        row, col = divmod(int(cell), 3)
        objects.append(
            {"shape": shape, "colour": colour, "size": size, "pattern": pattern, "rgb": rgb,
             "position": POSITIONS[row][col], "cell": [row, col], "bbox": box}
        )
    bg_rgb = [int(np.clip(v + rng.integers(-10, 11), 0, 255)) for v in COLOURS[bg_colour]]
    return {
        "objects": objects,
        "background": {"colour": bg_colour, "pattern": bg_pattern, "rgb": bg_rgb},
        "texture_seed": int(rng.integers(2**31)),
    }


# ---------------------------------------------------------------------------------------------
# Captions: always true for the spec; each one mentions a different subset of the scene.
# ---------------------------------------------------------------------------------------------
def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("s", "x")) else "s")


def _noun_phrase(obj: dict, rng: np.random.Generator, article: bool = True) -> str:
    """E.g. "a large red circle", "a striped object", "a blue star with dots": a random attribute subset."""
    use = {
        "size": rng.random() < 0.45,
        "colour": rng.random() < 0.7,
        "shape": rng.random() < 0.75,
        "pattern": rng.random() < (0.45 if obj["pattern"] != "plain" else 0.08),
    }
    if not any(use.values()):
        use[_pick(rng, ("colour", "shape"))] = True
    words, post = [], ""
    if use["size"]:
        words.append(_pick(rng, SIZE_WORDS[obj["size"]]))
    if use["pattern"]:
        if obj["pattern"] in PATTERN_POST and rng.random() < 0.4:
            post = " " + _pick(rng, PATTERN_POST[obj["pattern"]])
        else:
            words.append(_pick(rng, PATTERN_WORDS[obj["pattern"]]))
    if use["colour"]:
        words.append(_pick(rng, COLOUR_WORDS[obj["colour"]]))
    words.append(_pick(rng, SHAPE_WORDS[obj["shape"]]) if use["shape"] else _pick(rng, OBJECT_NOUNS))
    phrase = " ".join(words) + post
    return _article(phrase) if article else phrase


def _position(obj: dict, rng: np.random.Generator) -> str:
    return _pick(rng, POSITION_PHRASES[obj["position"]])


def _maybe_position(obj: dict, rng: np.random.Generator, p: float) -> str:
    return f" {_position(obj, rng)}" if rng.random() < p else ""


def _background(spec: dict, rng: np.random.Generator, post: bool = True) -> str:
    """E.g. "a striped green background", "a blue background with dots" (only when `post`)."""
    bg = spec["background"]
    colour, pattern = _pick(rng, COLOUR_WORDS[bg["colour"]]), bg["pattern"]
    r = rng.random()
    if r < 0.3:
        return _article(f"{colour} background")
    if r < 0.45:
        return _article(f"{_pick(rng, BG_PATTERN_WORDS[pattern])} background")
    if r < 0.6 and post and pattern in BG_PATTERN_POST:
        return _article(f"{colour} background {_pick(rng, BG_PATTERN_POST[pattern])}")
    if pattern == "gradient" and rng.random() < 0.5:
        return _article(f"{colour} gradient background")
    return _article(f"{_pick(rng, BG_PATTERN_WORDS[pattern])} {colour} background")


def _relations(a: dict, b: dict) -> list[str]:
    """Relations that hold for 'a REL b', judged on grid cells (each object has its own cell)."""
    (ra, ca), (rb, cb) = a["cell"], b["cell"]
    tests = (("left", ca < cb), ("right", ca > cb), ("above", ra < rb), ("below", ra > rb))
    rels = [name for name, holds in tests if holds]
    if max(abs(ra - rb), abs(ca - cb)) == 1:
        rels.append("next")
    return rels


_COUNT_KEYS = (("colour",), ("shape",), ("size",), ("pattern",), ("size", "colour"), ("colour", "shape"),
               ("size", "shape"), ("pattern", "shape"))


def _count_groups(objects: list[dict]) -> list[tuple[dict, list[int]]]:
    """Attribute combinations shared by exactly N ≥ 2 objects: ({"colour": "red"}, [0, 2]), ..."""
    groups = []
    for keys in _COUNT_KEYS:
        members: dict[tuple, list[int]] = {}
        for i, o in enumerate(objects):
            members.setdefault(tuple(o[k] for k in keys), []).append(i)
        for values, idx in members.items():
            if len(idx) >= 2 and not ("pattern" in keys and values[keys.index("pattern")] == "plain"):
                groups.append((dict(zip(keys, values)), idx))
    return groups


def _count_phrase(attrs: dict, n: int, rng: np.random.Generator) -> str:
    """E.g. "two red objects", "three circles", "two small striped squares"."""
    words = [NUMBER_WORDS[n]]
    if "size" in attrs:
        words.append(_pick(rng, SIZE_WORDS[attrs["size"]]))
    if "pattern" in attrs:
        words.append(_pick(rng, PATTERN_WORDS[attrs["pattern"]]))
    if "colour" in attrs:
        words.append(_pick(rng, COLOUR_WORDS[attrs["colour"]]))
    noun = _pick(rng, SHAPE_WORDS[attrs["shape"]]) if "shape" in attrs else _pick(rng, OBJECT_NOUNS)
    return " ".join(words + [_plural(noun)])


def _on_background(spec: dict, rng: np.random.Generator, p: float) -> str:
    return f" on {_background(spec, rng)}" if rng.random() < p else ""


def _caption_object(spec: dict, focus: int, rng: np.random.Generator) -> str:
    obj = spec["objects"][focus]
    prefix = _pick(rng, ("", "", "", "there is ", "an image of ", "a picture of "))
    return prefix + _noun_phrase(obj, rng) + _maybe_position(obj, rng, 0.5) + _on_background(spec, rng, 0.3)


def _caption_relation(spec: dict, focus: int, rng: np.random.Generator) -> str:
    objs = spec["objects"]
    other = _pick(rng, [i for i in range(len(objs)) if i != focus])
    a, b = objs[focus], objs[other]
    rel = _pick(rng, RELATION_WORDS[_pick(rng, _relations(a, b))])
    subject = _noun_phrase(a, rng) + _maybe_position(a, rng, 0.25)
    form = _pick(rng, ("{a} {rel} {b}", "{a} {rel} {b}", "{a} is {rel} {b}", "there is {a} {rel} {b}"))
    return form.format(a=subject, rel=rel, b=_noun_phrase(b, rng)) + _on_background(spec, rng, 0.2)


def _caption_list(spec: dict, focus: int, rng: np.random.Generator) -> str:
    objs = spec["objects"]
    others = [i for i in rng.permutation(len(objs)) if i != focus]
    chosen = [focus] + others[: int(rng.integers(1, min(2, len(others)) + 1))]
    chosen = [chosen[i] for i in rng.permutation(len(chosen))]
    parts = [_noun_phrase(objs[i], rng) + _maybe_position(objs[i], rng, 0.3) for i in chosen]
    text = ", ".join(parts[:-1]) + " and " + parts[-1]
    return _pick(rng, ("", "", "an image with ")) + text + _on_background(spec, rng, 0.25)


def _caption_count(spec: dict, focus: int, rng: np.random.Generator) -> str:
    objs = spec["objects"]
    groups = _count_groups(objs)
    if groups and rng.random() < 0.65:
        attrs, members = groups[int(rng.integers(len(groups)))]
        text = _count_phrase(attrs, len(members), rng)
        outside = [i for i in range(len(objs)) if i not in members]
        if outside and rng.random() < 0.5:
            text += " and " + _noun_phrase(objs[_pick(rng, outside)], rng)
        return text + _on_background(spec, rng, 0.3)
    if len(objs) == 1:
        text = _pick(rng, ("a single ", "just one ", "only one ")) + _noun_phrase(objs[0], rng, article=False)
        return text + _on_background(spec, rng, 0.4)
    total = f"{NUMBER_WORDS[len(objs)]} {_pick(rng, ('objects', 'shapes'))}"
    r = rng.random()
    if r < 0.4:
        return total + f" on {_background(spec, rng)}"
    if r < 0.7:
        prefix = _pick(rng, ("", "there are ", "an image with "))
        return f"{prefix}{total} including {_noun_phrase(objs[focus], rng)}"
    return _pick(rng, ("", "there are ")) + total + _on_background(spec, rng, 0.5)


def _caption_background(spec: dict, focus: int, rng: np.random.Generator) -> str:
    obj, r = spec["objects"][focus], rng.random()
    bg = _background(spec, rng, post=r >= 0.4 and r < 0.75)  # no "a background with dots with a star"
    if r < 0.4:
        return f"{bg} with {_noun_phrase(obj, rng)}" + _maybe_position(obj, rng, 0.3)
    if r < 0.75:
        return _noun_phrase(obj, rng) + _maybe_position(obj, rng, 0.3) + f" on {bg}"
    n = len(spec["objects"])
    what = "a single object" if n == 1 else f"{NUMBER_WORDS[n]} {_pick(rng, ('objects', 'shapes'))}"
    return f"{bg} with {what}"


_KINDS_ONE = ((_caption_object, 0.45), (_caption_background, 0.3), (_caption_count, 0.25))
_KINDS_MANY = ((_caption_object, 0.25), (_caption_relation, 0.25), (_caption_list, 0.15),
               (_caption_count, 0.2), (_caption_background, 0.15))


def captions_for(spec: dict, rng: np.random.Generator, n: int = CAPTIONS_PER_IMAGE) -> list[str]:
    """`n` distinct true captions; the focus object cycles so captions describe different objects."""
    objs = spec["objects"]
    if not objs:
        raise ValueError("a scene needs at least one object to be captioned")
    kinds = _KINDS_ONE if len(objs) == 1 else _KINDS_MANY
    probs = np.array([p for _, p in kinds])
    order = rng.permutation(len(objs))
    captions: list[str] = []
    for _ in range(50 * n):
        focus = int(order[len(captions) % len(objs)])
        make = kinds[int(rng.choice(len(kinds), p=probs / probs.sum()))][0]
        text = make(spec, focus, rng)
        if text not in captions:
            captions.append(text)
            if len(captions) == n:
                return captions
    raise RuntimeError(f"could not write {n} distinct captions for scene {spec}")  # never seen in tests


# ---------------------------------------------------------------------------------------------
# Rendering: numpy textures + PIL polygons at 2x, box-downsampled (anti-aliased edges).
# ---------------------------------------------------------------------------------------------
def _shade(rgb, amount: float) -> np.ndarray:
    """A darker (light colours) or lighter (dark colours) tone of the same colour."""
    c = np.asarray(rgb, dtype=np.float32)
    if 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] > 120:
        return c * (1 - amount)
    return c + (255 - c) * amount


def _texture(pattern: str, h: int, w: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Float mask in [0, 1] (h, w): where the second tone goes. `scale` = pattern period in px."""
    yy, xx = np.arange(h, dtype=np.float32)[:, None], np.arange(w, dtype=np.float32)[None, :]
    if pattern == "striped":
        coord = _pick(rng, ("h", "v", "d", "a"))
        t = {"h": yy + 0 * xx, "v": xx + 0 * yy, "d": (xx + yy) / 1.414, "a": (xx - yy + h) / 1.414}[coord]
        return ((t // (scale / 2)) % 2).astype(np.float32)
    if pattern == "checkered":
        return (((xx // scale) + (yy // scale)) % 2).astype(np.float32)
    if pattern == "dotted":
        off = rng.uniform(0, scale, 2)
        dx, dy = (xx + off[0]) % scale - scale / 2, (yy + off[1]) % scale - scale / 2
        return (dx * dx + dy * dy < (0.27 * scale) ** 2).astype(np.float32)
    if pattern == "speckled":
        block = max(1, int(round(scale / 8)))  # fine grain: 2-3 px at 224 px
        small = (rng.random((h // block + 1, w // block + 1)) < 0.3).astype(np.float32)
        return np.repeat(np.repeat(small, block, 0), block, 1)[:h, :w]
    if pattern == "gradient":
        angle = rng.uniform(0, 2 * np.pi)
        t = np.cos(angle) * xx + np.sin(angle) * yy
        return ((t - t.min()) / max(float(t.max() - t.min()), 1.0)).astype(np.float32)
    return np.zeros((h, w), dtype=np.float32)


def _two_tone(mask: np.ndarray, rgb, shade: np.ndarray) -> np.ndarray:
    """(h, w, 3) float image: `rgb` where mask is 0, `shade` where it is 1."""
    base = np.asarray(rgb, dtype=np.float32)
    return base + mask[..., None] * (shade - base)


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, s: float) -> None:
    """Draw `shape` filled (255) in a box of side `s` centred on (cx, cy)."""
    r = s / 2
    if shape == "circle":
        draw.ellipse((cx - 0.95 * r, cy - 0.95 * r, cx + 0.95 * r, cy + 0.95 * r), fill=255)
        return
    if shape == "square":
        k = 0.85 * r
        pts = [(cx - k, cy - k), (cx + k, cy - k), (cx + k, cy + k), (cx - k, cy + k)]
    elif shape == "triangle":
        pts = [(cx, cy - r), (cx + r, cy + 0.8 * r), (cx - r, cy + 0.8 * r)]
    elif shape == "diamond":
        pts = [(cx, cy - r), (cx + 0.75 * r, cy), (cx, cy + r), (cx - 0.75 * r, cy)]
    elif shape == "star":
        ang = -np.pi / 2 + np.arange(10) * np.pi / 5
        rad = np.where(np.arange(10) % 2 == 0, r, 0.42 * r)
        pts = list(zip((cx + rad * np.cos(ang)).tolist(), (cy + 0.05 * r + rad * np.sin(ang)).tolist()))
    elif shape == "cross":
        a, b = 0.32 * r, 0.95 * r
        pts = [(cx - a, cy - b), (cx + a, cy - b), (cx + a, cy - a), (cx + b, cy - a), (cx + b, cy + a),
               (cx + a, cy + a), (cx + a, cy + b), (cx - a, cy + b), (cx - a, cy + a), (cx - b, cy + a),
               (cx - b, cy - a), (cx - a, cy - a)]
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    draw.polygon(pts, fill=255)


_SUPERSAMPLE = 4  # object outlines are drawn at 4x and box-downsampled: anti-aliased edges


def render_scene(spec: dict, image_size: int) -> Image.Image:
    """Render a scene spec (or a JSON image record) as an RGB image of side `image_size`."""
    rng = np.random.default_rng(spec["texture_seed"])
    size = image_size
    bg = spec["background"]
    amount = 0.45 if bg["pattern"] == "gradient" else 0.22
    mask = _texture(bg["pattern"], size, size, size * float(rng.uniform(0.07, 0.12)), rng)
    canvas = _two_tone(mask, bg["rgb"], _shade(bg["rgb"], amount))
    k = _SUPERSAMPLE
    for obj in spec["objects"]:
        x0, y0, x1, y1 = (int(round(v * size)) for v in obj["bbox"])
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, size), min(y1, size)
        w, h = x1 - x0, y1 - y0
        outline = Image.new("L", (k * w, k * h), 0)
        _draw_shape(ImageDraw.Draw(outline), obj["shape"], k * w / 2, k * h / 2, k * min(w, h))
        alpha = np.asarray(outline.reduce(k), dtype=np.float32)[..., None] / 255.0
        tone = _texture(obj["pattern"], h, w, min(w, h) * float(rng.uniform(0.24, 0.3)), rng)
        fill = _two_tone(tone, obj["rgb"], _shade(obj["rgb"], 0.4))
        region = canvas[y0:y1, x0:x1]
        region += alpha * (fill - region)
    return Image.fromarray(canvas.round().clip(0, 255).astype(np.uint8), "RGB")


# ---------------------------------------------------------------------------------------------
# Dataset generation.
# ---------------------------------------------------------------------------------------------
def _image_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, 0, index])  # stream 0: images; stream 1: the split


def _split_names(n_images: int, seed: int, val_fraction: float, test_fraction: float) -> list[str]:
    n_val, n_test = _split_sizes(n_images, val_fraction, test_fraction)
    names = np.array(["train"] * n_images, dtype=object)
    order = np.random.default_rng([seed, 1]).permutation(n_images)
    names[order[:n_val]] = "val"
    names[order[n_val : n_val + n_test]] = "test"
    return names.tolist()


def _split_sizes(n_images: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    return max(1, round(n_images * val_fraction)), max(1, round(n_images * test_fraction))


def _make_image(index: int, *, seed: int, image_size: int, image_dir: str) -> dict:
    """Generate, render and save image `index`; returns its record (without split and sentids)."""
    rng = _image_rng(seed, index)
    spec = scene_spec(rng)
    captions = captions_for(spec, rng)
    filename = f"{index:06d}.jpg"
    render_scene(spec, image_size).save(
        os.path.join(image_dir, filename), "JPEG", quality=JPEG_QUALITY, subsampling=2, optimize=False
    )
    return {"filename": filename, "captions": captions, **spec}


def _validate(n_images, seed, image_size, val_fraction, test_fraction, workers) -> None:
    def is_int(v) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if not is_int(n_images) or n_images < 10:
        raise ValueError(
            f"n_images must be an integer >= 10 (so train, val and test are all non-empty), got {n_images!r}"
        )
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not is_int(image_size) or not 32 <= image_size <= 1024:
        raise ValueError(f"image_size must be an integer in [32, 1024], got {image_size!r}")
    for name, v in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise ValueError(f"{name} must be a number in (0, 1), got {v!r}")
    if val_fraction + test_fraction >= 1:
        raise ValueError(f"val_fraction + test_fraction must be < 1 (train needs images), got "
                         f"{val_fraction} + {test_fraction}")
    n_val, n_test = _split_sizes(n_images, val_fraction, test_fraction)
    if n_images - n_val - n_test < 1:
        raise ValueError(f"no training images left: {n_images} images, {n_val} val, {n_test} test")
    if workers is not None and (not is_int(workers) or workers < 1):
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")


def _reusable(json_path: Path, params: dict) -> bool:
    """True when `json_path` was written with the same parameters and all its images exist."""
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if any(data.get(k) != v for k, v in params.items()):
        return False
    images = data.get("images", [])
    return len(images) == params["n_images"] and all(
        (json_path.parent / im["filepath"] / im["filename"]).is_file() for im in images
    )


def generate_synthetic(
    out_dir: str | Path,
    n_images: int = 5000,
    seed: int = 0,
    image_size: int = 224,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    workers: int | None = None,
    show_progress: bool = True,
) -> Path:
    """Write the synthetic scenes dataset under `out_dir` and return its JSON path.

    Images go to ``out_dir/images``, then the JSON is written to a temp file and renamed. When
    ``out_dir`` already holds a complete dataset made with the same arguments and generator
    version, it is reused as is. `workers` processes render in parallel (default: all cores);
    the output does not depend on it.
    """
    _validate(n_images, seed, image_size, val_fraction, test_fraction, workers)
    out_dir = Path(out_dir)
    json_path = out_dir / SYNTHETIC_JSON_NAME
    params = {"dataset": "synthetic", "generator_version": GENERATOR_VERSION, "n_images": int(n_images),
              "seed": int(seed), "image_size": int(image_size), "val_fraction": float(val_fraction),
              "test_fraction": float(test_fraction)}
    if json_path.is_file():
        if _reusable(json_path, params):
            log.info("reusing synthetic dataset %s (%d images, seed %d, %d px)",
                     json_path, n_images, seed, image_size)
            return json_path
        log.warning("%s was written with other parameters or is incomplete: regenerating", json_path)
        json_path.unlink()  # first, so a crash below never leaves a JSON pointing at new images
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    wanted = {f"{i:06d}.jpg" for i in range(n_images)}
    for stale in image_dir.iterdir():  # left over from a bigger earlier run
        if _IMAGE_NAME_RE.match(stale.name) and stale.name not in wanted:
            stale.unlink()

    workers = min(workers or os.cpu_count() or 1, n_images)
    make = partial(_make_image, seed=int(seed), image_size=int(image_size), image_dir=str(image_dir))
    start = time.perf_counter()
    bar = tqdm(total=n_images, desc="synthetic scenes", unit="img", disable=not show_progress)
    if workers == 1:
        results = []
        for i in range(n_images):
            results.append(make(i))
            bar.update()
    else:
        # fork where available: no __main__ guard needed in callers, and workers start instantly.
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(workers) as pool:
            results = []
            for rec in pool.imap(make, range(n_images), chunksize=max(1, min(64, n_images // (8 * workers)))):
                results.append(rec)
                bar.update()
    bar.close()

    splits = _split_names(n_images, seed, val_fraction, test_fraction)
    images, sentid = [], 0
    for i, rec in enumerate(results):
        captions = rec.pop("captions")
        sentids = list(range(sentid, sentid + len(captions)))
        sentences = [{"raw": c, "tokens": _TOKEN_RE.findall(c.lower()), "imgid": i, "sentid": s}
                     for c, s in zip(captions, sentids)]
        images.append({**rec, "filepath": "images", "imgid": i, "split": splits[i],
                       "sentids": sentids, "sentences": sentences})
        sentid += len(captions)
    text = json.dumps({**params, "images": images}, sort_keys=True, separators=(",", ":"))
    atomic_write_text(json_path, text)
    log.info("wrote %d synthetic images (%d px, seed %d) to %s in %.1f s",
             n_images, image_size, seed, out_dir, time.perf_counter() - start)
    return json_path
