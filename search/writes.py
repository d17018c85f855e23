"""Writes to a served living index: add, remove and edit items, list them, reload and compact.

``ItemWrites`` (``service.writes``) is what the write routes and the UI call. Writes are off unless
the server was started writable (``ltd serve --writable``: the registry creates item stores); the
token that guards them is the API layer's business. Per model, writes are serialised (a lock; across
processes SQLite's own lock): two writers never lose an update. Each write is durable when it returns
(indexer/items.py) and is applied to the served snapshot before it returns, so the next query sees it
(read-your-writes). Uploads are checked (type, pixel budget) and embedded before the store's
transaction, one write at a time, at a lower CPU priority (``write_nice``, nice +5 by default, and the
batch scheduling policy: ``run_in_background``): on a machine that searches already keep busy, an add
takes the CPU the searches leave instead of the searches' latency. By default (``write_in_process``
off) the uploads are decoded, embedded and stored (their files written and fsynced) by a child process
per model (search/embed_process.py: its own GIL and runtime threads, all of them in the background);
else on a thread of the server's own (the threads torch starts from it inherit its priority, the image
runtime's pool does not). A server-side folder is read only inside the operator's ingest roots
(``--ingest-root``); its images are read and embedded where an upload's are (the child, unless
``write_in_process``), an edit's captions on the write thread.
"""
from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from indexer import compact
from indexer.corpus import image_files
from indexer.embed import embed_captions
from indexer.items import NewImage
from search.embed_process import EmbedderSpec, ProcessEmbedder, child_nice, run_in_background
from search.errors import BadRequest, Conflict, Forbidden, NotFound
from search.filters import FIELD_NAME
from search.registry import ModelEntry
from search.write_images import embed_images, read_image_files, save_upload

log = logging.getLogger(__name__)

MAX_CAPTIONS = 20  # per item
MAX_CAPTION_CHARS = 1000


@dataclass
class Upload:
    """One image sent to the server: its bytes, name, captions and metadata (all checked here)."""

    data: bytes
    filename: str = "upload"
    captions: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)


def check_metadata(md: object) -> dict:
    """User metadata: a JSON object of scalars or lists of scalars, names like filter fields."""
    if not isinstance(md, dict):
        raise BadRequest("metadata must be a JSON object")
    if len(md) > 64:
        raise BadRequest("metadata: at most 64 fields")
    for key, value in md.items():
        if not FIELD_NAME.fullmatch(key):  # the field-name rule of filters, so every field can be filtered on
            raise BadRequest(f"metadata: {key[:80]!r} is not a field name (a letter or _, then letters, digits, "
                             "_ . -; at most 64 characters)")
        values = value if isinstance(value, list) else [value]
        if len(values) > 100 or not all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
            raise BadRequest(f"metadata.{key}: a scalar or a list of at most 100 scalars")
        if any(isinstance(v, str) and len(v) > 1000 for v in values):
            raise BadRequest(f"metadata.{key}: strings of at most 1000 characters")
    return md


def check_captions(captions: object) -> list[str]:
    """Captions given with an item: a list of strings, whitespace collapsed, each non-empty and within the
    length limit (BadRequest otherwise)."""
    if not isinstance(captions, list) or len(captions) > MAX_CAPTIONS or not all(isinstance(c, str) for c in captions):
        raise BadRequest(f"captions must be a list of at most {MAX_CAPTIONS} strings")
    out = [" ".join(c.split()) for c in captions]
    if any(not c or len(c) > MAX_CAPTION_CHARS for c in out):
        raise BadRequest(f"each caption is 1 to {MAX_CAPTION_CHARS} characters")
    return out


