"""The synthetic scenes' content: what each scene holds (``scene_spec``) and its five captions
(``captions_for``), as pure functions of a random generator. Rendering is in synthetic_render.py, the
dataset on disk in synthetic.py."""
from __future__ import annotations

import re

import numpy as np

CAPTIONS_PER_IMAGE = 5
_TOKEN_RE = re.compile(r"[a-z0-9]+")

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
