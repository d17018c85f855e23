"""Index directories, written so that a crash at any point leaves the old index or the new one.

Layout (format 2)::

    manifest.json                    the commit point: counts, checkpoint hash, and for every data
                                     file its name, size and sha256
    images.g0003.faiss .npy .json    generation 3's data files (search index, exact float32
    captions.g0003.faiss .npy .json  embeddings, ids/texts/file names/ground-truth links)
    report.json, report.md           `ltd eval`, tagged with the generation they describe
    relevance_rougeL.g0003.npy       generation 3's cached nDCG relevance
    per_query.g0003.npz              generation 3's per-query ranks and nDCG (`ltd eval`; paired statistics)
    word_occlusion.g0003.npz         generation 3's word attributions over the split (search/word_usage.py)
    embedding_map.g0003.npz          generation 3's 2-D map of images and captions (search/embedmap.py)

Writing generation g + 1 (a build, an overwrite or an append): first remove what killed writers
left (stale temporaries, data files that no manifest names), then write the new data files under
new names, each atomically, then replace ``manifest.json`` — the single atomic step that moves
readers from g to g + 1 — and only then delete generation g's files. A kill before the manifest is
replaced leaves generation g whole; a kill after it leaves g + 1 whole; the next write cleans up.

Loading checks every data file against the manifest (size and item counts always, sha256 unless
``verify="counts"``), so a torn, truncated or swapped-in file is refused, never served.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.vector_index import IndexDirError, VectorIndex
from training.errors import UserFileExists, UserFileNotFound
from training.fsio import is_stale_temp, remove_stale_temps, save_npy_atomic, sha256_file, write_json_atomic

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
MODALITIES = ("images", "captions")
KINDS = ("faiss", "npy", "json")
_DATA_RE = re.compile(r"^(images|captions)\.g(\d+)\.(faiss|npy|json)$")
_DERIVED_RE = re.compile(r"^(?:relevance_\w+|per_query|word_occlusion|embedding_map)\.g(\d+)\.(?:npy|npz)$")
# Files of format 1 (fixed names, no hashes); removed when such a directory is rebuilt.
_LEGACY = {f"{m}.{k}" for m in MODALITIES for k in KINDS} | {"relevance_rougeL.npy"}
_REPORTS = ("report.json", "report.md")
ZERO_SHOT = "zero_shot.pt"  # an untrained CLIP's checkpoint, written beside the index it was built with
# The living index's item store beside the generations (indexer/items.py) and its lock.
STORE_FILES = frozenset({"items.sqlite", "items.sqlite-wal", "items.sqlite-shm", "items.sqlite-journal", "items",
                         ".compact.lock"})


@dataclass
class Modality:
    """One side of an index directory: vectors, search index and item metadata."""

    index: VectorIndex
    vectors: np.ndarray  # (n, d) float32
    meta: dict  # ids, texts / filenames, ground-truth links (lists of equal length)

    @property
    def ids(self) -> list[int]:
        return self.meta["ids"]


@dataclass
class IndexDir:
    path: Path
    manifest: dict
    images: Modality
    captions: Modality
    served_roots: tuple[Path, ...] | None = None  # set by ``confine``

    @property
    def name(self) -> str:
        return self.manifest.get("name", self.path.name)

    @property
    def has_ground_truth(self) -> bool:
        return bool(self.manifest.get("ground_truth"))

    @property
    def generation(self) -> int:
        return int(self.manifest.get("generation", 0))

    @functools.cached_property
    def image_roots(self) -> tuple[Path, ...]:
        """The only folders this index serves image files from: the dataset's image folders (or the
        corpus folders) as resolved at build time, from the manifest's ``image_roots``. An index
        written before they were recorded gets the folders of its own (resolved) image paths."""
        roots = self.manifest.get("image_roots")
        if roots is None:
            roots = {os.path.dirname(p) for p in self.images.meta.get("paths", []) if p}
        return tuple(sorted(Path(r).resolve() for r in roots))

    def confine(self, roots: tuple[Path, ...]) -> None:
        """Serve image files only from ``roots`` (a server: the manifest's folders that the operator
        allowed, indexer/image_roots.py) instead of every folder the manifest names."""
        self.served_roots = tuple(roots)

    def image_file(self, pos: int) -> Path:
        """The image file of row ``pos``, resolved (symlinks followed), and only when it lies inside
        :attr:`image_roots` (or the folders ``confine`` allowed): a link swapped in after the build, or a
        path list that names files elsewhere, is refused rather than served."""
        path = Path(self.images.meta["paths"][pos]).resolve()
        roots = self.served_roots if self.served_roots is not None else self.image_roots
        if not inside_roots(path, roots):
            raise IndexDirError(f"{self.path}: image {self.images.ids[pos]} resolves to a file outside the index's "
                                "image folders; it is not served")
        return path

    def derived_path(self, stem: str, ext: str = "npy") -> Path:
        """Where a file derived from this generation's data lives (``relevance_rougeL``, ``per_query``)."""
        return self.path / f"{stem}.g{self.generation:04d}.{ext}"


