"""JPEG decoding in worker processes, overlapped with inference: batches of preprocessed views.

``decoded_batches`` yields ``(positions, tensor, failures)`` per batch while worker processes decode
the next ones (``prefetch`` batches in flight per worker), so the CNN never waits for Pillow unless
decoding is the slower of the two. The workers are a forked process pool rather than a torch
DataLoader: the DataLoader installs a Python SIGCHLD handler in the caller, and with OpenVINO, Ray and
ONNX Runtime loaded beside it, the delivery of that signal killed the test process (SIGSEGV, si_code
SI_KERNEL: the kernel failed to set up the handler's frame) when any later child exited. Forked, not
started by a fork server: a fork server re-imports the caller's ``__main__`` (a user's unguarded script
would run again) and takes seconds to start a pool, which the Ray engine does once per shard. The
workers only decode (JPEGs through libjpeg-turbo's own API when simplejpeg is installed, else Pillow:
``jpeg.py``) and use one torch thread. ``draft=True`` lets a large JPEG decode at a reduced DCT
scale (Pillow's draft mode, ``load_image(min_side=…)``) whose short side stays ≥ the preprocessing's
resize side; it changes the pixels the model sees slightly, so the feature cache keys it separately
(``decode_key``).
"""
from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from PIL import Image

from training.data.images import ImageError, Preprocess, load_image

# (image index, view) -> view, applied to every view after cropping (synthetic shortcuts)
ImageTransform = Callable[[int, Image.Image], Image.Image]


class RenumberedTransform:
    """A transform keyed by dataset image index, for a list of paths whose positions are not those
    indices (a split's images); picklable when ``transform`` is (worker processes get a copy)."""

    def __init__(self, transform: ImageTransform, image_ids: Sequence[int]):
        self.transform, self.image_ids = transform, [int(i) for i in image_ids]

    def __call__(self, position: int, view: Image.Image) -> Image.Image:
        return self.transform(self.image_ids[position], view)


def decode_key(draft: bool) -> dict:
    """What the feature cache must add to its key for this decoding (nothing for full decoding, so
    the keys written before draft decoding existed stay valid)."""
    return {"decode": "draft"} if draft else {}


class ImageViews(torch.utils.data.Dataset):
    """Item i = (index, (V, 3, S, S) views or None, error) for ``paths[indices[i]]``: the images to decode,
    how (``pre``, ``n_views`` crops each, then ``transform``; ``draft``: JPEGs decoded at a reduced size
    no smaller than the resize), as :func:`decoded_batches` batches them."""

    def __init__(self, paths: Sequence[Path], indices: Sequence[int], pre: Preprocess, n_views: int = 1,
                 transform: ImageTransform | None = None, draft: bool = False):
        self.paths, self.indices, self.pre, self.n_views = paths, [int(i) for i in indices], pre, n_views
        self.transform, self.min_side = transform, (pre.resize if draft else 0)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        idx = self.indices[i]
        try:
            views = self.pre.crops(load_image(self.paths[idx], min_side=self.min_side), self.n_views)
        except ImageError as e:
            return idx, None, str(e)
        except Exception as e:  # a long run never dies on one odd file
            return idx, None, f"{self.paths[idx]}: {type(e).__name__}: {e}"
        if self.transform is not None:  # outside the try: a failing transform is a bug, not a bad file,
            views = [self.transform(idx, v) for v in views]  # and must stop the run, not mark images failed
        return idx, torch.stack([self.pre.to_tensor(v) for v in views]), ""


def collate_views(items):
    ok = [(i, t) for i, t, err in items if t is not None]
    bad = [(i, err) for i, t, err in items if t is None]
    idx = [i for i, _ in ok]
    x = torch.cat([t for _, t in ok]) if ok else None
    return idx, x, bad


def default_workers(n_items: int, batch_size: int, threads: int | None = None) -> int:
    """Decoding processes beside ``threads`` inference threads (default: one per core): one per two
    threads plus one (2 on 2 cores; 1 for a 1-thread Ray actor), none for a single batch or on a
    single-core machine. Decoding a 640×480 JPEG costs about half as much CPU as the CNN step on it,
    so one decoder starves a fast engine: on 2 cores OpenVINO's pinned streams left a quarter of the
    CPU idle with one decoder (108 → 135 images/s with two; torch and ONNX Runtime, which already kept
    both cores busy, neither gained nor lost; BENCHMARKS.md "Image embedding engines"). A decoder with
    nothing to do blocks on the prefetch queue and costs nothing."""
    cores = os.cpu_count() or 1
    return (threads or cores) // 2 + 1 if cores > 1 and n_items > batch_size else 0


_WORKER_VIEWS: ImageViews | None = None  # the dataset a pool worker decodes from (set by its initializer)


def _init_worker(views: ImageViews) -> None:
    global _WORKER_VIEWS
    torch.set_num_threads(1)
    _WORKER_VIEWS = views


def _decode_chunk(start: int, stop: int):
    assert _WORKER_VIEWS is not None
    idx, x, bad = collate_views([_WORKER_VIEWS[i] for i in range(start, stop)])
    return idx, (x.numpy() if x is not None else None), bad  # numpy pickles as plain bytes


def decoded_batches(views: ImageViews, *, batch_size: int = 64, workers: int | None = None,
                    prefetch: int = 4) -> Iterator[tuple[list[int], torch.Tensor | None, list]]:
    """Batches of ``batch_size // views.n_views`` images of ``views``: (indices decoded, (n·V, 3, S, S)
    tensor, [(index, reason)]), decoded by ``workers`` processes (None: as many as help, 0: in this one)."""
    if workers is None:
        workers = default_workers(len(views), batch_size)
    per = max(1, batch_size // views.n_views)
    chunks = [(i, min(i + per, len(views))) for i in range(0, len(views), per)]
    if not workers:
        for start, stop in chunks:
            yield collate_views([views[i] for i in range(start, stop)])
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_init_worker,
                               initargs=(views,))
    try:
        todo, pending = iter(chunks), deque()
        for start, stop in todo:
            pending.append(pool.submit(_decode_chunk, start, stop))
            if len(pending) >= workers * prefetch:
                break
        while pending:
            idx, x, bad = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(_decode_chunk, *nxt))
            yield idx, (torch.from_numpy(x) if x is not None else None), bad
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
