"""A served index kept current: its base generation plus what the item store says changed since.

``LiveIndex`` holds one index directory's serving state. Every change (this server's own writes, and
another process's: ``ltd items``, ``ltd index --append`` on a living index) reaches it through the
item store (indexer/items.py) as ``Changes``; ``catch_up`` adds the new rows to append-only buffers,
marks removed rows, updates the metadata table, and publishes a new immutable snapshot: an
``IndexDir`` whose sides are search/live_views.py's views, plus id → row maps and the metadata table
that filters read. A request takes one snapshot (``ModelEntry``, search/registry.py) and uses it to
the end, so it never sees half a write. A new *generation* (a compaction, an append or a rebuild by
another process) is not applied here: the registry loads it as a new ``LiveIndex`` and swaps it in.

Thread-safety: ``catch_up`` takes the index's lock (``refresh`` through it); ``snapshot`` is a plain read.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from indexer.caption_texts import with_model_texts
from indexer.index import IndexDir, Modality
from indexer.items import FILES, Changes, ItemStore, has_store
from search.filters import MetadataTable
from search.live_views import ConcatList, LiveSearch, Positions, RowVectors

log = logging.getLogger(__name__)
_LOOK_AHEAD = 64  # writes a search's refresh looks at before it just catches up


class _Rows:
    """Append-only rows of one side: vectors (a growing buffer), per-row metadata lists, id → row."""

    def __init__(self, dim: int, base_meta: dict, n_base: int):
        self.buf = np.zeros((0, dim), np.float32)
        self.n = 0
        self.lists: dict[str, list] = {k: [] for k, v in base_meta.items() if isinstance(v, list) and len(v) == n_base}
        self.pos: dict[int, int] = {}

    def append(self, vectors: np.ndarray, meta: dict[str, list], first_row: int) -> None:
        need = self.n + len(vectors)
        if need > len(self.buf):
            grown = np.zeros((max(need, 2 * len(self.buf), 64), self.buf.shape[1]), np.float32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown  # snapshots keep their view of the old buffer
        self.buf[self.n: need] = vectors
        for key in self.lists:
            self.lists[key].extend(meta.get(key) or [None] * len(vectors))
        for j, i in enumerate(meta["ids"]):
            self.pos[int(i)] = first_row + self.n + j
        self.n = need


@dataclass(frozen=True)
class Snapshot:
    """One consistent state of a living index (see the module doc)."""

    index: IndexDir  # sides are live views
    image_pos: Positions
    caption_pos: Positions
    table: MetadataTable  # metadata of every image row (removed rows included; masks exclude them)
    seq: int  # the last store write it holds
    caption_image: np.ndarray  # caption row → image row (−1: none)


class LiveIndex:
    """One index directory as a server sees it (see the module doc)."""

    def __init__(self, ix: IndexDir, store: ItemStore | None):
        self.base, self.store = ix, store
        self._lock = threading.Lock()
        im, cap = ix.images, ix.captions
        self._n_img, self._n_cap = len(im.ids), len(cap.ids)
        self._img = _Rows(im.vectors.shape[1], im.meta, self._n_img)
        self._cap = _Rows(cap.vectors.shape[1], cap.meta, self._n_cap)
        self._img_pos = {int(i): r for r, i in enumerate(im.ids)}
        self._cap_pos = {int(i): r for r, i in enumerate(cap.ids)}
        self._dead_img = np.zeros(self._n_img, bool)
        self._dead_cap = np.zeros(self._n_cap, bool)
        links = cap.meta.get("image") or [-1] * self._n_cap
        self._cap_image = np.array([-1 if j is None else int(j) for j in links], np.int64)
        self._img_caps: dict[int, list[int]] = {}  # added image row → its caption rows
        base_md = store.metadata() if store is not None else {}
        self.table = MetadataTable.from_dicts([self._row_metadata(k, base_md) for k in range(self._n_img)],
                                              texts=self._base_texts())
        self.seq = store.folded_seq if store is not None else 0
        self._version = None
        self._publish()
        if store is not None:
            self.catch_up()

    @classmethod
    def open(cls, ix: IndexDir, *, writable: bool = False) -> LiveIndex:
        """``ix`` with its item store: created when ``writable``, else used when there is one."""
        store = ItemStore.open(ix, create=True) if writable or has_store(ix.path) else None
        return cls(ix, store)

    # ---- base rows: metadata and words ---------------------------------------------------------
    def _row_metadata(self, row: int, stored: dict[int, dict]) -> dict:
        """A base image's metadata: the store's when it has one, else the build's, with what a dataset
        knows (its name and split, the image's dataset ids)."""
        im, mf = self.base.images.meta, self.base.manifest
        image_id = int(im["ids"][row])
        md = stored.get(image_id)
        if md is None:
            md = dict((im.get("metadata") or [None] * self._n_img)[row] or {})
        ds = mf.get("dataset") or {}
        extra = {"dataset": ds.get("name"), "split": ds.get("split"), "image_id": image_id}
        if im.get("cocoids"):
            extra["cocoid"] = im["cocoids"][row]
        return {**{k: v for k, v in extra.items() if v is not None}, **md}

    def _base_texts(self) -> list[str]:
        im, cap = self.base.images.meta, self.base.captions.meta
        per_image = im.get("captions") or [[] for _ in range(self._n_img)]
        texts = cap.get("texts") or []
        names = im.get("filenames") or [""] * self._n_img
        return [" ".join([str(names[r] or "")] + [texts[c] for c in per_image[r]]) for r in range(self._n_img)]

    # ---- changes -------------------------------------------------------------------------------
    def catch_up(self) -> bool:
        """Apply everything committed to the store since this snapshot (this process's writes and other
        processes'): add the new rows, mark the removals, take the metadata edits, publish a new snapshot;
        True when it changed. The store's version is read before its changes, so what commits after the
        read is seen by the next ``refresh``; changes are read and applied under one lock, so they are
        applied in the order they were committed."""
        with self._lock:
            version, before = self.store.data_version(), self.seq
            ch = self.store.changes_since(self.seq)
            if ch.seq > self.seq or ch.images or ch.removed_images or ch.edited:
                self._apply(ch)
                self.seq = max(self.seq, ch.seq)
                self._publish()
                self.store.applied(self.seq)
            self._version = version
            return self.seq != before

    def _apply(self, ch: Changes) -> None:
        new_imgs = [r for r in ch.images if r["id"] not in self._img_pos and r["id"] not in self._img.pos]
        if new_imgs:
            first = self._n_img + self._img.n
            meta = {"ids": [r["id"] for r in new_imgs], "filenames": [r["filename"] for r in new_imgs],
                    "paths": [r["path"] for r in new_imgs], "sha256": [r["sha256"] for r in new_imgs]}
            self._img.append(np.stack([r["vector"] for r in new_imgs]), meta, self._n_img)
            self._dead_img = np.concatenate([self._dead_img, np.zeros(len(new_imgs), bool)])
            said: dict[int, list[str]] = {}
            for c in ch.captions:
                said.setdefault(c["image_id"], []).append(c["text"])
            self.table.append([r["metadata"] for r in new_imgs],
                              texts=[" ".join([r["filename"] or "", *said.get(r["id"], [])]) for r in new_imgs])
            for j in range(len(new_imgs)):
                self._img_caps[first + j] = []
        new_caps = [r for r in ch.captions if r["id"] not in self._cap_pos and r["id"] not in self._cap.pos]
        if new_caps:
            first = self._n_cap + self._cap.n
            rows = [self._image_row(r["image_id"]) for r in new_caps]
            meta = with_model_texts({"ids": [r["id"] for r in new_caps], "texts": [r["text"] for r in new_caps],
                                     "image": rows}, [r["model_text"] for r in new_caps])
            self._cap.append(np.stack([r["vector"] for r in new_caps]), meta, self._n_cap)
            self._dead_cap = np.concatenate([self._dead_cap, np.zeros(len(new_caps), bool)])
            self._cap_image = np.concatenate([self._cap_image, np.array(rows, np.int64)])
            for j, row in enumerate(rows):
                if row >= 0:
                    self._img_caps.setdefault(row, []).append(first + j)
        if ch.removed_images or ch.removed_captions:
            self._dead_img, self._dead_cap = self._dead_img.copy(), self._dead_cap.copy()  # copy on write
            for i in ch.removed_images:
                row = self._row(self._img_pos, self._img.pos, i)
                if row is not None:
                    self._dead_img[row] = True
            for c in ch.removed_captions:
                row = self._row(self._cap_pos, self._cap.pos, c)
                if row is not None:
                    self._dead_cap[row] = True
        for image_id, metadata in ch.edited.items():
            row = self._row(self._img_pos, self._img.pos, image_id)
            if row is not None and not self._dead_img[row]:
                self.table.update(row, self._row_metadata(row, {image_id: metadata}) if row < self._n_img
                                  else metadata, text=self._text_of(row))

    @staticmethod
    def _row(base: dict, added: dict, key: int) -> int | None:
        row = base.get(int(key))
        return added.get(int(key)) if row is None else row

    def _image_row(self, image_id) -> int:
        if image_id is None:
            return -1
        row = self._row(self._img_pos, self._img.pos, image_id)
        return -1 if row is None else row

    def _text_of(self, row: int) -> str:
        """The words of an image row now: its file name and its live captions."""
        def value(base: dict, rows: _Rows, n_base: int, key: str, r: int):
            return (base.get(key) or [None] * n_base)[r] if r < n_base else rows.lists.get(key, [None] * (r + 1))[r - n_base]

        im, cap = self.base.images.meta, self.base.captions.meta
        name = value(im, self._img, self._n_img, "filenames", row)
        texts = [value(cap, self._cap, self._n_cap, "texts", c) for c in self.caption_rows(row)]
        return " ".join([str(name or "")] + [str(t) for t in texts if t])

    def metadata(self, row: int) -> dict:
        """The metadata of an image row now (the store's, else the build's)."""
        image_id = int(self.current.index.images.meta["ids"][row])
        stored = self.store.metadata([image_id]) if self.store is not None else {}
        return self._row_metadata(row, stored) if row < self._n_img else stored.get(image_id, {})

    def caption_rows(self, image_row: int) -> list[int]:
        """The live caption rows of an image row."""
        if image_row < self._n_img:
            base = (self.base.images.meta.get("captions") or [[]] * self._n_img)[image_row]
            rows = list(base) + self._img_caps.get(image_row, [])
        else:
            rows = self._img_caps.get(image_row, [])
        dead = self._dead_cap
        return [c for c in rows if c < len(dead) and not dead[c]]

    # ---- snapshots -----------------------------------------------------------------------------
    def _side(self, base: Modality, rows: _Rows, dead: np.ndarray, n_base: int) -> Modality:
        n = n_base + rows.n
        meta = {k: (ConcatList(v, rows.lists[k], n) if k in rows.lists else v) for k, v in base.meta.items()}
        added = rows.buf[: rows.n]
        view = LiveSearch(base.index, base.vectors, added, dead)
        return Modality(view, RowVectors(base.vectors, added), meta)

    def _publish(self) -> None:
        ix = self.base
        images = self._side(ix.images, self._img, self._dead_img, self._n_img)
        if self._img_caps:  # images' caption lists, added captions included
            n = len(self._dead_img)
            images.meta["captions"] = ConcatList(_CaptionLists(self, self._n_img), [], n) \
                if "captions" in ix.images.meta or self._cap.n else images.meta.get("captions")
        captions = self._side(ix.captions, self._cap, self._dead_cap, self._n_cap)
        roots = ix.served_roots if ix.served_roots is not None else ix.image_roots
        own = (ix.path / FILES).resolve()  # uploads added through this index's item store
        view = IndexDir(ix.path, ix.manifest, images, captions, served_roots=(*roots, own))
        self.current = Snapshot(view, Positions(self._img_pos, dict(self._img.pos), self._dead_img),
                                Positions(self._cap_pos, dict(self._cap.pos), self._dead_cap), self.table.snapshot(),
                                self.seq, self._cap_image)

    # ---- other processes ----------------------------------------------------------------------
    def refresh(self) -> bool:
        """Apply what was committed to the store since the last look (``catch_up``), when anything was: a
        check of the store's version, which never waits for a write; True when the snapshot changed."""
        if self.store is None:
            return False
        version = self.store.data_version()
        if version == self._version:
            return False
        unseen = self.store.seqs_after(self.seq, _LOOK_AHEAD)
        if not unseen:  # every write is applied (the version moved for a fold, or ahead of its writer)
            self._version = version
            return False
        if len(unseen) < _LOOK_AHEAD and self.store.in_flight.issuperset(unseen):
            return False  # this process's own writes, not answered yet: each writer applies its own first
        return self.catch_up()

    def pending(self) -> dict[str, int]:
        """Rows this snapshot holds beyond its base generation: images added, and images removed (from
        memory: what ``ItemStore.pending`` counts, without a query)."""
        with self._lock:
            return {"added": int(self._img.n), "removed": int(self._dead_img.sum())}

    def close(self) -> None:
        """Close the item store's database connection, when there is one."""
        if self.store is not None:
            self.store.close()


class _CaptionLists:
    """Image row → its live caption rows, as the ``captions`` metadata list of a snapshot."""

    def __init__(self, live: LiveIndex, n: int):
        self.live, self.n = live, n

    def __len__(self) -> int:
        return len(self.live._dead_img)

    def __getitem__(self, row: int) -> list[int]:
        return self.live.caption_rows(int(row))