def inside_roots(path: Path, roots: tuple[Path, ...] | list[Path]) -> bool:
    """Whether the resolved ``path`` lies in one of the resolved folders ``roots``."""
    return any(path.is_relative_to(r) for r in roots)


# ---- manifest -------------------------------------------------------------------------------------
def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.is_file():
        raise IndexDirError(f"{path} is not an index directory (no manifest.json); build one with `ltd index`")
    try:
        manifest = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexDirError(f"{mf} is corrupt: {e}") from None
    except RecursionError:  # a crafted, deeply nested manifest must not escape as a crash of the caller
        raise IndexDirError(f"{mf} is corrupt: nested too deeply") from None
    if not isinstance(manifest, dict):
        raise IndexDirError(f"{mf} is corrupt: not a JSON object")
    return manifest


def _data_name(modality: str, kind: str, generation: int) -> str:
    return f"{modality}.g{generation:04d}.{kind}"


def _ours(name: str) -> bool:
    """A file an index write creates (so an interrupted build's folder may be reused)."""
    return bool(_DATA_RE.match(name) or _DERIVED_RE.match(name)) or name in _LEGACY or name in _REPORTS \
        or name in ("manifest.json", ZERO_SHOT) or name in STORE_FILES


def collect_garbage(path: Path, manifest: dict | None) -> list[str]:
    """Delete what no committed manifest needs: stale temporaries, data files of other generations,
    format-1 files, and reports/caches derived from another generation. Returns the names removed."""
    removed = [p.name for p in remove_stale_temps(path)]
    keep = {f["file"] for f in (manifest or {}).get("files", {}).values()}
    gen = int((manifest or {}).get("generation", -1))
    for p in path.iterdir() if path.is_dir() else []:
        m = _DERIVED_RE.match(p.name)
        stale = ((_DATA_RE.match(p.name) and p.name not in keep) or (m and int(m.group(1)) != gen)
                 or (p.name in _LEGACY and manifest is not None and manifest.get("format") == FORMAT_VERSION))
        if stale:
            p.unlink(missing_ok=True)
            removed.append(p.name)
    rep = path / "report.json"
    if manifest is not None and rep.is_file():
        try:
            rgen = json.loads(rep.read_text()).get("meta", {}).get("index_generation")
        except (json.JSONDecodeError, UnicodeDecodeError):
            rgen = None
        if rgen != gen:
            for name in _REPORTS:
                (path / name).unlink(missing_ok=True)
            removed.append("report.json")
    if removed:
        log.info("%s: removed %d leftover file(s) of earlier or interrupted writes", path, len(removed))
    return removed


