"""The reading side of an item store (indexer/items.py): what a search asks of ``items.sqlite``.

Two connections of their own, never the writer's: one answers "did anything change" (``data_version``,
``seqs_after``), the other reads rows (``metadata``, ``changes_since``), each query in one read
transaction of WAL mode. They see committed rows only, one consistent snapshot per call, and never wait
for a write's transaction (a write holds the writer connection's lock while it embeds and commits).
"""
from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Changes:
    """What changed after a seq: rows added (with vectors), ids removed, metadata edited."""

    seq: int
    images: list[dict]  # added: id, sha256, path, filename, metadata, vector
    captions: list[dict]  # added: id, image_id, text, model_text, vector
    removed_images: list[int]
    removed_captions: list[int]
    edited: dict[int, dict]  # image id → its whole metadata now


def connect(db: Path) -> sqlite3.Connection:
    """A connection to ``db`` usable from any thread, autocommit unless a transaction is begun."""
    conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _vec(b: bytes | None) -> np.ndarray | None:
    return None if b is None else np.frombuffer(b, dtype=np.float32).copy()


class StoreReader:
    """Reads of one ``items.sqlite`` that never wait for its writes. Thread-safe."""

    def __init__(self, db: Path):
        self._watch, self._reader = connect(db), connect(db)
        self._watch_lock, self._reader_lock = threading.Lock(), threading.Lock()

    def data_version(self) -> int:
        """Changes when anything was committed since the last call, by any connection or process."""
        with self._watch_lock:
            return int(self._watch.execute("PRAGMA data_version").fetchone()[0])

    def seqs_after(self, seq: int, limit: int) -> list[int]:
        """The first ``limit`` writes committed after ``seq``."""
        with self._watch_lock:
            rows = self._watch.execute("SELECT seq FROM writes WHERE seq>? ORDER BY seq LIMIT ?", (seq, limit))
            return [int(r[0]) for r in rows]

    @contextmanager
    def _reading(self):
        """The reader connection in one read transaction: a consistent view of what was committed."""
        with self._reader_lock:
            self._reader.execute("BEGIN")
            try:
                yield self._reader
            finally:
                self._reader.execute("COMMIT")

    def metadata(self, ids: list[int] | None = None) -> dict[int, dict]:
        """id → metadata of live images (all of them, or ``ids``)."""
        with self._reading() as c:
            if ids is None:
                rows = c.execute("SELECT id, metadata FROM images WHERE deleted_seq IS NULL").fetchall()
            else:
                marks = ",".join("?" * len(ids))
                rows = c.execute(f"SELECT id, metadata FROM images WHERE deleted_seq IS NULL AND id IN ({marks})",
                                 [int(i) for i in ids]).fetchall()
        return {int(i): json.loads(m) for i, m in rows}

    def changes_since(self, seq: int) -> Changes:
        """Everything committed after ``seq`` (added rows come with their vectors, oldest first)."""
        with self._reading() as c:
            last = int(c.execute("SELECT MAX(seq) FROM writes").fetchone()[0] or 0)
            images = [dict(id=int(r[0]), sha256=r[1], path=r[2], filename=r[3], metadata=json.loads(r[4]),
                           vector=_vec(r[5]))
                      for r in c.execute("SELECT id, sha256, path, filename, metadata, vector FROM images WHERE "
                                         "added_seq>? AND added_seq<=? ORDER BY added_seq, id", (seq, last))]
            captions = [dict(id=int(r[0]), image_id=r[1], text=r[2], model_text=r[3] or r[2], vector=_vec(r[4]))
                        for r in c.execute("SELECT id, image_id, text, model_text, vector FROM captions WHERE "
                                           "added_seq>? AND added_seq<=? ORDER BY added_seq, id", (seq, last))]
            gone_i = [int(r[0]) for r in c.execute("SELECT id FROM images WHERE deleted_seq>? AND deleted_seq<=?",
                                                   (seq, last))]
            gone_c = [int(r[0]) for r in c.execute("SELECT id FROM captions WHERE deleted_seq>? AND deleted_seq<=?",
                                                   (seq, last))]
            edited = {int(r[0]): json.loads(r[1]) for r in c.execute(  # rows added in the window come whole above
                "SELECT id, metadata FROM images WHERE edited_seq>? AND edited_seq<=? AND added_seq<=? AND "
                "deleted_seq IS NULL", (seq, last, seq))}
        return Changes(last, images, captions, gone_i, gone_c, edited)

    def close(self) -> None:
        self._watch.close()
        self._reader.close()
