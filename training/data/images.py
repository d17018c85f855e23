"""Image decoding and preprocessing with PIL + numpy + torch (no torchvision).

Every decode goes through ``load_image``, which turns any bad file into an ``ImageError`` with a
message that names the file and the problem, so a long run can skip and report it instead of dying.
"""
from __future__ import annotations

import io
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from training.data import jpeg
from training.data.members import ImageMember
from training.errors import UserError

# A 12,000 x 12,000 photo is plenty; anything larger is refused before decoding (decompression bombs).
MAX_PIXELS = 144_000_000
ORIENTATION = 0x0112  # the EXIF tag
ALLOWED_FORMATS = {"JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF", "MPO"}
# PIL's own bomb check runs inside Image.open; align it with ours so one limit applies everywhere.
Image.MAX_IMAGE_PIXELS = MAX_PIXELS


class ImageError(UserError, ValueError):
    """An image that cannot be used (not an image, truncated, too large, unsupported)."""


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        bg = Image.new("RGB", rgba.size, (255, 255, 255))  # flatten transparency onto white
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return bg
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        hi = arr.max() or 1.0
        return Image.fromarray((arr / hi * 255).astype(np.uint8)).convert("RGB")
    return img.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV, F


def _fast_jpeg(img: Image.Image, fp, original: tuple[int, int]) -> Image.Image | None:
    """The pixels of a (possibly drafted) baseline JPEG through libjpeg-turbo directly (``jpeg.py``),
    carrying the header's metadata (EXIF orientation); None: let Pillow decode it."""
    if img.format != "JPEG" or jpeg.backend == "pillow":
        return None
    fp.seek(0)
    arr = jpeg.decode(fp.read(), img.size, jpeg.scale_of(original, img.size), img.mode)
    if arr is None:
        return None
    out = Image.frombuffer("RGB", (arr.shape[1], arr.shape[0]), arr, "raw", "RGB", 0, 1)  # shares the array
    out.info.update(img.info)  # EXIF (for exif_transpose), ICC profile, DPI
    return out


def load_image(source: str | Path | bytes | ImageMember | BinaryIO, *, max_pixels: int = MAX_PIXELS, name: str | None = None,
               min_side: int = 0) -> Image.Image:
    """Decode a file path, bytes, a shard member (``members.ImageMember``) or a binary file open for
    reading (closed when done) into an RGB PIL image,
    applying EXIF orientation.

    ``max_pixels`` bounds the pixels actually decoded. ``min_side`` > 0 lets a JPEG decode at a
    reduced scale (1/2, 1/4 or 1/8, in the DCT: Pillow's draft mode) as long as its short side stays
    at least ``min_side``, so a 40-megapixel photo meant for a 224-pixel model never decodes at full size.
    Raises ImageError for anything that is not a decodable image of an allowed format and size.
    """
    label = name or (str(source) if not isinstance(source, bytes) else "upload")
    try:
        if isinstance(source, ImageMember):
            fp = io.BytesIO(source.read_bytes())
        elif hasattr(source, "read"):  # a file already open (the server's checked one: search/files.py)
            fp = source
        else:
            fp = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")
    except OSError as e:
        raise ImageError(f"{label}: cannot open ({e.strerror or e})") from None
    with fp:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                img = Image.open(fp)
                if img.format not in ALLOWED_FORMATS:
                    raise ImageError(f"{label}: unsupported image type {img.format}")
                original = img.size
                if min_side > 0 and img.format in ("JPEG", "MPO") and min(img.size) > 2 * min_side:
                    scale = min_side / min(img.size)
                    img.draft("RGB", (max(1, int(img.size[0] * scale + 1)), max(1, int(img.size[1] * scale + 1))))
                w, h = img.size
                if w * h > max_pixels:
                    raise ImageError(f"{label}: {w}x{h} pixels exceeds the limit of {max_pixels:,} (decompression-bomb guard)")
                if w < 1 or h < 1:
                    raise ImageError(f"{label}: empty image ({w}x{h})")
                fast = _fast_jpeg(img, fp, original)  # only now, after the pixel budget: the first full decode
                if fast is None:
                    img.load()
                else:
                    img = fast
        except ImageError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageError(f"{label}: too many pixels to decode safely (decompression-bomb guard: "
                             f"{Image.MAX_IMAGE_PIXELS:,} pixels in the file's header at most)") from None
        except UnidentifiedImageError:
            raise ImageError(f"{label}: not a recognised image file") from None
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            raise ImageError(f"{label}: corrupt or truncated image ({e})") from None
    try:
        if img.getexif().get(ORIENTATION, 1) != 1:  # exif_transpose would otherwise copy the image unchanged
            img = ImageOps.exif_transpose(img)
    except Exception:  # broken EXIF must not make a good picture unusable
        pass
    return _to_rgb(img)


@dataclass(frozen=True)
class Preprocess:
    """Resize the short side to ``resize``, centre-crop ``size``, scale to floats and normalise.

    ``mean``/``std`` are per channel on [0, 1] pixels: EfficientNet-Lite expects [-1, 1]
    (mean = std = 0.5); torchvision ResNets expect the ImageNet statistics.
    """

    size: int = 224
    resize: int = 224
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def key(self) -> dict:
        return asdict(self)

    def resize_image(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        s = self.resize / min(w, h)
        nw, nh = max(self.size, round(w * s)), max(self.size, round(h * s))
        return img.resize((nw, nh), Image.BICUBIC, reducing_gap=3.0) if (nw, nh) != (w, h) else img

    def to_tensor(self, img: Image.Image) -> torch.Tensor:
        """(3, H, W) float32 ``(pixel / 255 − mean) / std``: bit for bit the plain numpy formula
        (``tests/test_jpeg.py``), but converted straight into the channel-first array and scaled in
        place, single-threaded: a fraction of the CPU the decode takes (BENCHMARKS.md, "JPEG decoders"),
        where five temporary arrays had cost several times the decode."""
        a = np.asarray(img)
        x = np.empty((3, *a.shape[:2]), np.float32)
        np.copyto(x, a.transpose(2, 0, 1), casting="unsafe")
        x /= np.float32(255.0)
        x -= np.asarray(self.mean, np.float32)[:, None, None]
        x /= np.asarray(self.std, np.float32)[:, None, None]
        return torch.from_numpy(x)

    def crops(self, img: Image.Image, n_crops: int = 1) -> list[Image.Image]:
        """1 = centre crop; 2 = centre + its mirror; 10 = four corners + centre, each also mirrored
        (the ten-crop protocol of the FNE paper)."""
        img = self.resize_image(img)
        w, h = img.size
        s = self.size
        boxes = [((w - s) // 2, (h - s) // 2)]
        if n_crops == 10:
            boxes = [(0, 0), (w - s, 0), (0, h - s), (w - s, h - s)] + boxes
        elif n_crops not in (1, 2):
            raise ValueError(f"n_crops must be 1, 2 or 10, got {n_crops}")
        out = [img.crop((x, y, x + s, y + s)) for x, y in boxes]
        if n_crops in (2, 10):
            out += [c.transpose(Image.FLIP_LEFT_RIGHT) for c in out]
        return out

    def __call__(self, img: Image.Image, n_crops: int = 1) -> torch.Tensor:
        """(3, H, W) for one crop, (n_crops, 3, H, W) otherwise."""
        crops = [self.to_tensor(c) for c in self.crops(img, n_crops)]
        return crops[0] if n_crops == 1 else torch.stack(crops)