# ---- writing --------------------------------------------------------------------------------------
def _write_generation(path: Path, generation: int, mods: dict[str, Modality]) -> dict:
    """Write every data file of one generation; returns the manifest's ``files`` entry."""
    files = {}
    for m, mod in mods.items():
        targets = {k: path / _data_name(m, k, generation) for k in KINDS}
        mod.index.save(targets["faiss"])
        save_npy_atomic(targets["npy"], np.ascontiguousarray(mod.vectors, dtype=np.float32))
        write_json_atomic(targets["json"], mod.meta)
        for k, p in targets.items():
            files[f"{m}.{k}"] = {"file": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)}
    return files


def _commit(path: Path, manifest: dict, mods: dict[str, Modality]) -> IndexDir:
    gen = int(manifest["generation"])
    manifest = {**manifest, "format": FORMAT_VERSION, "files": _write_generation(path, gen, mods),
                "counts": {m: mods[m].index.ntotal for m in MODALITIES},
                "indexes": {m: mods[m].index.describe() for m in MODALITIES}}
    write_json_atomic(path / "manifest.json", manifest, indent=2)  # the commit point
    collect_garbage(path, manifest)
    return IndexDir(path, manifest, mods["images"], mods["captions"])


def check_target(path: Path, overwrite: bool) -> dict | None:
    """The manifest being replaced (None for a new directory); refuses what must not be replaced."""
    if not path.exists():
        return None
    if not path.is_dir():
        raise UserFileExists(f"{path} exists and is not a folder")
    if (path / "manifest.json").is_file():
        if not overwrite:
            raise UserFileExists(f"{path} already exists; pass --overwrite to replace it or --append to add to it")
        if (path / "items.sqlite").exists():
            raise UserFileExists(f"{path} is a living index (it has an item store: items added, removed or edited "
                                 "through the API or `ltd items`); --overwrite would lose them. Build into another "
                                 "folder, or move items.sqlite and items/ away first")
        try:
            return read_manifest(path)
        except IndexDirError:
            return None  # an unreadable manifest: replace it like a new build
    foreign = [p.name for p in path.iterdir() if not (_ours(p.name) or is_stale_temp(p))]
    if foreign:
        raise UserFileExists(f"{path} exists and holds files that are not an index ({', '.join(sorted(foreign)[:3])}…);"
                              " choose another --out")
    return None  # an interrupted first build: its leftovers are collected below


