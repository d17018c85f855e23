"""Synthetic shortcuts for vision-language (SVL), after Bleeker et al. 2024, "Demonstrating and
Reducing Shortcuts in Vision-Language Representation Learning".

A shortcut is a 6-digit number added to *both* modalities of an image-caption tuple: on the image as
six handwritten digit glyphs evenly spaced across the top band (white strokes on dark square patches,
so they are visible on any background), on the caption as six separate digit tokens
(``"a dog runs 0 0 1 9 9 2"``). A contrastive model can then match image and caption through the
number alone and suppress the real content.

Settings: ``none``; ``unique`` (number = dataset image index, < 10^6); ``image_only`` (the index drawn
on the image, captions untouched: the shortcut carries no matching information); ``caption_only``
(the index appended to captions, images untouched); ``bits:N`` (1 <= N <= 19: a number in [0, 2^N);
in training drawn deterministically from (seed, image index), in evaluation image index mod 2^N).

Glyphs are real handwritten digits: scikit-learn's bundled ``load_digits`` (8x8, no download) by
default, or MNIST from a local file (``glyphs=PATH``: a Keras-style ``mnist.npz`` or a folder with
the ``train-images-idx3-ubyte[.gz]``/``train-labels-idx1-ubyte[.gz]`` pair). Which sample of a digit
is drawn is a pure function of (seed, image index, digit position) -- not of the view -- so every
view and every worker process renders an image identically (the feature cache relies on it).
"""
from __future__ import annotations

import gzip
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from training.data.karpathy import CaptionRecord, Dataset
from training.errors import UserFileNotFound, UserValueError

log = logging.getLogger(__name__)

SHORTCUT_SETTINGS = ("none", "unique", "image_only", "caption_only")  # plus "bits:N"
MAX_BITS = 19  # 2^19 - 1 = 524,287 still fits in 6 digits
N_DIGITS = 6
RENDER_VERSION = 1  # bump whenever the pixels drawn for the same arguments change (invalidates caches)
VALID_CHOICES = ", ".join(SHORTCUT_SETTINGS) + f", bits:N (1 <= N <= {MAX_BITS})"

_M64 = (1 << 64) - 1
_SALT_NUMBER, _SALT_GLYPH = 0x5EED_B175, 0x6C79_F000


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix(*parts: int) -> int:
    """A stable 64-bit hash of integers (the same in every process, unlike ``hash``)."""
    h = 0
    for p in parts:  # int(): numpy integers (indices from a loader) overflow on the 64-bit mask
        h = _splitmix64(h ^ (int(p) & _M64))
    return h


def parse_setting(setting: str) -> tuple[str, int | None]:
    """``"bits:8"`` -> ``("bits", 8)``; ``"unique"`` -> ``("unique", None)``; ValueError otherwise."""
    s = str(setting).strip().lower()
    if s in SHORTCUT_SETTINGS:
        return s, None
    if s.startswith("bits:"):
        n = s[5:].strip()
        if n.isdigit() and 1 <= int(n) <= MAX_BITS:
            return "bits", int(n)
    raise ValueError(f"invalid shortcut setting {setting!r}; valid choices: {VALID_CHOICES}")


def shortcut_number(kind: str, bits: int | None, image_index: int, seed: int = 0, evaluation: bool = False) -> int | None:
    """The number a setting assigns to a dataset image (None for ``none``)."""
    if image_index < 0:
        raise ValueError(f"image index must be >= 0, got {image_index}")
    if kind == "none":
        return None
    if kind == "bits":
        assert bits is not None
        if evaluation:
            return image_index % (1 << bits)
        return _mix(seed, image_index, _SALT_NUMBER) & ((1 << bits) - 1)
    if image_index >= 10**N_DIGITS:
        raise ValueError(f"image index {image_index} does not fit in {N_DIGITS} digits")
    return image_index


def number_digits(number: int) -> list[int]:
    """``1992`` -> ``[0, 0, 1, 9, 9, 2]`` (zero-padded to six digits)."""
    if not 0 <= number < 10**N_DIGITS:
        raise ValueError(f"shortcut number {number} is not in [0, {10**N_DIGITS})")
    return [int(ch) for ch in f"{number:0{N_DIGITS}d}"]


def caption_with_number(raw: str, number: int) -> str:
    """The caption followed by the six digits as separate tokens."""
    return f"{raw} {' '.join(str(d) for d in number_digits(number))}".strip()


