"""The item store of a living index: an index directory's items, their metadata and what changed since
its last generation, in SQLite (``items.sqlite`` beside the generation files, WAL mode).

An index directory is a base generation (immutable files, indexer/index.py) plus this store. The store
holds a row for every image and caption of the base (its id, metadata, whether it was removed) and,
for what was added since, the embedding too. Every write is one SQLite transaction with
``synchronous=FULL``: when it returns it is on disk (durable), and a process killed at any point
leaves it wholly there or wholly absent. Each write takes the next number of the ``writes`` table (its
*seq*); a reader that has seen seq S asks for what changed after S (``changes_since``).

- An image's id is stable and never reused: new ids come from ``next_image_id`` (past every id the
  index ever had). Adding an image whose bytes are already there (same sha256, not removed) is a no-op
  that answers the existing id.
- A removal sets ``deleted_seq`` (a tombstone): readers stop returning the item at once; compaction
  (indexer/compact.py) writes the next generation without it and then drops its rows here.
- ``folded_seq``: the last write the base generation contains. After compaction commits generation
  g + 1 (whose manifest records ``items_seq``), ``fold`` drops the embeddings and tombstones up to
  that seq; a kill between the two is finished by the next ``open`` (it reads the manifest).

Uploaded image files live under ``items/`` in the index directory, named by their sha256, written
whole before the transaction that names them; a file no row names (a write killed before its commit)
is removed by ``open``.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.caption_texts import model_texts
from indexer.index import IndexDir, IndexDirError
from indexer.item_reads import Changes, StoreReader, connect
from training.fsio import atomic_write_bytes

log = logging.getLogger(__name__)

DB = "items.sqlite"
FILES = "items"
SCHEMA = 1
ORPHAN_AGE = 600.0  # seconds: an unreferenced upload younger than this may belong to a write in flight
OWN_FILES = frozenset({DB, f"{DB}-wal", f"{DB}-shm", f"{DB}-journal", FILES, ".compact.lock"})
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS writes (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL, at REAL NOT NULL,
                                   detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS images (
    id INTEGER PRIMARY KEY, sha256 TEXT, path TEXT, filename TEXT, metadata TEXT NOT NULL DEFAULT '{}',
    added_seq INTEGER NOT NULL, edited_seq INTEGER NOT NULL, deleted_seq INTEGER, vector BLOB);
CREATE UNIQUE INDEX IF NOT EXISTS images_sha ON images(sha256) WHERE deleted_seq IS NULL AND sha256 IS NOT NULL;
CREATE INDEX IF NOT EXISTS images_changed ON images(edited_seq);
CREATE TABLE IF NOT EXISTS captions (
    id INTEGER PRIMARY KEY, image_id INTEGER, text TEXT NOT NULL, model_text TEXT,
    added_seq INTEGER NOT NULL, deleted_seq INTEGER, vector BLOB);
CREATE INDEX IF NOT EXISTS captions_image ON captions(image_id);
CREATE INDEX IF NOT EXISTS captions_added ON captions(added_seq);
"""


@dataclass
class NewImage:
    """An image to add, embedded: its vector, where its file is, and its captions (embedded too)."""

    vector: np.ndarray
    sha256: str | None
    path: str
    filename: str
    metadata: dict = field(default_factory=dict)
    captions: list[tuple[str, str, np.ndarray]] = field(default_factory=list)  # (text, model text, vector)


def _blob(v: np.ndarray) -> bytes:
    return np.ascontiguousarray(v, dtype=np.float32).tobytes()


def store_upload(folder: Path, sha256: str, suffix: str, data: bytes) -> Path:
    """An uploaded image, whole on disk before any transaction names it: ``folder`` (an item store's
    ``items/``) ``/ab/abcd….jpg``, named by its sha256, so a second copy of the same bytes is not written.
    Also called by the write embedder process (search/embed_process.py), which has the bytes."""
    path = folder / sha256[:2] / f"{sha256}{suffix}"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    return path