def save_index_dir(path: str | Path, manifest: dict, images: Modality, captions: Modality, *,
                   overwrite: bool = False) -> IndexDir:
    """Write a new index directory, or replace one (``overwrite``), as one atomic generation."""
    path = Path(path)
    old = check_target(path, overwrite)
    path.mkdir(parents=True, exist_ok=True)
    collect_garbage(path, old)
    gen = int((old or {}).get("generation", 0)) + 1
    manifest = {**manifest, "generation": gen, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return _commit(path, manifest, {"images": images, "captions": captions})


def append_to_index_dir(ix: IndexDir, images: tuple[np.ndarray, dict] | None,
                        captions: tuple[np.ndarray, dict] | None, *, skipped: list[dict] | None = None,
                        sources: dict | None = None, image_roots: list[str] | None = None) -> IndexDir:
    """Add (vectors, metadata lists) to an index directory as its next generation; ids continue.
    ``image_roots``: the folders its images may be served from, now (the old ones and the new)."""
    mods = {"images": ix.images, "captions": ix.captions}
    for name, new in (("images", images), ("captions", captions)):
        if new is None or len(new[0]) == 0:
            continue
        vectors, meta = new
        cur = mods[name]
        if vectors.shape[1] != cur.vectors.shape[1]:
            raise IndexDirError(f"cannot append {name}: dimension {vectors.shape[1]} != {cur.vectors.shape[1]}")
        n_old, n_new = len(cur.vectors), len(vectors)
        index = cur.index.copy()  # the loaded index stays as it was until the commit
        index.add(vectors)
        merged = {}
        for k in dict.fromkeys([*cur.meta, *meta]):  # per-item lists line up; a missing list is padded with None
            if isinstance(cur.meta.get(k), list) or isinstance(meta.get(k), list):
                merged[k] = list(cur.meta.get(k) or [None] * n_old) + list(meta.get(k) or [None] * n_new)
            else:
                merged[k] = cur.meta.get(k, meta.get(k))
        all_vectors = np.concatenate([np.asarray(cur.vectors), vectors])
        index.exact = all_vectors if index.rerank else None  # re-ranking scores the appended rows too
        mods[name] = Modality(index, all_vectors, merged)
    path = ix.path
    current = read_manifest(path)
    if current.get("generation") != ix.manifest.get("generation"):
        raise IndexDirError(f"{path} changed while this append was running; run it again")
    collect_garbage(path, current)
    manifest = {**ix.manifest, "generation": ix.generation + 1, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "skipped": ix.manifest.get("skipped", []) + (skipped or []),
                "appends": ix.manifest.get("appends", []) + ([sources] if sources else []),
                **({"image_roots": image_roots} if image_roots is not None else {})}
    return _commit(path, manifest, mods)


def commit_generation(ix: IndexDir, mods: dict[str, Modality], updates: dict) -> IndexDir:
    """Replace both sides of ``ix`` by ``mods`` as its next generation (compaction); ``updates`` go into
    the manifest. Refused when another writer committed since ``ix`` was loaded."""
    path = ix.path
    current = read_manifest(path)
    if current.get("generation") != ix.manifest.get("generation"):
        raise IndexDirError(f"{path} changed while this write was running; run it again")
    collect_garbage(path, current)
    manifest = {**ix.manifest, **updates, "generation": ix.generation + 1,
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return _commit(path, manifest, mods)


# ---- reading --------------------------------------------------------------------------------------
def _verify_files(path: Path, manifest: dict, hashes: bool) -> None:
    files = manifest.get("files") or {}
    missing = [f"{m}.{k}" for m in MODALITIES for k in KINDS if f"{m}.{k}" not in files]
    if missing:
        raise IndexDirError(f"{path}: the manifest does not list {', '.join(missing)}; rebuild the index")
    for entry in files.values():
        p = path / str(entry.get("file", ""))
        if p.parent != path or not _DATA_RE.match(p.name):
            raise IndexDirError(f"{path}: the manifest names an unexpected file {entry.get('file')!r}")
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise UserFileNotFound(f"{path}: {p.name} is missing") from None
        if size != entry.get("bytes"):
            raise IndexDirError(f"{path}: {p.name} is {size:,} bytes, the manifest says {entry.get('bytes')!r} "
                                "(torn or replaced); rebuild the index")
        if hashes and sha256_file(p) != entry.get("sha256"):
            raise IndexDirError(f"{path}: {p.name} does not match the sha256 its manifest recorded (changed or "
                                "copied in from another index); rebuild the index")


def _load_modality(path: Path, manifest: dict, name: str, mmap: bool = False) -> Modality:
    files = manifest["files"]
    try:
        meta = json.loads((path / files[f"{name}.json"]["file"]).read_text())
        vectors = np.load(path / files[f"{name}.npy"]["file"], mmap_mode="r", allow_pickle=False)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise IndexDirError(f"{path}: cannot read {name} ({e})") from None
    except RecursionError:
        raise IndexDirError(f"{path}: cannot read {name} (nested too deeply)") from None
    spec = (manifest.get("indexes") or {}).get(name) or {"factory": manifest.get("factory", "Flat")}
    index = VectorIndex.load(path / files[f"{name}.faiss"]["file"], spec, exact=vectors, mmap=mmap)
    want = (manifest.get("counts") or {}).get(name)
    counts = {index.ntotal, len(vectors), len(meta.get("ids", [])), want}
    if len(counts) != 1 or vectors.ndim != 2:
        raise IndexDirError(f"{path}: {name} files disagree ({index.ntotal} indexed, {len(vectors)} vectors, "
                            f"{len(meta.get('ids', []))} ids, manifest {want}); rebuild the index")
    return Modality(index, np.asarray(vectors), meta)


def load_index_dir(path: str | Path, *, checkpoint_sha256: str | None = None, verify: str = "hash",
                   mmap: bool = False) -> IndexDir:
    """Load an index directory after checking it is whole (``verify``: ``hash`` or ``counts``).
    With ``checkpoint_sha256``, refuse an index built by another checkpoint. The exact vectors are
    always memory-mapped; ``mmap`` also maps an IVF index's lists (``ltd serve``). ``hash`` reads every
    file once (through the page cache, not into the process: a 1 GB ``.npy`` costs seconds, not RAM);
    ``counts`` checks sizes and counts only, for indexes too large to hash at every start."""
    if verify not in ("hash", "counts"):
        raise ValueError(f"verify must be 'hash' or 'counts', got {verify!r}")
    path = Path(path)
    for attempt in (0, 1):  # a writer may commit (and delete the old files) between our reads: read again
        manifest = read_manifest(path)
        if manifest.get("format") != FORMAT_VERSION:
            raise IndexDirError(f"{path}: index format {manifest.get('format')} (written by an older `ltd`, without "
                                f"file hashes) is not served; rebuild it with `ltd index … --overwrite`")
        if checkpoint_sha256 is not None and manifest.get("checkpoint_sha256") != checkpoint_sha256:
            raise IndexDirError(
                f"{path} was built with checkpoint sha256 {str(manifest.get('checkpoint_sha256'))[:12]}…, but the "
                f"checkpoint given has {checkpoint_sha256[:12]}…: its embeddings would not match the query encoder. "
                "Rebuild the index with `ltd index` for this checkpoint.")
        try:
            _verify_files(path, manifest, hashes=verify == "hash")
            if verify == "counts":
                log.info("%s: sha256 of the data files not checked (verify=counts)", path)
            mods = {m: _load_modality(path, manifest, m, mmap) for m in MODALITIES}
        except FileNotFoundError as e:
            if attempt == 0 and read_manifest(path).get("generation") != manifest.get("generation"):
                continue
            raise IndexDirError(f"{e}; rebuild the index") from None
        return IndexDir(path, manifest, mods["images"], mods["captions"])
    raise AssertionError("unreachable")


def open_for_append(path: str | Path, *, checkpoint_sha256: str | None = None) -> IndexDir:
    """Load an index directory to add to it, first finishing what an interrupted write left (its
    temporaries and the previous generation's files), so a re-run that has nothing to add still cleans up."""
    path = Path(path)
    collect_garbage(path, read_manifest(path))
    return load_index_dir(path, checkpoint_sha256=checkpoint_sha256)


def resolve_checkpoint(index_path: str | Path, manifest: dict, override: str | Path | None = None) -> Path:
    """The checkpoint an index was built with: ``override``, else the path stored relative to the
    index directory (so moving both together keeps them paired), else the absolute one."""
    index_path = Path(index_path)
    candidates = [Path(override).expanduser()] if override else []
    if manifest.get("checkpoint_relative"):
        candidates.append(index_path / manifest["checkpoint_relative"])
    if manifest.get("checkpoint"):
        candidates.append(Path(manifest["checkpoint"]))
    for c in candidates:
        if c.is_file():
            return c.resolve()
    tried = ", ".join(str(c) for c in candidates) or "none recorded"
    raise UserFileNotFound(f"the checkpoint of index {index_path} is missing (looked at: {tried}); if it moved, "
                            f"serve it as --model NAME={index_path}@/path/to/checkpoint.pt")


def relative_to_index(index_path: Path, target: str | Path) -> str:
    return os.path.relpath(Path(target).resolve(), Path(index_path).resolve())


__all__ = ["FORMAT_VERSION", "ZERO_SHOT", "IndexDir", "IndexDirError", "Modality", "VectorIndex", "append_to_index_dir",
           "check_target", "collect_garbage", "commit_generation", "load_index_dir", "open_for_append",
           "read_manifest", "relative_to_index", "resolve_checkpoint", "save_index_dir"]
