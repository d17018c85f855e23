"""Arrays derived from an index (split-wide word occlusion, embedding maps), computed once and kept
next to the index's data as ``STEM.gNNNN.npz``.

Whole or absent: written through a temporary file and a rename (training/fsio.py), read with
``allow_pickle=False`` (plain arrays only), and recomputed when unreadable, of another format
version, or of another checkpoint. One process computes at a time (an ``flock`` beside the file);
another waits and then reads its result. An index folder that cannot be written (served from a
read-only mount) still gets the arrays, kept in memory only.
"""
from __future__ import annotations

import contextlib
import logging
import zipfile
from collections.abc import Callable

import numpy as np

from indexer.index import IndexDir
from training.fsio import atomic_path, exclusive, remove_stale_temps

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]


def _read(path, version: int, checkpoint: str) -> Arrays | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        log.warning("%s is unreadable (%s): computing it again", path, e)
        return None
    meta_ok = int(arrays.pop("_version", -1)) == version and str(arrays.pop("_checkpoint", "")) == checkpoint
    return arrays if meta_ok else None


def cached_arrays(ix: IndexDir, stem: str, version: int, compute: Callable[[], Arrays]) -> Arrays:
    """The arrays ``compute()`` returns for this index generation, from the file when it holds them."""
    path = ix.derived_path(stem, "npz")
    checkpoint = str(ix.manifest.get("checkpoint_sha256", ""))
    if path.is_file() and (hit := _read(path, version, checkpoint)) is not None:
        return hit
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exclusive(path.with_name(f".{stem}.lock"), str(path)))
            writable = True
        except OSError:  # a read-only index folder: compute, keep in memory
            writable = False
        if writable and path.is_file() and (hit := _read(path, version, checkpoint)) is not None:
            return hit  # another process finished it while this one waited
        arrays = compute()
        if writable:
            with contextlib.suppress(OSError):
                remove_stale_temps(path.parent)
            _write(path, arrays, version, checkpoint)
        return arrays


def _write(path, arrays: Arrays, version: int, checkpoint: str) -> None:
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:  # an open file: np.savez would otherwise append ".npz" to the name
                np.savez(f, _version=np.int64(version), _checkpoint=np.str_(checkpoint), **arrays)
    except OSError as e:
        log.warning("cannot write %s (%s): kept in memory only", path, e)
