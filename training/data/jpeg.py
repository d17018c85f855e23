"""JPEG pixels through libjpeg-turbo's own API (``simplejpeg``), with Pillow as the fallback.

Pillow decodes JPEGs with libjpeg-turbo too, but through its ``ImageFile`` machinery (tiles, a decoder
object, a copy into its own image memory); ``simplejpeg`` hands the same library's output straight to
a numpy array: a little less CPU per image (BENCHMARKS.md, "JPEG decoders"). The pixels are bit-identical to Pillow's,
DCT scaling included, because the scale is the one Pillow's draft mode picks (1/2, 1/4 or 1/8, from
``load_image``'s ``min_side``) and both use the accurate integer IDCT with fancy upsampling; so
features cached from either decoder are interchangeable, and ``tests/test_jpeg.py`` checks it.

``decode`` returns None whenever it should not or cannot decode (the package is absent, a colour space
other than RGB or greyscale, an error or a warning in the stream): ``load_image`` then decodes with
Pillow exactly as before, and Pillow's error, if any, is the one reported.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

try:
    import simplejpeg
except ImportError:  # the optional fast path: Pillow alone decodes
    simplejpeg = None

BACKENDS = ("simplejpeg", "pillow")
backend = "simplejpeg" if simplejpeg is not None else "pillow"  # what ``decode`` uses; set "pillow" to compare


def decode(data: bytes, size: tuple[int, int], scale: int, mode: str) -> np.ndarray | None:
    """(h, w, 3) uint8 RGB pixels of a JPEG stream at ``1/scale`` of its size, or None (module doc).
    ``size`` is the (w, h) the caller expects after scaling (Pillow's ``img.size`` after ``draft``),
    ``mode`` Pillow's mode from the header: only ``RGB`` and ``L`` go this way."""
    if backend != "simplejpeg" or simplejpeg is None or mode not in ("RGB", "L"):
        return None
    w, h = size
    try:
        arr = simplejpeg.decode_jpeg(data, colorspace="rgb", min_factor=scale, min_height=h, min_width=w, strict=True)
    except (ValueError, RuntimeError) as e:  # corrupt, truncated, or only a warning: Pillow decides
        log.debug("simplejpeg could not decode (%s); Pillow decodes instead", e)
        return None
    return arr if arr.shape == (h, w, 3) else None


def scale_of(original: tuple[int, int], drafted: tuple[int, int]) -> int:
    """The DCT scale denominator that turned ``original`` (w, h) into ``drafted`` (ceil division)."""
    return next((s for s in (8, 4, 2) if all((o + s - 1) // s == d for o, d in zip(original, drafted))), 1)
