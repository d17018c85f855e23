"""Sharded index directories: one index split into N shards, each a complete index directory of its own.

Layout::

    manifest.json                    the commit point: ``sharding`` (layout, count, and per shard its folder,
                                     generation, counts and the sha256 of its manifest), the parent's counts,
                                     checkpoint hash and dataset as in any index directory
    shards.g0002/s000/ … s00N/       generation 2's shards: each an index directory (indexer/index.py: its
                                     own manifest, data files and hashes) holding some rows of each side
    quantizer.images.g0002.faiss     by list only: the coarse quantizer every shard shares (the front
    quantizer.captions.g0002.faiss   routes a query with it)

Rows keep the numbering of the unsharded index: a shard's metadata lists its rows' values plus
``parent_rows`` (the row of each in the parent), so the links between sides (an image's caption rows, a
caption's image row) stay valid and a merged answer names the same rows one index would.

Layouts (``by``):

- ``id``: row r goes to shard r mod N; every query visits every shard.
- ``list`` (IVF indexes; a side that is not IVF is dealt by id): the coarse quantizer is trained once and
  shared; each inverted list goes whole to one shard, neighbouring lists to the same one (``balance_lists``:
  the list centres clustered into N groups, sizes kept within 5 % of equal), so a query visits only
  the shards owning the ``nprobe`` lists it probes. Every shard of either layout is cloned from the same
  trained index (the same centroids and PQ codebooks), so the union of the shards' lists is exactly the
  unsharded index: a shard's search probes the same nearest lists, of which it holds some, and the
  merged top k is the unsharded one (with re-ranking, over at least its candidates).

Crash safety as in indexer/index.py: generation g + 1's shards are written into a new folder (each
shard dir through ``save_index_dir``), then the quantizers, then the parent manifest is replaced (the
one atomic step), then generation g's folder is deleted. A kill before the manifest leaves g whole (or,
for a first build, no manifest: nothing is loaded); the next write removes the leftovers. Loading
checks each shard's manifest against the sha256 the parent recorded, then the shard's own files.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from indexer.index import (
    FORMAT_VERSION,
    MODALITIES,
    IndexDir,
    Modality,
    check_target,
    collect_garbage,
    load_index_dir,
    read_manifest,
    save_index_dir,
)
from indexer.items import DB, ItemStore, has_store
from indexer.vector_index import IndexDirError, VectorIndex
from training.errors import UserValueError
from training.fsio import atomic_path, remove_stale_temps, sha256_file, write_json_atomic

log = logging.getLogger(__name__)

LAYOUTS = ("id", "list")
MAX_SHARDS = 256
_SHARDS_RE = re.compile(r"^shards\.g(\d+)$")
_QUANT_RE = re.compile(r"^quantizer\.(images|captions)\.g(\d+)\.faiss$")


def is_sharded(manifest: dict) -> bool:
    """Whether a parent manifest describes a sharded index directory."""
    return isinstance(manifest.get("sharding"), dict)


def _ivf(index: faiss.Index):
    ivf = faiss.try_extract_index_ivf(index)
    return faiss.downcast_index(ivf) if ivf is not None else None


def _empty_like(vi: VectorIndex) -> faiss.Index:
    """A copy of ``vi``'s trained index without its vectors (same centroids, codebooks, parameters)."""
    index = faiss.clone_index(vi.index)
    index.reset()
    return index


def list_assignment(vi: VectorIndex, vectors: np.ndarray) -> np.ndarray:
    """The inverted list of every vector under ``vi``'s coarse quantizer."""
    ivf = _ivf(vi.index)
    _, lists = ivf.quantizer.search(np.ascontiguousarray(vectors, np.float32), 1)
    return lists[:, 0].astype(np.int64)


def balance_lists(sizes: np.ndarray, n: int, centroids: np.ndarray | None = None, slack: float = 1.05) -> np.ndarray:
    """Owner shard of each list. With ``centroids`` (the lists' centres), neighbouring lists go to the same
    shard, so a query's ``nprobe`` nearest lists tend to lie in few shards: the centres are clustered into
    ``n`` groups (k-means), and each list, largest first, goes to the nearest group that stays within
    ``slack`` × an equal share of the vectors (else to the lightest). Without, largest first to the lightest."""
    owners = np.zeros(len(sizes), np.int64)
    load = np.zeros(n, np.int64)
    prefs = None
    if centroids is not None and n > 1 and len(centroids) >= n:
        km = faiss.Kmeans(centroids.shape[1], n, niter=25, seed=1234, spherical=True)
        km.train(np.ascontiguousarray(centroids, np.float32))
        _, prefs = km.index.search(np.ascontiguousarray(centroids, np.float32), n)
    cap = slack * sizes.sum() / n
    for lst in np.argsort(-sizes, kind="stable"):
        s = int(np.argmin(load))
        if prefs is not None:
            s = next((int(g) for g in prefs[lst] if load[g] + sizes[lst] <= cap), s)
        owners[lst], load[s] = s, load[s] + sizes[lst]
    return owners


