"""Drawing a scene spec (training/data/synthetic_scenes.py) into an image: textured background,
anti-aliased shapes with their patterns."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from training.data.synthetic_scenes import SHAPES, _pick


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