# ------------------------------------------------------------------------------------------------
# Glyphs
# ------------------------------------------------------------------------------------------------
class GlyphBank:
    """Handwritten digit samples (float [0, 1], 1 = ink) grouped by digit, with upscaled patches
    cached per patch geometry."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, source_id: str):
        self.images = images.astype(np.float32)
        self.labels = labels.astype(np.int64)
        self.source_id = source_id
        self.by_digit = tuple(np.flatnonzero(self.labels == d) for d in range(10))
        missing = [d for d in range(10) if len(self.by_digit[d]) == 0]
        if missing:
            raise UserValueError(f"glyph source {source_id} has no samples of digit(s) {missing}")
        self._patches: dict[tuple[int, int], np.ndarray] = {}

    def sample(self, digit: int, seed: int, image_index: int, position: int) -> int:
        """The sample index drawn for ``digit`` at ``position`` of an image: from (seed, index, position)."""
        pool = self.by_digit[digit]
        return int(pool[_mix(seed, image_index, position, _SALT_GLYPH) % len(pool)])

    def patches(self, side: int, pad: int) -> np.ndarray:
        """(n_samples, side, side) uint8: each sample bilinearly resized to ``side - 2*pad`` and
        centred on a black square of ``side`` pixels (white strokes on a dark patch)."""
        key = (side, pad)
        if key not in self._patches:
            g = side - 2 * pad
            out = np.zeros((len(self.images), side, side), np.uint8)
            for i, im in enumerate(self.images):
                small = Image.fromarray(np.round(np.clip(im, 0, 1) * 255).astype(np.uint8), "L")
                out[i, pad : pad + g, pad : pad + g] = np.asarray(small.resize((g, g), Image.BILINEAR))
            self._patches[key] = out
        return self._patches[key]


def _read_idx(path: Path) -> np.ndarray:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _load_mnist(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if path.is_dir():
        def find(stem: str) -> Path:
            hits = [p for p in (path / stem, path / f"{stem}.gz") if p.is_file()]
            if not hits:
                raise UserFileNotFound(f"MNIST folder {path} has no {stem}[.gz]")
            return hits[0]
        return _read_idx(find("train-images-idx3-ubyte")), _read_idx(find("train-labels-idx1-ubyte"))
    with np.load(path) as z:
        for xk, yk in (("x_train", "y_train"), ("images", "labels")):
            if xk in z and yk in z:
                return z[xk], z[yk]
    raise UserValueError(f"{path}: expected arrays x_train/y_train (Keras mnist.npz) or images/labels")


@lru_cache(maxsize=4)
def glyph_bank(source: str = "digits") -> GlyphBank:
    """``"digits"`` = sklearn's bundled 8x8 digits (0-16 grey levels); else a local MNIST path.
    Loaded once per process (each DataLoader worker loads its own copy on first use)."""
    if source == "digits":
        from sklearn.datasets import load_digits  # lazy: ~1.2 s to import, and only this shortcut needs it

        d = load_digits()
        return GlyphBank(d.images / 16.0, d.target, "sklearn-digits")
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise UserFileNotFound(f"glyph source {source!r}: no such file or folder (use 'digits' or an MNIST path)")
    x, y = _load_mnist(path)
    x = np.asarray(x, np.float32).reshape(len(x), 28, 28) / 255.0
    size = sum(p.stat().st_size for p in ([path] if path.is_file() else sorted(path.iterdir())))
    log.info("loaded %d MNIST glyphs from %s", len(x), path)
    return GlyphBank(x, np.asarray(y), f"mnist:{path}:{size}")


# ------------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GlyphLayout:
    side: int  # patch side in pixels (glyph + 2 * pad)
    pad: int  # dark border around the glyph inside the patch
    y: int  # top of every patch
    xs: tuple[int, ...]  # left edge of each of the six patches

    def box(self, position: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of the patch at ``position``."""
        x = self.xs[position]
        return x, self.y, x + self.side, self.y + self.side


