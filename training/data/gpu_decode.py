"""JPEG decoding on the GPU (NVIDIA nvImageCodec, extra ``gpu``), straight into the CNN's input batch.

On a GPU the CNN embeds thousands of images a second, and CPU JPEG decoding (``decode_pool.py``) cannot
keep up. Here a batch of files is read by a thread pool (the next batch while the current one decodes),
each header is checked on the CPU as ``load_image`` checks it (an allowed format, within the pixel budget:
nothing over budget reaches a decoder), the JPEGs are decoded together by nvImageCodec into device memory
(EXIF orientation applied), and resized, centre-cropped and normalised on the device; what is not a
JPEG, or does not decode there, goes through the CPU path and is copied up from pinned memory.

The resize is torch's antialiased bicubic, not Pillow's: pixels differ by a few levels, embeddings by a
cosine close to 1 (BENCHMARKS.md's GPU section, when measured); the feature cache keys this decoding
apart (``decode_key``). Importing this module never needs the package or a GPU: ``unavailable`` says why
the device path cannot run, and ``image_batches`` then uses the CPU path unchanged.
"""
from __future__ import annotations

import io
import itertools
import logging
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from training.data.decode_pool import ImageTransform, ImageViews, decoded_batches
from training.data.decode_pool import decode_key as cpu_decode_key
from training.data.images import ALLOWED_FORMATS, MAX_PIXELS, ImageError, Preprocess, load_image
from training.device import default_device
from training.env import environment

log = logging.getLogger(__name__)

try:  # the optional device path
    from nvidia import nvimgcodec
except (ImportError, OSError):  # absent, or its CUDA libraries are
    nvimgcodec = None


def unavailable(device: str | torch.device) -> str | None:
    """Why JPEGs for ``device`` cannot be decoded on it (None: they can)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"the model runs on {device.type}"
    if environment().gpu_decode == "off":
        return "LTD_GPU_DECODE=off"
    if nvimgcodec is None:
        return "nvImageCodec is not installed (pip install '.[gpu]')"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


@dataclass(frozen=True)
class ExtractionSpec:
    """How images are decoded into a model's batches (:func:`image_batches`, and the feature cache's
    ``training.features.extract_features``): ``n_views`` crops each, ``batch_size`` views a batch, decoded
    by ``workers`` processes (None: as many as help, 0: in this one), then ``transform`` (the synthetic
    shortcuts), which ``transform_id`` names in the feature cache's key; ``draft``: JPEGs decoded at a
    reduced size no smaller than the resize."""

    n_views: int = 1
    batch_size: int = 64
    workers: int | None = None
    transform: ImageTransform | None = None
    transform_id: str = ""
    draft: bool = False


def decode_key(draft: bool, gpu: bool) -> dict:
    """The feature cache's key addition for a decoding (``decode_pool.decode_key`` for the CPU ones)."""
    return {"decode": "gpu"} if gpu else cpu_decode_key(draft)