class ItemStore:
    """One index directory's ``items.sqlite``. Thread-safe; several processes may use the same store
    (SQLite locks it: one writer at a time). Writes go through one connection, serialised by a lock; the
    reads a search makes (``data_version``, ``metadata``, ``changes_since``) go through a
    ``StoreReader`` (indexer/item_reads.py): they never wait for a write's transaction."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.index_path, self.conn = Path(path), conn
        self._lock = threading.RLock()
        self.reads: StoreReader | None = None  # opened once the schema exists (open)
        # Writes of this process committed (or committing) but not yet applied by their writer, which
        # applies them before it answers: a search need not wait for them (search/live.py, refresh).
        self.in_flight: set[int] = set()
        self._tx_seqs: list[int] = []

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, ix: IndexDir, *, create: bool = True) -> ItemStore | None:
        """The store of ``ix`` (None when it has none and ``create`` is false); a new one is seeded with
        the base generation's items. Finishes a fold a killed compaction left, removes unreferenced
        uploads, and refuses a store that belongs to another build of the folder."""
        db = ix.path / DB
        if not db.exists() and not create:
            return None
        conn = connect(db)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        store = cls(ix.path, conn)
        with store.transaction():  # DDL is transactional in SQLite: a killed creation leaves no store
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            if store.get_meta("schema") is None:
                store._seed(ix)
        if store.get_meta("schema") != str(SCHEMA):
            raise IndexDirError(f"{db} is item store schema {store.get_meta('schema')}; this ltd reads {SCHEMA}")
        store.reads = StoreReader(db)
        store._match_base(ix)
        store.remove_orphan_files()
        return store

    def _has_tables(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE name='images'").fetchone() is not None

    def _seed(self, ix: IndexDir) -> None:
        """Rows for every item of the base generation (no vectors: the base holds them)."""
        im, cap = ix.images.meta, ix.captions.meta
        n = len(im["ids"])
        metas = im.get("metadata") or [None] * n
        shas = im.get("sha256") or [None] * n
        paths, names = im.get("paths") or [None] * n, im.get("filenames") or [None] * n
        self.conn.executemany(
            "INSERT INTO images (id, sha256, path, filename, metadata, added_seq, edited_seq) VALUES (?,?,?,?,?,0,0)",
            ((int(i), shas[k], paths[k], names[k], json.dumps(metas[k] or {})) for k, i in enumerate(im["ids"])))
        links, texts = cap.get("image") or [None] * len(cap["ids"]), cap.get("texts") or []
        encoded = model_texts(cap) if texts else [None] * len(cap["ids"])
        img_ids = im["ids"]
        self.conn.executemany(
            "INSERT INTO captions (id, image_id, text, model_text, added_seq) VALUES (?,?,?,?,0)",
            ((int(c), int(img_ids[links[k]]) if links[k] is not None and links[k] >= 0 else None, texts[k],
              encoded[k]) for k, c in enumerate(cap["ids"])))
        next_image = max([int(i) for i in im["ids"]] or [-1]) + 1
        next_caption = max([int(i) for i in cap["ids"]] or [-1]) + 1
        for key, value in (("schema", SCHEMA), ("next_image_id", next_image), ("next_caption_id", next_caption),
                           ("folded_seq", 0), ("base_created", ix.manifest.get("created", "")),
                           ("base_generation", ix.generation)):
            self.set_meta(key, value)
        log.info("%s: item store created for %d images and %d captions", ix.path.name, n, len(cap["ids"]))

    def _match_base(self, ix: IndexDir) -> None:
        """The store must describe this build of the folder; finish a fold the manifest is ahead of."""
        if self.get_meta("base_created") != str(ix.manifest.get("created", "")):
            raise IndexDirError(f"{ix.path}: {DB} belongs to another build of this folder (rebuilt with --overwrite "
                                f"while it held items added through the API); move {DB} away to start afresh")
        seq = int(ix.manifest.get("items_seq") or 0)
        if seq > self.folded_seq:
            self.fold(seq, ix.generation)
        elif seq < self.folded_seq:
            raise IndexDirError(f"{ix.path}: {DB} has folded writes up to {self.folded_seq} but the manifest's "
                                f"generation holds only up to {seq} (an older manifest put back?)")

    # ---- small helpers -------------------------------------------------------------------------
    def transaction(self):
        return _Transaction(self)

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, str(value)))

    @property
    def folded_seq(self) -> int:
        return int(self.get_meta("folded_seq") or 0)

    def last_seq(self) -> int:
        row = self.conn.execute("SELECT MAX(seq) FROM writes").fetchone()
        return int(row[0] or 0)

    def data_version(self) -> int:
        """Changes when anything was committed since the last call (this store's writes too)."""
        return self.reads.data_version()

    def seqs_after(self, seq: int, limit: int) -> list[int]:
        """The first ``limit`` writes committed after ``seq``."""
        return self.reads.seqs_after(seq, limit)

    def applied(self, seq: int) -> None:
        """The served snapshot holds every write up to ``seq``: they are no longer in flight."""
        self.in_flight.difference_update([s for s in list(self.in_flight) if s <= seq])

    def _write(self, op: str, detail: str = "") -> int:
        cur = self.conn.execute("INSERT INTO writes (op, at, detail) VALUES (?, ?, ?)", (op, time.time(), detail))
        seq = int(cur.lastrowid)
        self._tx_seqs.append(seq)
        self.in_flight.add(seq)
        return seq

    def _next_id(self, key: str, n: int) -> int:
        first = int(self.get_meta(key))
        self.set_meta(key, first + n)
        return first

    # ---- writes --------------------------------------------------------------------------------
    def add(self, images: list[NewImage]) -> tuple[int, list[tuple[int, bool]]]:
        """Add images (and their captions) in one durable transaction: (seq, [(id, added?)]); an image
        whose sha256 is already there is not added again and answers the existing id."""
        with self.transaction():
            seq, out = self._write("add", f"{len(images)} image(s)"), []
            for item in images:
                row = self.conn.execute("SELECT id FROM images WHERE sha256=? AND deleted_seq IS NULL",
                                        (item.sha256,)).fetchone() if item.sha256 else None
                if row is not None:
                    out.append((int(row[0]), False))
                    continue
                image_id = self._next_id("next_image_id", 1)
                self.conn.execute("INSERT INTO images (id, sha256, path, filename, metadata, added_seq, edited_seq, "
                                  "vector) VALUES (?,?,?,?,?,?,?,?)",
                                  (image_id, item.sha256, item.path, item.filename, json.dumps(item.metadata), seq, seq,
                                   _blob(item.vector)))
                self._add_captions(image_id, item.captions, seq)
                out.append((image_id, True))
        return seq, out

    def _add_captions(self, image_id: int, captions: list[tuple[str, str, np.ndarray]], seq: int) -> None:
        if not captions:
            return
        first = self._next_id("next_caption_id", len(captions))
        self.conn.executemany(
            "INSERT INTO captions (id, image_id, text, model_text, added_seq, vector) VALUES (?,?,?,?,?,?)",
            ((first + j, image_id, text, model_text if model_text != text else None, seq, _blob(v))
             for j, (text, model_text, v) in enumerate(captions)))

    def add_captions(self, captions: list[tuple[str, str, np.ndarray]]) -> int:
        """Captions of no image (a corpus's captions file), in one durable transaction: the seq."""
        with self.transaction():
            seq = self._write("add", f"{len(captions)} caption(s)")
            first = self._next_id("next_caption_id", len(captions))
            self.conn.executemany(
                "INSERT INTO captions (id, image_id, text, model_text, added_seq, vector) VALUES (?,NULL,?,?,?,?)",
                ((first + j, text, model_text if model_text != text else None, seq, _blob(v))
                 for j, (text, model_text, v) in enumerate(captions)))
        return seq

    def caption_texts(self) -> set[str]:
        """The texts of the live captions."""
        return {r[0] for r in self.conn.execute("SELECT text FROM captions WHERE deleted_seq IS NULL")}

    def remove(self, image_ids: list[int]) -> tuple[int, list[int]]:
        """Tombstone images and their captions: (seq, the ids that were there). Their uploaded files go
        once the transaction is durable."""
        with self.transaction():
            seq = self._write("remove", f"{len(image_ids)} image(s)")
            rows = [self.conn.execute("SELECT id, path FROM images WHERE id=? AND deleted_seq IS NULL",
                                      (int(i),)).fetchone() for i in image_ids]
            found = [(int(r[0]), r[1]) for r in rows if r is not None]
            self.conn.executemany("UPDATE images SET deleted_seq=? WHERE id=?", ((seq, i) for i, _ in found))
            self.conn.executemany("UPDATE captions SET deleted_seq=? WHERE image_id=? AND deleted_seq IS NULL",
                                  ((seq, i) for i, _ in found))
        self.remove_files_of([p for _, p in found])
        return seq, [i for i, _ in found]

    def edit(self, image_id: int, metadata: dict | None = None,
             captions: list[tuple[str, str, np.ndarray]] | None = None) -> int:
        """Replace an image's metadata and/or captions (old captions are tombstoned, new ones added)."""
        with self.transaction():
            if not self.conn.execute("SELECT 1 FROM images WHERE id=? AND deleted_seq IS NULL", (image_id,)).fetchone():
                raise KeyError(image_id)
            seq = self._write("edit", str(image_id))
            if metadata is not None:
                self.conn.execute("UPDATE images SET metadata=?, edited_seq=? WHERE id=?",
                                  (json.dumps(metadata), seq, image_id))
            if captions is not None:
                self.conn.execute("UPDATE captions SET deleted_seq=? WHERE image_id=? AND deleted_seq IS NULL",
                                  (seq, image_id))
                self._add_captions(image_id, captions, seq)
                self.conn.execute("UPDATE images SET edited_seq=? WHERE id=?", (seq, image_id))
        return seq

    def fold(self, seq: int, generation: int) -> None:
        """After generation ``generation`` (holding every write up to ``seq``) committed: drop the
        embeddings it now holds and the rows it no longer has."""
        with self.transaction():
            self.conn.execute("UPDATE images SET vector=NULL WHERE added_seq<=? AND vector IS NOT NULL", (seq,))
            self.conn.execute("UPDATE captions SET vector=NULL WHERE added_seq<=? AND vector IS NOT NULL", (seq,))
            self.conn.execute("DELETE FROM images WHERE deleted_seq<=?", (seq,))
            self.conn.execute("DELETE FROM captions WHERE deleted_seq<=?", (seq,))
            self.set_meta("folded_seq", seq)
            self.set_meta("base_generation", generation)
        self.remove_orphan_files()

    # ---- reads ---------------------------------------------------------------------------------
    def metadata(self, ids: list[int] | None = None) -> dict[int, dict]:
        """id → metadata of live images (all of them, or ``ids``)."""
        return self.reads.metadata(ids)

    def changes_since(self, seq: int) -> Changes:
        """Everything committed after ``seq`` (added rows come with their vectors, oldest first)."""
        return self.reads.changes_since(seq)

    def pending(self) -> dict[str, int]:
        """Rows not yet in the base generation: added, and removed."""
        c = self.conn
        return {"added": c.execute("SELECT COUNT(*) FROM images WHERE vector IS NOT NULL").fetchone()[0],
                "removed": c.execute("SELECT COUNT(*) FROM images WHERE deleted_seq IS NOT NULL").fetchone()[0]}

    # ---- uploaded files ------------------------------------------------------------------------
    def files_folder(self) -> Path:
        return self.index_path / FILES

    def store_file(self, sha256: str, suffix: str, data: bytes) -> Path:
        """An uploaded image, whole on disk under ``items/`` before any transaction names it."""
        return store_upload(self.files_folder(), sha256, suffix, data)

    def remove_orphan_files(self, min_age: float = ORPHAN_AGE) -> int:
        """Delete files under ``items/`` that no live row names: uploads of adds killed before their
        commit, and removed images (at once, not only at compaction: a takedown takes the file too).
        Only files older than ``min_age`` seconds: another process may be between storing a file and
        committing the row that names it."""
        folder = self.files_folder()
        if not folder.is_dir():
            return 0
        named = {r[0] for r in self.conn.execute("SELECT path FROM images WHERE path IS NOT NULL AND deleted_seq IS NULL")}
        removed, now = 0, time.time()
        for p in folder.rglob("*"):
            try:
                old = now - p.stat().st_mtime >= min_age
            except OSError:
                continue
            if p.is_file() and old and str(p) not in named:
                p.unlink(missing_ok=True)
                removed += 1
        return removed

    def remove_files_of(self, paths: list[str]) -> None:
        """Delete the uploaded files of images just removed (only files under ``items/``)."""
        root = self.files_folder().resolve()
        for p in paths:
            if p and Path(p).resolve().is_relative_to(root):
                Path(p).unlink(missing_ok=True)

    def close(self) -> None:
        self.conn.close()
        if self.reads is not None:
            self.reads.close()


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on an exception), re-entrant within a thread."""

    def __init__(self, store: ItemStore):
        self.store = store

    def __enter__(self):
        self.store._lock.acquire()
        self.outer = not self.store.conn.in_transaction
        if self.outer:
            self.store.conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, exc, tb):
        store, done = self.store, False
        try:
            if self.outer:
                store.conn.execute("ROLLBACK" if exc_type else "COMMIT")
                done = not exc_type
        finally:
            if self.outer:
                if not done:  # rolled back: those seqs were never written (and may be numbered again)
                    store.in_flight.difference_update(store._tx_seqs)
                store._tx_seqs.clear()
            store._lock.release()
        return False


def has_store(index_dir: str | Path) -> bool:
    return (Path(index_dir) / DB).is_file()