def split_rows(vi: VectorIndex, vectors: np.ndarray, n: int, by: str) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The parent rows of each shard (ascending), and for ``by="list"`` each list's owner shard."""
    if by == "id":
        return [np.arange(s, len(vectors), n, dtype=np.int64) for s in range(n)], None
    ivf = _ivf(vi.index)
    if ivf is None:
        raise UserValueError(f"--shard-by list needs an IVF index (--factory IVF…), not {vi.factory!r}; "
                             "use --shard-by id")
    lists = list_assignment(vi, vectors)
    owners = balance_lists(np.bincount(lists, minlength=ivf.nlist), n, ivf.quantizer.reconstruct_n(0, ivf.nlist))
    shard_of = owners[lists]
    return [np.flatnonzero(shard_of == s) for s in range(n)], owners


def _shard_meta(meta: dict, rows: np.ndarray, n_parent: int) -> dict:
    out = {k: ([v[int(r)] for r in rows] if isinstance(v, list) and len(v) == n_parent else v) for k, v in meta.items()}
    out["parent_rows"] = rows.tolist()
    return out


def _shard_modality(mod: Modality, rows: np.ndarray) -> Modality:
    vectors = np.ascontiguousarray(np.asarray(mod.vectors)[rows], np.float32)
    index = _empty_like(mod.index)
    if len(vectors):
        index.add(vectors)
    vi = VectorIndex(index, mod.index.factory, rerank=mod.index.rerank, exact=vectors if mod.index.rerank else None)
    return Modality(vi, vectors, _shard_meta(mod.meta, rows, len(mod.vectors)))


@dataclass(frozen=True)
class ShardPlan:
    rows: dict[str, list[np.ndarray]]  # side → parent rows of each shard
    owners: dict[str, np.ndarray | None]  # side → owner shard of each inverted list (by list)


def plan_shards(ix: IndexDir, n: int, by: str) -> ShardPlan:
    """Which parent rows of each side go to which shard (module doc)."""
    if by not in LAYOUTS:
        raise UserValueError(f"--shard-by must be one of {', '.join(LAYOUTS)}, got {by!r}")
    if not 1 <= n <= MAX_SHARDS:
        raise UserValueError(f"--index-shards must be in 1..{MAX_SHARDS}, got {n}")
    rows, owners = {}, {}
    ivf = {m: _ivf(getattr(ix, m).index.index) is not None for m in MODALITIES}
    if by == "list" and not any(ivf.values()):
        raise UserValueError(f"--shard-by list needs an IVF index (--factory IVF…), not "
                             f"{ix.images.index.factory!r}; use --shard-by id")
    for m in MODALITIES:  # by list, a side that is not IVF (a corpus's few captions: Flat) is dealt by id
        mod = getattr(ix, m)
        rows[m], owners[m] = split_rows(mod.index, np.asarray(mod.vectors), n, by if ivf[m] else "id")
    return ShardPlan(rows, owners)


def _clean(path: Path, manifest: dict | None) -> None:
    """Remove what no committed parent manifest names: other generations' shard folders and quantizers."""
    remove_stale_temps(path)
    gen = int((manifest or {}).get("generation", -1)) if manifest and is_sharded(manifest) else -1
    for p in path.iterdir():
        m = _SHARDS_RE.match(p.name) or _QUANT_RE.match(p.name)
        if m and int(m.groups()[-1]) != gen:
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    collect_garbage(path, manifest)


def _retire_store(ix: IndexDir, in_place: bool) -> None:
    """An item store whose every write the base generation already holds describes nothing the shards
    will not: sharding in place drops it (before the commit, so a kill leaves the unsharded index with a
    store it re-seeds). One holding writes the base does not is refused: they would be lost."""
    with contextlib.closing(ItemStore.open(ix, create=False)) if has_store(ix.path) else contextlib.nullcontext() as st:
        unfolded = st.last_seq() - st.folded_seq if st is not None else 0
    if unfolded > 0:
        raise UserValueError(f"{ix.path} has {unfolded} write(s) through the API or `ltd items` that its base "
                             "generation does not hold yet; run `ltd index --compact` first, then shard it")
    if in_place:
        for suffix in ("", "-wal", "-shm", "-journal"):
            (ix.path / f"{DB}{suffix}").unlink(missing_ok=True)