class GpuJpegDecoder:
    """Bytes of a batch of images → (N·V, 3, S, S) float tensors on the process's device
    (``training.device``), views as ``Preprocess.crops``."""

    def __init__(self, pre: Preprocess, *, n_views: int = 1, max_pixels: int = MAX_PIXELS):
        self.pre, self.n_views, self.max_pixels = pre, n_views, max_pixels
        self.device = torch.device(default_device())
        self.decoder = nvimgcodec.Decoder(device_id=self.device.index or 0)
        self.params = nvimgcodec.DecodeParams(apply_exif_orientation=True, color_spec=nvimgcodec.ColorSpec.RGB)
        self.mean = torch.tensor(pre.mean, device=self.device).view(3, 1, 1)
        self.std = torch.tensor(pre.std, device=self.device).view(3, 1, 1)

    def _checked(self, data: bytes, label: str) -> str:
        """The image's format, after the checks ``load_image`` makes before it decodes anything."""
        with Image.open(io.BytesIO(data)) as im:
            if im.format not in ALLOWED_FORMATS:
                raise ImageError(f"{label}: unsupported image type {im.format}")
            w, h = im.size
            if w * h > self.max_pixels or w < 1 or h < 1:
                raise ImageError(f"{label}: {w}x{h} pixels is outside the limit of {self.max_pixels:,}")
            return im.format

    def views(self, hwc: torch.Tensor) -> torch.Tensor:
        """(V, 3, S, S) normalised views of one (H, W, 3) uint8 image on the device."""
        x = hwc.permute(2, 0, 1).float()[None]
        h, w = x.shape[-2:]
        s = self.pre.resize / min(w, h)
        nw, nh = max(self.pre.size, round(w * s)), max(self.pre.size, round(h * s))
        if (nw, nh) != (w, h):
            x = F.interpolate(x, size=(nh, nw), mode="bicubic", antialias=True, align_corners=False)
        x = x.round().clamp(0, 255)[0] / 255.0  # Pillow's resize rounds to uint8 too
        c = self.pre.size
        boxes = [((nw - c) // 2, (nh - c) // 2)]
        if self.n_views == 10:
            boxes = [(0, 0), (nw - c, 0), (0, nh - c), (nw - c, nh - c)] + boxes
        crops = [x[:, y:y + c, x0:x0 + c] for x0, y in boxes]
        if self.n_views in (2, 10):
            crops += [v.flip(-1) for v in crops]
        return (torch.stack(crops) - self.mean) / self.std

    def batch(self, items: list[tuple[int, bytes | None, str]]):
        """(indices decoded, (N·V, 3, S, S) device tensor or None, [(index, reason)]) for (index, bytes, label)."""
        ok, bad, gpu, cpu = {}, [], [], []
        for i, data, label in items:
            try:
                if data is None:
                    raise ImageError(f"{label}: cannot be read")
                (gpu if self._checked(data, label) == "JPEG" else cpu).append((i, data, label))
            except ImageError as e:
                bad.append((i, str(e)))
            except Exception as e:  # Pillow's own errors on a header: not an image
                bad.append((i, f"{label}: not a recognised image file ({type(e).__name__})"))
        decoded = self.decoder.decode([nvimgcodec.CodeStream(d) for _, d, _ in gpu], params=self.params) if gpu else []
        if gpu:
            torch.cuda.synchronize(self.device)  # the decoder's stream has finished before torch reads its output
        for (i, data, label), img in zip(gpu, decoded):
            if img is None:
                cpu.append((i, data, label))  # nvImageCodec declined it: the CPU path decides
            else:
                ok[i] = self.views(torch.as_tensor(img, device=self.device))
        for i, data, label in cpu:
            try:
                views = self.pre(load_image(data, name=label, max_pixels=self.max_pixels), max(self.n_views, 1))
            except ImageError as e:
                bad.append((i, str(e)))
                continue
            views = views if views.dim() == 4 else views[None]
            ok[i] = views.pin_memory().to(self.device, non_blocking=True)
        idx = [i for i, _, _ in items if i in ok]
        return idx, (torch.cat([ok[i] for i in idx]) if idx else None), bad


def _read(source) -> bytes | None:
    """A file's (or a shard member's) bytes, None when they cannot be read."""
    try:
        return source.read_bytes() if hasattr(source, "read_bytes") else Path(source).read_bytes()
    except OSError:
        return None


def gpu_decoded_batches(paths: Sequence[Path], indices: Sequence[int], pre: Preprocess, *, n_views: int = 1,
                        batch_size: int = 64) -> Iterator[tuple[list[int], torch.Tensor | None, list]]:
    """``decoded_batches``'s contract, decoded on the process's device: the next batch's files are read meanwhile."""
    dec = GpuJpegDecoder(pre, n_views=n_views)
    per = max(1, batch_size // n_views)
    chunks = iter([list(indices[a:a + per]) for a in range(0, len(indices), per)])

    def read(chunk: list[int]):
        return [(i, _read(paths[i]), str(paths[i])) for i in chunk]
    with ThreadPoolExecutor(2) as pool:
        pending = deque(pool.submit(read, c) for c in itertools.islice(chunks, 2))
        while pending:
            items = pending.popleft().result()
            nxt = next(chunks, None)
            if nxt is not None:
                pending.append(pool.submit(read, nxt))
            yield dec.batch(items)


def image_batches(paths: Sequence[Path], indices: Sequence[int], pre: Preprocess,
                  spec: ExtractionSpec | None = None) -> Iterator[tuple[list[int], torch.Tensor | None, list]]:
    """Decoded batches for a model on the process's device (``training.device``), decoded as ``spec`` says
    (None: the defaults of :class:`ExtractionSpec`; its ``transform_id`` is not read here): on the GPU
    when :func:`uses_gpu`, else ``decoded_batches``."""
    s = spec if spec is not None else ExtractionSpec()
    if uses_gpu(s.transform):
        return gpu_decoded_batches(paths, indices, pre, n_views=s.n_views, batch_size=s.batch_size)
    return decoded_batches(ImageViews(paths, indices, pre, s.n_views, s.transform, s.draft), batch_size=s.batch_size,
                           workers=s.workers)


def uses_gpu(transform: ImageTransform | None = None) -> bool:
    """Whether ``image_batches`` decodes on the process's device (never with a shortcut transform: it works
    on PIL views)."""
    device = default_device()
    reason = unavailable(device)
    if reason is not None and torch.device(device).type == "cuda":
        log.info("JPEGs are decoded on the CPU: %s", reason)
    return reason is None and transform is None
