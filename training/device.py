"""The compute device of the process: a setting read where models are built and batches are placed, not
a parameter handed down the call stack.

    default_device()              # "cpu" unless set; "auto" reads as "cuda" when there is a GPU, else "cpu"
    set_device("cuda")            # for the whole process
    with using_device("cuda:1"):  # for a block: the earlier setting comes back after it
        ...

Who sets it: the training loops from ``train.device``, for the run (``training.loop.train``, the
captioner's ``train_captioner``); ``ltd train`` and ``ltd caption train`` from the same value for the
data-parallel launcher (``app.launch``); ``ltd index --device`` for its command (``app.cli.parser``); the
search service from its config, for the models it loads (``search.service``); a Ray embedding actor
from the driver's setting, which travels with the actor's set-up (``indexer.ray_engine``). Each
data-parallel rank is a process of its own with its own setting: on CUDA ``training.distributed`` makes
the rank's GPU torch's current one, so "cuda" there is that rank's GPU.

Like the progress setting (``training.progress``) it is module state behind a lock, not a context
variable: worker threads see it (a server's loading thread, a data loader's), and a block that changes
it changes it for every thread while it lasts — a process computes on one device.

``to_device(x, device)`` is the helper that takes a device: it puts a tensor, or a batch dict of them,
where a given model already is (``model.device``). A model's place is a fact about that model, which the
setting does not override (a benchmark compares a GPU copy of a model with a CPU one in one process).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from training.errors import Unavailable

_lock = threading.Lock()
_device = "cpu"  # as set: a torch device name or "auto"


def _checked(name: str | torch.device) -> str:
    name = str(name)
    if name != "auto":
        torch.device(name)  # a bad name fails where it is set, not at the first tensor
    return name


def default_device() -> str:
    """The device this process computes on: what was set ("cpu" by default), "auto" read as "cuda" when
    a GPU is visible and "cpu" otherwise."""
    with _lock:
        name = _device
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def set_device(name: str | torch.device) -> None:
    """Compute on ``name`` (a torch device name, or "auto") from now on, in every thread."""
    global _device
    name = _checked(name)
    with _lock:
        _device = name


@contextmanager
def using_device(name: str | torch.device) -> Iterator[None]:
    """Compute on ``name`` while the block runs (in every thread); the earlier setting comes back after."""
    global _device
    name = _checked(name)
    with _lock:
        before, _device = _device, name
    try:
        yield
    finally:
        with _lock:
            _device = before


def pick_device(name: str) -> torch.device:
    """``train.device`` as a torch device: "auto" → CUDA when there is a GPU, else the CPU; Unavailable for
    "cuda" without one."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise Unavailable("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def to_device(x, device: str | torch.device):
    """``x`` on ``device``: a tensor (a CPU one goes to a GPU through pinned memory, asynchronously), or a
    batch dict, whose tensors are moved (asynchronously) and other values kept."""
    if isinstance(x, dict):
        return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in x.items()}
    device = torch.device(device)
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)
