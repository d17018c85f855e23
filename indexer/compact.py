"""Compaction: a living index's base generation, its additions and its removals, written as one new
generation (``ltd index --compact``, and in the background of a writable server).

``merged(ix, store)`` is the index as readers see it — the base's rows that were not removed, then the
rows added since, with the store's current metadata — as plain arrays and lists, ground-truth links
renumbered. ``compact`` writes it through indexer/index.py's crash-safe commit with ``items_seq`` (the
last write it holds) in the manifest, then folds the store. A kill before the manifest is replaced
leaves the old generation and the store as they were; a kill after it, the new generation, and the
store's fold is finished by the next ``ItemStore.open``. ``ltd eval`` evaluates ``merged`` too, so a
removed item is never counted in a report.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from indexer.ann import build_vector_index
from indexer.caption_texts import model_texts, with_model_texts
from indexer.index import IndexDir, Modality, commit_generation, load_index_dir, read_manifest
from indexer.items import ItemStore
from indexer.shards_index import write_sharded
from indexer.shards_merge import read_sharded_plain
from indexer.tune import needs_retune, parse_auto
from indexer.vector_index import VectorIndex
from training.fsio import exclusive

log = logging.getLogger(__name__)

LOCK = ".compact.lock"


def _keep_lists(meta: dict, keep: np.ndarray, n: int) -> dict:
    """Every per-row list of ``meta`` (length ``n``) restricted to the rows ``keep``; other keys as they are."""
    return {k: ([v[int(r)] for r in keep] if isinstance(v, list) and len(v) == n else v) for k, v in meta.items()}


def _pad(meta: dict, n: int) -> dict:
    return {k: v + [None] * (n - len(v)) if isinstance(v, list) and len(v) < n else v for k, v in meta.items()}


def merged(ix: IndexDir, store: ItemStore) -> tuple[dict[str, Modality | tuple], int]:
    """(``{"images": (vectors, meta), "captions": (vectors, meta)}``, the last write they hold)."""
    ch = store.changes_since(store.folded_seq)
    gone_i, gone_c = set(ch.removed_images), set(ch.removed_captions)
    metadata = store.metadata()
    im, cap = ix.images, ix.captions
    n_i, n_c = len(im.ids), len(cap.ids)
    keep_i = np.array([r for r, i in enumerate(im.ids) if int(i) not in gone_i], dtype=np.int64)
    keep_c = np.array([r for r, c in enumerate(cap.ids) if int(c) not in gone_c], dtype=np.int64)
    new_i = [r for r in ch.images if r["id"] not in gone_i]
    new_c = [r for r in ch.captions if r["id"] not in gone_c]
    img_meta = _keep_lists(im.meta, keep_i, n_i)
    cap_meta = _keep_lists(cap.meta, keep_c, n_c)
    # the image rows after the merge, by id; captions point at them
    ids = [int(i) for i in img_meta["ids"]] + [r["id"] for r in new_i]
    row_of = {i: r for r, i in enumerate(ids)}
    old_image = cap_meta.get("image") or [None] * len(keep_c)
    base_link = [row_of.get(int(im.ids[j])) if j is not None and j >= 0 else None for j in old_image]
    n_images = len(ids)
    img_meta = _pad(img_meta, len(keep_i))
    for key, value in (("ids", "id"), ("filenames", "filename"), ("paths", "path"), ("sha256", "sha256")):
        img_meta[key] = list(img_meta.get(key) or [None] * len(keep_i)) + [r[value] for r in new_i]
    img_meta = _pad(img_meta, n_images)
    img_meta["metadata"] = [metadata.get(i, {}) for i in ids]
    cap_meta["ids"] = [int(c) for c in cap_meta["ids"]] + [r["id"] for r in new_c]
    base_texts = list(cap_meta.get("texts") or [])
    base_model = list(model_texts(cap_meta))[:len(keep_c)] if base_texts else []
    cap_meta["texts"] = base_texts + [r["text"] for r in new_c]
    if base_model != base_texts[:len(keep_c)] or any(r["model_text"] != r["text"] for r in new_c):
        with_model_texts(cap_meta, base_model + [r["model_text"] for r in new_c])
    links = base_link + [row_of.get(r["image_id"]) for r in new_c]
    cap_meta["image"] = [-1 if j is None else int(j) for j in links]
    cap_meta = _pad(cap_meta, len(cap_meta["ids"]))
    if "captions" in im.meta or new_c:
        per_image: list[list[int]] = [[] for _ in range(n_images)]
        for c, j in enumerate(cap_meta["image"]):
            if j >= 0:
                per_image[j].append(c)
        img_meta["captions"] = per_image
    dim = im.vectors.shape[1]
    img_vecs = np.concatenate([np.asarray(im.vectors)[keep_i].reshape(-1, dim),
                               np.array([r["vector"] for r in new_i], dtype=np.float32).reshape(-1, dim)])
    cap_vecs = np.concatenate([np.asarray(cap.vectors)[keep_c].reshape(-1, dim),
                               np.array([r["vector"] for r in new_c], dtype=np.float32).reshape(-1, dim)])
    return {"images": (img_vecs, img_meta), "captions": (cap_vecs, cap_meta)}, ch.seq


def compact(index_dir: str | Path, *, verify: str = "counts") -> IndexDir | None:
    """Write the living index as its next generation and fold the store; None when there is no store or
    nothing to fold. A sharded index is merged, compacted and sharded again in its layout (its shards'
    vectors held in memory while it runs). Serialised with other compactions of the same folder (a file
    lock)."""
    index_dir = Path(index_dir)
    with exclusive(index_dir / LOCK, f"a compaction of {index_dir.name}"):
        sharding = read_manifest(index_dir).get("sharding")
        ix = read_sharded_plain(index_dir, verify=verify) if sharding else load_index_dir(index_dir, verify=verify)
        store = ItemStore.open(ix, create=False)
        if store is None:
            return None
        try:
            if store.last_seq() <= store.folded_seq:
                return None
            sides, seq = merged(ix, store)
            mods = {}
            for name, (vectors, meta) in sides.items():
                mods[name] = Modality(side_index(ix.manifest, name, vectors), vectors, meta)
            if sharding:  # the merged generation, sharded again as it was (the store stays at the front)
                nxt = IndexDir(ix.path, {**ix.manifest, "items_seq": seq}, mods["images"], mods["captions"])
                manifest = write_sharded(index_dir, nxt, int(sharding["count"]), sharding["by"], compaction=True)
                out = IndexDir(ix.path, manifest, mods["images"], mods["captions"])
            else:
                out = commit_generation(ix, mods, {"items_seq": seq})
            store.fold(seq, out.generation)
            log.info("%s: compacted into generation %d (%d images, %d captions; writes up to %d)", index_dir.name,
                     out.generation, out.images.index.ntotal, out.captions.index.ntotal, seq)
            return out
        finally:
            store.close()


def side_index(manifest: dict, name: str, vectors: np.ndarray) -> VectorIndex:
    """The search index of one side of the next generation. A side tuned to a target (``--factory auto``)
    keeps the index the tuner chose while the corpus stays within ``RETUNE_FACTOR`` of the size it was
    tuned at, and is tuned again once it has grown (or shrunk) past it; a named factory is rebuilt as
    named (the size rule of ``fixed`` plans for the new size)."""
    spec = (manifest.get("indexes") or {}).get(name) or {}
    factory = manifest.get("factory") or spec.get("factory") or "Flat"
    if not len(vectors):
        return build_vector_index(vectors, "Flat")
    tuning = spec.get("tuning")
    if parse_auto(factory) is None or not tuning or needs_retune(manifest, len(vectors), name):
        if tuning:
            log.info("%s: %d vectors, tuned at %d: tuning again", name, len(vectors), tuning.get("n", 0))
        return build_vector_index(vectors, factory)
    chosen = tuning["chosen"]
    vi = VectorIndex.build(vectors, chosen["factory"], nprobe=chosen.get("nprobe"), rerank=chosen.get("rerank") or 0,
                           ef_search=chosen.get("efSearch"))
    vi.tuning = tuning  # what was measured, at the size it was measured (``ltd eval`` re-measures it)
    return vi


def live_view(ix: IndexDir) -> IndexDir:
    """``ix`` as its readers see it when it has an item store with writes since its generation (removed
    items gone, added ones in, exact search), else ``ix`` itself: what ``ltd eval`` evaluates, so no
    removed item is counted in a report."""
    store = ItemStore.open(ix, create=False)
    if store is None:
        return ix
    try:
        if store.last_seq() <= store.folded_seq:
            return ix
        sides, seq = merged(ix, store)
    finally:
        store.close()
    mods = {name: Modality(build_vector_index(v, "Flat"), v, meta) for name, (v, meta) in sides.items()}
    log.info("%s: evaluating the living index (its generation and the writes since, up to %d)", ix.path.name, seq)
    return IndexDir(ix.path, {**ix.manifest, "items_seq": seq}, mods["images"], mods["captions"],
                    served_roots=ix.served_roots)
