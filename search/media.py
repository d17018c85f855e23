"""Images in and out: uploaded bytes → model input under a memory budget, and thumbnails.

An upload is refused unless its first bytes name an accepted image type; it then decodes within a
pixel budget (a JPEG at reduced DCT scale first, its short side kept at least twice the model's input,
so a 40-megapixel photo never decodes at full size), at most ``max_concurrent`` at a time, and after
a large decode the freed heap is handed back to the OS. Thumbnails are JPEGs kept in an LRU cache,
and (for galleries that serve files) written once to a private folder (search/files.py).
"""
from __future__ import annotations

import ctypes
import hashlib
import io
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from search.errors import BadRequest, Busy, NotFound, Unsupported, UnsupportedMediaType, redact_paths
from search.files import is_own_file, open_served, sniff_image_type, write_private
from search.registry import ModelEntry
from training.data.images import ImageError, load_image
from training.data.members import ImageMember
from training.env import default_cache_dir, environment
from training.fsio import private_folder_or_temp

ACCEPTED = "JPEG, PNG, WebP, BMP, GIF, TIFF"
_BIG_DECODE = 4_000_000  # pixels: after a decode this large, give the freed memory back


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc), so a burst of large decodes does not leave the
    server's resident size at its peak."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class UploadDecoder:
    """Uploaded bytes → the model's input tensor (views as the feature cache takes them)."""

    def __init__(self, *, max_pixels: int = 16_000_000, max_concurrent: int = 2):
        self.max_pixels = max_pixels
        # Each decode may hold max_pixels × 4 bytes while it runs.
        self._slots = threading.BoundedSemaphore(max(1, max_concurrent))

    def decode(self, data: bytes, min_side: int):
        """An RGB PIL image of the upload, decoded within the budget (a JPEG at reduced scale, its
        short side at least ``min_side``); at most ``max_concurrent`` decodes at a time."""
        if not data:
            raise BadRequest("the uploaded file is empty")
        if sniff_image_type(data) is None:
            raise UnsupportedMediaType(f"the upload is not an image of an accepted type ({ACCEPTED})")
        if not self._slots.acquire(timeout=30):
            raise Busy("too many image uploads are being decoded at once; try again shortly")
        try:
            img = load_image(data, name="upload", max_pixels=self.max_pixels, min_side=min_side)
        except ImageError as err:
            raise BadRequest(str(err)) from None
        finally:
            self._slots.release()
        if img.width * img.height >= _BIG_DECODE:  # shrink it now and give the decode's memory back
            img.thumbnail((4 * min_side, 4 * min_side))
            release_free_memory()
        return img

    def tensor(self, entry: ModelEntry, data: bytes) -> torch.Tensor:
        """The model's input for an upload (views as the feature cache takes them)."""
        backbone = entry.model.image.backbone
        if backbone is None:
            raise Unsupported(f"model {entry.name} was trained on precomputed features and has no image backbone; "
                              "search with a dataset image id instead")
        return entry.model.image.prepare([self.decode(data, 2 * backbone.preprocess.resize)])


def default_thumb_dir() -> Path:
    """``$LTD_UI_THUMBS``, else ``ui-thumbs`` in the cache folder ($LTD_CACHE_DIR or ~/.cache/ltd): never a
    shared, predictable temporary folder."""
    return Path(environment().ui_thumbs or default_cache_dir() / "ui-thumbs")


def load_served(path: Path | ImageMember, what: str = "the image"):
    """A served image (``SearchService.image_path``'s, resolved and confined) decoded from the file that
    was checked (search/files.py ``open_served``), not from whatever its name leads to by now."""
    with open_served(path, what) as f:
        return load_image(path.read_from(f) if isinstance(path, ImageMember) else f, name=str(path))


class Thumbnails:
    """JPEG thumbnails of image files, in an LRU cache of ``capacity`` entries (thread-safe)."""

    def __init__(self, capacity: int = 2048, folder: Path | None = None):
        self.capacity = capacity
        self.folder = folder or default_thumb_dir()
        self._checked: tuple[Path, Path] | None = None  # (folder asked for, private folder used)
        self._cache: OrderedDict[tuple, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def private_folder(self) -> Path:
        """The folder thumbnail files go to: ``folder`` once checked private (created 0700), or a
        private temporary folder when it cannot be (training/fsio.py)."""
        with self._lock:
            if self._checked is None or self._checked[0] != self.folder:
                self._checked = (self.folder, private_folder_or_temp(self.folder, "ltd-ui-thumbs-"))
            return self._checked[1]

    def jpeg(self, key: tuple, path: Path, size: int) -> bytes:
        """The thumbnail of ``path`` whose longest side is ``size`` (32–1024), cached under ``key``."""
        size = max(32, min(int(size), 1024))
        key = (*key, size)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            img = load_served(path)
        except (ImageError, OSError) as err:
            raise NotFound(f"image cannot be read: {redact_paths(str(err))}") from None
        img.thumbnail((size, size))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=85)
        data = buf.getvalue()
        with self._lock:
            self._cache[key] = data
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return data

    def file(self, key: tuple, path: Path, size: int) -> Path:
        """The thumbnail written to the private thumbnails folder (for UI galleries, which serve files).
        Its name is a hash: nothing a client sends becomes part of a file name."""
        data = self.jpeg(key, path, size)
        name = hashlib.sha256(repr((*key, size)).encode()).hexdigest()[:24]
        out = self.private_folder() / f"{name}_{hashlib.sha1(data).hexdigest()[:16]}.jpg"
        if not is_own_file(out, len(data)):
            write_private(out, data)  # a cache: rebuilt when lost
        return out