class ItemWrites:
    """See the module doc. ``service``: the SearchService whose registry, uploads and encoder it uses."""

    def __init__(self, service, *, ingest_roots: tuple[str, ...] = (), compact_after: int = 0, nice: int = 0,
                 in_process: bool = False):
        self.svc, self.nice, self.in_process = service, nice, in_process
        self._processes: dict[str, ProcessEmbedder] = {}  # model name → its write embedder (module doc)
        self.compact_after = compact_after
        self.ingest_roots = tuple(Path(r).resolve() for r in ingest_roots)
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._compacting: set[str] = set()
        self._embedder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ltd-writes",
                                            initializer=run_in_background, initargs=(child_nice(nice),))
        # with write_in_process, an add's uploaded files, written (each fsync waits on the disk) while the model runs
        self._files = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ltd-write-files")

    def close(self) -> None:
        """Stop the write thread once the write it runs (if any) is done, and the embedder processes."""
        self._embedder.shutdown(wait=True)
        self._files.shutdown(wait=True)
        for proc in self._processes.values():
            proc.close()

    def warm(self, e: ModelEntry) -> None:
        """Start ``e``'s embedder process now (on the write thread, in the background), so that the first
        add does not wait for it to load the model; nothing when writes are off or embedded in process."""
        if self.svc.registry.writable and not self.in_process and e.live is not None \
                and e.model.image.backbone is not None:
            self._embedder.submit(self._process_for, e)

    def _process_for(self, e: ModelEntry) -> ProcessEmbedder:
        """``e``'s embedder process (write thread only): a model reloaded with another checkpoint gets a new one."""
        proc = self._processes.get(e.name)
        if proc is not None and proc.spec.sha256 != e.sha256:
            proc.close()
            proc = None
        if proc is None:
            c = self.svc.config
            proc = self._processes[e.name] = ProcessEmbedder(EmbedderSpec(
                checkpoint=str(e.checkpoint), sha256=e.sha256, device=c.device, max_pixels=c.max_upload_pixels,
                max_upload_bytes=c.max_upload_bytes, nice=child_nice(self.nice)))
        proc.start()
        return proc

    def _embedding(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the embedding thread (see the module doc); its result or its error."""
        return self._embedder.submit(fn, *args, **kwargs).result()

    def _entry(self, name: str) -> ModelEntry:
        e = self.svc.registry.get(name)
        if not self.svc.registry.writable or e.live is None or e.live.store is None:
            raise Forbidden("this server does not take writes (start it with `ltd serve --writable`)")
        return e

    def _commit(self, name: str, write) -> tuple[ModelEntry, object]:
        """Run ``write(store)`` under the model's lock, then apply it to the served snapshot."""
        with self._locks[name]:
            e = self._entry(name)
            result = write(e)
            e.live.catch_up()
        if self.compact_after and name not in self._compacting and sum(e.live.pending().values()) >= self.compact_after:
            self.compact(name)  # in the background; answers keep coming from the current generation
        return self.svc.registry.get(name), result

    # ---- adding ---------------------------------------------------------------------------------
    def add(self, name: str, uploads: list[Upload]) -> list[dict]:
        """Add uploaded images: [{id, added}] in order (``added`` false: the same image was already there)."""
        if not 1 <= len(uploads) <= self.svc.config.max_items_per_add:
            raise BadRequest(f"send 1 to {self.svc.config.max_items_per_add} images at a time")
        e = self._entry(name)
        rows = self._embedding(self._embed_uploads, e, uploads)
        _, (seq, ids) = self._commit(name, lambda entry: entry.live.store.add(rows))
        return [{"id": i, "added": added} for i, added in ids]

    def _embed_uploads(self, e: ModelEntry, uploads: list[Upload]) -> list[NewImage]:
        backbone = e.model.image.backbone
        if backbone is None:
            raise BadRequest(f"model {e.name} has no image backbone: it cannot embed new images")
        checked = [(u, check_captions(u.captions), check_metadata(u.metadata)) for u in uploads]
        folder, min_side, datas = e.live.store.files_folder(), 2 * backbone.preprocess.resize, [u.data for u in uploads]
        if self.in_process:
            images = [self.svc.uploads.decode(data, min_side) for data in datas]
            stored = self._files.map(partial(save_upload, folder), datas)  # every upload is an image: stored
            vectors = embed_images(e.model, images)  # while the model runs
            stored = list(stored)
        else:  # the child stores them too (search/embed_process.py)
            vectors, stored = self._process_for(e).embed_and_store(datas, min_side, folder)
        texts = [c for _, caps, _ in checked for c in caps]
        cap_vecs = embed_captions(e.model, texts) if texts else np.zeros((0, vectors.shape[1]), np.float32)
        rows, c = [], 0
        for (u, caps, md), v, rec in zip(checked, vectors, stored):
            captions = [(t, t, cap_vecs[c + j]) for j, t in enumerate(caps)]
            c += len(caps)
            path = Path(rec["path"])
            rows.append(NewImage(vector=v, sha256=rec["sha256"], path=str(path), filename=Path(u.filename).name[:200] or path.name,
                                 metadata={**rec["metadata"], **md}, captions=captions))
        return rows

    def add_folder(self, name: str, folder: str, *, metadata: dict | None = None) -> list[dict]:
        """Add the images of a server-side folder, named relative to one of the ingest roots: one answer per
        image file, in order, ``{file, id, added}`` or ``{file, skipped}`` (``file`` relative to the folder)."""
        if not self.ingest_roots:
            raise Forbidden("this server reads no folders of its own (start it with --ingest-root DIR)")
        md = check_metadata(metadata or {})
        if not isinstance(folder, str) or "\0" in folder or Path(folder).is_absolute():
            raise BadRequest("folder must be a path relative to the server's ingest root")
        for root in self.ingest_roots:
            target = (root / folder).resolve()
            if target.is_dir() and target.is_relative_to(root):
                break
        else:
            raise NotFound("no such folder under the server's ingest roots")
        e = self._entry(name)
        files = [p for p in image_files(target) if p.resolve().is_relative_to(root)]
        rows, failed = self._embedding(self._embed_folder, e, files, root, md)
        _, (seq, ids) = self._commit(name, lambda entry: entry.live.store.add(rows))
        added, out = iter(ids), []  # the rows' ids, in the order of the files that were read
        for k, path in enumerate(files):
            answer = {"skipped": failed[k]} if k in failed else dict(zip(("id", "added"), next(added)))
            out.append({"file": path.relative_to(target).as_posix(), **answer})
        return out

    def _embed_folder(self, e: ModelEntry, files: list[Path], root: Path, md: dict) -> tuple[list[NewImage], dict[int, str]]:
        """A folder's files read, decoded under the uploads' budgets and embedded by the model's write
        embedder process (or this thread, ``write_in_process``), at most ``max_items_per_add`` files (and
        about 16 KiB of paths) at a time: (rows, {position: why skipped})."""
        backbone = e.model.image.backbone
        if backbone is None:
            raise BadRequest(f"model {e.name} has no image backbone: it cannot embed new images")
        rows, failed, chunk, start = [], {}, [], 0
        for k, path in enumerate([*files, None]):
            size = len(json.dumps([str(p) for p in chunk]))  # the request's header must stay under the pipe's 64 KiB
            if chunk and (path is None or len(chunk) == self.svc.config.max_items_per_add or size > 1 << 14):
                vectors, records, skipped = self._embed_files(e, chunk, 2 * backbone.preprocess.resize, root)
                readable = [j for j in range(len(chunk)) if j not in skipped]
                failed.update({start + j: why for j, why in skipped.items()})
                for j, v, rec in zip(readable, vectors, records):
                    rows.append(NewImage(vector=v, sha256=rec["sha256"], path=rec["path"], filename=chunk[j].name,
                                         metadata={**rec["metadata"], **md}, captions=[]))
                chunk, start = [], k
            if path is not None:
                chunk.append(path)
        return rows, failed

    def _embed_files(self, e: ModelEntry, paths: list[Path], min_side: int, root: Path):
        if not self.in_process:
            return self._process_for(e).embed_files(paths, min_side, root)
        images, records, skipped = read_image_files(self.svc.uploads, paths, min_side, root, self.svc.config.max_upload_bytes)
        return embed_images(e.model, images), records, skipped

    # ---- removing and editing -------------------------------------------------------------------
    def remove(self, name: str, image_id: int) -> dict:
        """Remove an image (and its captions): gone from every answer when this returns."""
        _, (seq, found) = self._commit(name, lambda e: e.live.store.remove([int(image_id)]))
        if not found:
            raise NotFound(f"image id {image_id} is not in model {name}'s index")
        return {"id": int(image_id), "removed": True}

    def edit(self, name: str, image_id: int, *, metadata: dict | None = None, captions: list[str] | None = None,
             merge: bool = True) -> dict:
        """Change an image's metadata (merged into what it has, unless ``merge`` is false; a field set to
        null is dropped) and/or replace its captions (embedded again)."""
        if metadata is None and captions is None:
            raise BadRequest("give metadata and/or captions")
        e = self._entry(name)
        if image_id not in e.image_pos:
            raise NotFound(f"image id {image_id} is not in model {name}'s index")
        new_md = None
        if metadata is not None:
            check_metadata(metadata)
            current = e.live.store.metadata([int(image_id)]).get(int(image_id), {}) if merge else {}
            new_md = {k: v for k, v in {**current, **metadata}.items() if v is not None}
        caps = None
        if captions is not None:
            texts = check_captions(captions)
            vecs = self._embedding(embed_captions, e.model, texts) if texts else []
            caps = [(t, t, vecs[j]) for j, t in enumerate(texts)]
        try:
            self._commit(name, lambda entry: entry.live.store.edit(int(image_id), new_md, caps))
        except KeyError:
            raise NotFound(f"image id {image_id} is not in model {name}'s index") from None
        return self.get(name, image_id)

    # ---- reading --------------------------------------------------------------------------------
    def get(self, name: str, image_id: int) -> dict:
        """One item: id, file name, metadata, captions."""
        e = self.svc.registry.get(name)
        row = e.image_pos.get(int(image_id))
        if row is None:
            raise NotFound(f"image id {image_id} is not in model {name}'s index")
        return self._item(e, row)

    def _item(self, e: ModelEntry, row: int) -> dict:
        im, cap = e.index.images.meta, e.index.captions.meta
        caps = e.live.caption_rows(row)
        return {"id": int(im["ids"][row]), "filename": im["filenames"][row], "metadata": e.live.metadata(row),
                "captions": [{"id": int(cap["ids"][c]), "text": cap["texts"][c]} for c in caps]}

    def list(self, name: str, *, filter: dict | None = None, after: int | None = None, limit: int = 100) -> dict:
        """Items in id order, ``limit`` at a time after the id ``after``, restricted by ``filter``."""
        if not 1 <= limit <= 1000:
            raise BadRequest("limit must be 1 to 1000")
        e = self.svc.registry.get(name)
        ids = np.asarray(e.index.images.meta["ids"], dtype=np.int64)
        ok = ~e.index.images.index.dead[: len(ids)]
        mask, _ = self.svc.filter_masks(e, filter, captions=False)
        if mask is not None:
            ok &= mask
        rows = np.flatnonzero(ok & (ids > after if after is not None else True))
        rows = rows[np.argsort(ids[rows], kind="stable")][: limit + 1]
        items = [self._item(e, int(r)) for r in rows[:limit]]
        return {"items": items, "next_after": items[-1]["id"] if len(rows) > limit else None,
                "total": int(ok.sum()), "generation": e.generation}

    # ---- other processes, compaction -------------------------------------------------------------
    def reload(self, name: str) -> dict:
        """Pick up another process's changes now (the watcher does it within a second anyway)."""
        changed = self.svc.registry.refresh(name, wait=True)
        e = self.svc.registry.get(name)
        return {"changed": changed, "generation": e.generation, "seq": e.seq}

    def compact(self, name: str) -> dict:
        """Write the living index as its next generation, in the background (409 when one is running)."""
        e = self._entry(name)
        if name in self._compacting:
            raise Conflict(f"a compaction of model {name} is already running")
        self._compacting.add(name)

        def run() -> None:
            try:
                compact.compact(e.index.path)
                self.svc.registry.refresh(name, wait=True)
            except Exception as err:  # noqa: BLE001 - logged; the served index is unchanged
                log.error("model %s: compaction failed: %s", name, err)
            finally:
                self._compacting.discard(name)

        threading.Thread(target=run, name=f"ltd-compact-{name}", daemon=True).start()
        return {"compacting": True, "pending": e.live.store.pending()}