def write_sharded(out: str | Path, ix: IndexDir, n: int, by: str = "id", *, overwrite: bool = False,
                  compaction: bool = False) -> dict:
    """Write ``ix`` (a loaded, unsharded index) as a sharded index directory at ``out`` (``out`` may be
    ``ix.path`` itself: the unsharded generation is replaced); returns the parent manifest. ``compaction``:
    ``ix`` is a sharded ``out``'s merged next generation (indexer/compact.py): its item store stays, and
    so does the build's ``created`` stamp the store is matched against."""
    out = Path(out)
    plan = plan_shards(ix, n, by)
    in_place = out.resolve() == ix.path.resolve()
    old = read_manifest(out) if in_place else check_target(out, overwrite)
    if compaction:
        if not in_place or (old or {}).get("generation") != ix.manifest.get("generation"):
            raise IndexDirError(f"{out} changed while this compaction was running; run it again")
    else:
        _retire_store(ix, in_place)
    out.mkdir(parents=True, exist_ok=True)
    _clean(out, old)
    gen = int((old or {}).get("generation", 0)) + 1
    folder = out / f"shards.g{gen:04d}"
    if folder.exists():  # a killed write of this same generation: its half is garbage
        shutil.rmtree(folder)
    folder.mkdir()
    base = {k: v for k, v in ix.manifest.items() if k not in ("files", "counts", "indexes", "generation", "sharding")}
    shards = []
    for s in range(n):
        mods = {m: _shard_modality(getattr(ix, m), plan.rows[m][s]) for m in MODALITIES}
        sdir = folder / f"s{s:03d}"
        sub = save_index_dir(sdir, {**base, "shard": s, "shard_count": n}, mods["images"], mods["captions"])
        shards.append({"dir": f"{folder.name}/{sdir.name}", "generation": sub.generation,
                       "counts": {m: len(plan.rows[m][s]) for m in MODALITIES},
                       "manifest_sha256": sha256_file(sdir / "manifest.json")})
    files = {}
    for m in MODALITIES:
        if plan.owners[m] is not None:
            qp = out / f"quantizer.{m}.g{gen:04d}.faiss"
            with atomic_path(qp) as tmp:
                faiss.write_index(_ivf(getattr(ix, m).index.index).quantizer, str(tmp))
            files[f"quantizer.{m}"] = {"file": qp.name, "bytes": qp.stat().st_size, "sha256": sha256_file(qp)}
    sharding = {"by": by, "count": n, "shards": shards,
                "owners": {m: o.tolist() for m, o in plan.owners.items() if o is not None}}
    manifest = {**base, "format": FORMAT_VERSION, "generation": gen, "files": files, "sharding": sharding,
                "counts": {m: len(getattr(ix, m).vectors) for m in MODALITIES},
                "indexes": {m: getattr(ix, m).index.describe() for m in MODALITIES},
                "created": ix.manifest["created"] if compaction else time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if compaction:
        manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(out / "manifest.json", manifest, indent=2)  # the commit point
    _clean(out, manifest)
    return manifest


def shard_index_dir(path: str | Path, n: int, by: str = "id", *, out: str | Path | None = None,
                    overwrite: bool = False) -> dict:
    """Split the index directory ``path`` into ``n`` shards (``by`` id or list), in place or into ``out``;
    returns the parent manifest (``ltd index --index-shards N --shard-by id|list``)."""
    ix = load_index_dir(path)
    if is_sharded(ix.manifest):
        raise UserValueError(f"{path} is already sharded")
    return write_sharded(out if out is not None else path, ix, n, by, overwrite=overwrite)


# ---- reading ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardedDir:
    """A verified sharded index directory: its parent manifest and its shards' folders."""

    path: Path
    manifest: dict
    shard_paths: tuple[Path, ...]

    @property
    def by(self) -> str:
        """The layout: ``id`` or ``list``."""
        return self.manifest["sharding"]["by"]

    def owners(self, side: str) -> np.ndarray | None:
        """Owner shard of each inverted list of ``side`` (by list), else None."""
        o = self.manifest["sharding"].get("owners", {}).get(side)
        return None if o is None else np.asarray(o, np.int64)

    def quantizer(self, side: str) -> faiss.Index | None:
        """The shared coarse quantizer of ``side`` (by list), else None."""
        entry = self.manifest.get("files", {}).get(f"quantizer.{side}")
        return None if entry is None else faiss.read_index(str(self.path / entry["file"]))


def open_sharded(path: str | Path, *, checkpoint_sha256: str | None = None, verify: str = "hash") -> ShardedDir:
    """Check a sharded directory's parent manifest, quantizers and each shard's manifest (the shards'
    data files are checked when each shard loads: ``load_shard``). IndexDirError when anything is torn."""
    path = Path(path)
    manifest = read_manifest(path)
    if not is_sharded(manifest) or manifest.get("format") != FORMAT_VERSION:
        raise IndexDirError(f"{path} is not a sharded index directory")
    if checkpoint_sha256 is not None and manifest.get("checkpoint_sha256") != checkpoint_sha256:
        raise IndexDirError(f"{path} was built with another checkpoint; rebuild it")
    shards = manifest["sharding"].get("shards") or []
    if len(shards) != manifest["sharding"].get("count") or not shards:
        raise IndexDirError(f"{path}: the manifest's shard list is incomplete; rebuild the index")
    paths = []
    for s, entry in enumerate(shards):
        rel = str(entry.get("dir", ""))
        if not re.fullmatch(r"shards\.g\d+/s\d{3}", rel):
            raise IndexDirError(f"{path}: the manifest names an unexpected shard folder {rel!r}")
        mf = path / rel / "manifest.json"
        if not mf.is_file() or sha256_file(mf) != entry.get("manifest_sha256"):
            raise IndexDirError(f"{path}: shard {s} is missing or not the one the manifest recorded (torn or "
                                "replaced); rebuild the index")
        paths.append(path / rel)
    for entry in (manifest.get("files") or {}).values():
        p = path / str(entry.get("file", ""))
        if p.parent != path or not _QUANT_RE.match(p.name) or not p.is_file() or p.stat().st_size != entry.get("bytes") \
                or (verify == "hash" and sha256_file(p) != entry.get("sha256")):
            raise IndexDirError(f"{path}: {p.name} does not match its manifest; rebuild the index")
    return ShardedDir(path, manifest, tuple(paths))


def load_shard(sd: ShardedDir, s: int, *, verify: str = "hash", mmap: bool = True) -> IndexDir:
    """Shard ``s`` of ``sd`` as an index directory, verified (its lists and vectors memory-mapped)."""
    ix = load_index_dir(sd.shard_paths[s], verify=verify, mmap=mmap)
    want = sd.manifest["sharding"]["shards"][s]
    if ix.generation != want.get("generation") or {m: ix.manifest["counts"][m] for m in MODALITIES} != want["counts"]:
        raise IndexDirError(f"{sd.path}: shard {s} disagrees with the parent manifest; rebuild the index")
    for m in MODALITIES:
        if len(getattr(ix, m).meta.get("parent_rows", ())) != want["counts"][m]:
            raise IndexDirError(f"{sd.path}: shard {s} has no row map for {m}; rebuild the index")
    return ix


def read_shard_data(sd: ShardedDir, s: int, *, verify: str = "hash") -> dict[str, tuple[np.ndarray, dict]]:
    """Shard ``s``'s exact vectors (memory-mapped) and metadata of each side, checked against the shard's
    manifest (sizes, and sha256 unless ``verify="counts"``), without its search index: what the front of a
    cluster reads (the shard's searcher, elsewhere, loads the rest)."""
    path = sd.shard_paths[s]
    manifest = read_manifest(path)
    out = {}
    for m in MODALITIES:
        files = {}
        for kind in ("npy", "json"):
            entry = (manifest.get("files") or {}).get(f"{m}.{kind}") or {}
            p = path / str(entry.get("file", ""))
            if p.parent != path or not p.is_file() or p.stat().st_size != entry.get("bytes") \
                    or (verify == "hash" and sha256_file(p) != entry.get("sha256")):
                raise IndexDirError(f"{sd.path}: shard {s}'s {m}.{kind} does not match its manifest; rebuild the index")
            files[kind] = p
        try:
            meta = json.loads(files["json"].read_text())
            vectors = np.load(files["npy"], mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, RecursionError) as e:
            raise IndexDirError(f"{sd.path}: cannot read shard {s}'s {m} ({type(e).__name__})") from None
        n = sd.manifest["sharding"]["shards"][s]["counts"][m]
        if vectors.ndim != 2 or len(vectors) != n or len(meta.get("parent_rows", ())) != n:
            raise IndexDirError(f"{sd.path}: shard {s}'s {m} files disagree with the manifest; rebuild the index")
        out[m] = (vectors, meta)
    return out


def shard_rows(ix: IndexDir, side: str) -> np.ndarray:
    """The parent row of each of shard ``ix``'s rows of ``side``."""
    return np.asarray(getattr(ix, side).meta["parent_rows"], np.int64)


def describe(path: str | Path) -> str:
    """One line about a sharded directory, for the CLI."""
    m = read_manifest(path)
    sh = m["sharding"]
    per = [s["counts"]["images"] for s in sh["shards"]]
    return json.dumps({"index": str(path), "shards": sh["count"], "by": sh["by"], "images_per_shard": per,
                       "captions": m["counts"]["captions"], "factory": m.get("factory")})
