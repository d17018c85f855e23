"""Embedding shards: what a distributed run has finished, one crash-safe file per shard.

A shard folder holds ``plan.json`` (what is being embedded: checkpoint sha256, a digest of the item
list, the shard size) and one ``{kind}.s{NNNNN}.npz`` per finished shard with ``ids`` (positions in
the item list), ``vectors`` (float32) and, for images, ``failed_ids`` / ``failed_reasons``. Each
shard file is written through a temporary and renamed (``training/fsio``), so it is whole or absent:
a killed run resumes with exactly the shards that are missing. A plan that does not match the
folder's (another checkpoint or corpus) starts the folder afresh.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.errors import UserFileExists
from training.fsio import atomic_path, remove_stale_temps, write_json_atomic

log = logging.getLogger(__name__)

KINDS = ("images", "captions")


@dataclass(frozen=True)
class Shard:
    kind: str
    index: int
    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"{self.kind}.s{self.index:05d}.npz"


def items_digest(items: Sequence[str]) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(str(it).encode("utf-8", "replace") + b"\0")
    return h.hexdigest()


def plan_shards(counts: dict[str, int], shard_size: int, caption_shard_size: int | None = None) -> list[Shard]:
    """Image shards of ``shard_size`` items, caption shards of ``caption_shard_size`` (default the same)."""
    out = []
    for kind in KINDS:
        n, size = counts.get(kind, 0), (caption_shard_size or shard_size) if kind == "captions" else shard_size
        out += [Shard(kind, i, a, min(a + size, n)) for i, a in enumerate(range(0, n, size))]
    return out


def open_shard_dir(folder: Path, plan: dict) -> Path:
    """Create ``folder`` for ``plan``, or reuse it when it holds the same plan (a resumed run)."""
    folder = Path(folder)
    if (folder / "plan.json").is_file():
        try:
            old = json.loads((folder / "plan.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = None
        if old != plan:
            log.warning("%s holds shards of another run (checkpoint, items or shard size differ): starting afresh", folder)
            shutil.rmtree(folder)
    elif folder.exists() and any(folder.iterdir()):
        if not all(p.suffix == ".npz" or p.name.startswith(".") for p in folder.iterdir()):
            raise UserFileExists(f"{folder} exists and is not a shard folder; choose another --shards")
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(folder)
    write_json_atomic(folder / "plan.json", plan)
    return folder


def done(folder: Path, shards: Sequence[Shard]) -> set[str]:
    return {s.name for s in shards if (Path(folder) / s.name).is_file()}


def write_shard(folder: Path, shard: Shard, ids: np.ndarray, vectors: np.ndarray,
                failed: dict[int, str] | None = None) -> Path:
    path = Path(folder) / shard.name
    failed = failed or {}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, ids=np.asarray(ids, np.int64), vectors=np.asarray(vectors, np.float32),
                     failed_ids=np.asarray(sorted(failed), np.int64),
                     failed_reasons=np.asarray([failed[k] for k in sorted(failed)], dtype=str))
    return path


def read_shards(folder: Path, shards: Sequence[Shard], kind: str, dim: int) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """(ids, vectors, failed) of every shard of ``kind``, in item order."""
    ids, vecs, failed = [], [], {}
    for s in (s for s in shards if s.kind == kind):
        with np.load(Path(folder) / s.name, allow_pickle=False) as z:
            ids.append(z["ids"])
            vecs.append(z["vectors"])
            failed.update({int(i): str(r) for i, r in zip(z["failed_ids"], z["failed_reasons"])})
    if not ids:
        return np.zeros(0, np.int64), np.zeros((0, dim), np.float32), failed
    return np.concatenate(ids), np.concatenate(vecs).astype(np.float32), failed