@lru_cache(maxsize=64)
def glyph_layout(width: int, height: int) -> GlyphLayout:
    """Six patches evenly spaced across the top band: glyphs ~1/8 of the image height, shrunk when
    the image is too narrow to hold six of them."""
    margin = max(1, min(width, height) // 64)
    glyph = max(3, height // 8)
    pad = max(1, glyph // 8)
    side = min(glyph + 2 * pad, (width - 2 * margin) // N_DIGITS, height - 2 * margin)
    pad = min(pad, max(1, side // 8))
    if side - 2 * pad < 3:
        raise UserValueError(f"a {width}x{height} image is too small to draw {N_DIGITS} digit glyphs (use >= 32 px)")
    gap = (width - 2 * margin - N_DIGITS * side) / (N_DIGITS - 1)
    xs = tuple(margin + round(k * (side + gap)) for k in range(N_DIGITS))
    return GlyphLayout(side=side, pad=pad, y=margin, xs=xs)


def render_patches(number: int, width: int, height: int, *, seed: int = 0, image_index: int = 0,
                   glyphs: str = "digits") -> list[np.ndarray]:
    """The six (side, side) uint8 patches drawn for ``number`` on a ``width`` x ``height`` view."""
    bank, lay = glyph_bank(glyphs), glyph_layout(width, height)
    table = bank.patches(lay.side, lay.pad)
    return [table[bank.sample(d, seed, image_index, k)] for k, d in enumerate(number_digits(number))]


def draw_number(img: Image.Image, number: int, *, seed: int = 0, image_index: int = 0,
                glyphs: str = "digits") -> Image.Image:
    """A copy of ``img`` with ``number`` drawn as six digit glyphs across its top band."""
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    w, h = img.size
    lay = glyph_layout(w, h)
    arr = np.array(img)  # a copy: the caller's view is never modified
    for k, patch in enumerate(render_patches(number, w, h, seed=seed, image_index=image_index, glyphs=glyphs)):
        x0, y0, x1, y1 = lay.box(k)
        arr[y0:y1, x0:x1] = patch if arr.ndim == 2 else patch[:, :, None]
    return Image.fromarray(arr, img.mode)


class DigitStamp:
    """The picklable image transform: (dataset image index, view) -> view with the number drawn.
    Holds only the setting's parameters; glyphs are (re)loaded per process through ``glyph_bank``."""

    def __init__(self, kind: str, bits: int | None, seed: int, evaluation: bool, glyphs: str = "digits"):
        self.kind, self.bits, self.seed, self.evaluation, self.glyphs = kind, bits, seed, evaluation, glyphs

    def __call__(self, image_index: int, view: Image.Image) -> Image.Image:
        number = shortcut_number(self.kind, self.bits, image_index, self.seed, self.evaluation)
        assert number is not None
        return draw_number(view, number, seed=self.seed, image_index=image_index, glyphs=self.glyphs)

    def __repr__(self) -> str:
        return f"DigitStamp(kind={self.kind!r}, bits={self.bits}, seed={self.seed}, evaluation={self.evaluation})"


# ------------------------------------------------------------------------------------------------
# Public entry point
# ------------------------------------------------------------------------------------------------
@dataclass
class Shortcuts:
    setting: str
    image_transform: Callable[[int, Image.Image], Image.Image] | None  # None: nothing drawn on images
    # "" when images are untouched (none, caption_only: their features equal the plain ones); else it
    # names exactly what is drawn and becomes part of the image-feature cache key.
    transform_id: str
    kind: str = "none"
    bits: int | None = None
    seed: int = 0
    evaluation: bool = False
    on_captions: bool = False
    n_images: int | None = None

    def number(self, image_index: int) -> int | None:
        """The shortcut number of a dataset image (None for ``none``)."""
        if self.n_images is not None and not 0 <= image_index < self.n_images:
            raise IndexError(f"image index {image_index} out of range for {self.n_images} images")
        return shortcut_number(self.kind, self.bits, image_index, self.seed, self.evaluation)

    def caption(self, c: CaptionRecord) -> str:
        """The caption as the model sees it: ``c.raw`` plus the six digits when captions carry them."""
        if not self.on_captions:
            return c.raw
        number = self.number(c.image_index)
        assert number is not None
        return caption_with_number(c.raw, number)


def apply_shortcuts(setting: str, ds: Dataset, seed: int = 0, *, evaluation: bool = False,
                    glyphs: str | Path = "digits") -> Shortcuts:
    """The shortcut setting for a dataset. ``evaluation=True`` makes ``bits:N`` use index mod 2^N;
    evaluating *without* shortcuts is simply ``setting="none"``. ``glyphs`` = "digits" or an MNIST path."""
    kind, bits = parse_setting(setting)
    canonical = f"bits:{bits}" if kind == "bits" else kind
    n = len(ds.images)
    if kind in ("unique", "image_only", "caption_only") and n > 10**N_DIGITS:
        raise UserValueError(f"shortcut setting {canonical!r} numbers images by index, but {ds.name!r} has {n:,} "
                         f"images (> 10^{N_DIGITS}); use bits:N")
    number_kind = "bits" if kind == "bits" else ("none" if kind == "none" else "unique")
    on_images = kind in ("unique", "image_only", "bits")
    on_captions = kind in ("unique", "caption_only", "bits")
    transform, transform_id = None, ""
    if on_images:
        glyphs = str(glyphs)
        bank = glyph_bank(glyphs)  # fail early (bad MNIST path) rather than inside a worker
        transform = DigitStamp(number_kind, bits, seed, evaluation, glyphs)
        transform_id = f"svl-v{RENDER_VERSION}:{canonical}:seed={seed}:eval={int(evaluation)}:glyphs={bank.source_id}"
    log.info("shortcuts %s on %s (%d images): images %s, captions %s%s", canonical, ds.name, n,
             "yes" if on_images else "no", "yes" if on_captions else "no",
             " (evaluation numbering)" if evaluation and kind == "bits" else "")
    return Shortcuts(setting=canonical, image_transform=transform, transform_id=transform_id, kind=number_kind,
                     bits=bits, seed=seed, evaluation=evaluation, on_captions=on_captions, n_images=n)
