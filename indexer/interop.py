"""clip-retrieval's embedding layout, out of an index directory and into one.

The layout (what ``clip-retrieval inference`` writes, and what autofaiss and clip-back read)::

    FOLDER/img_emb/img_emb_0.npy          (n, d) image embeddings, L2-normalised (clip-retrieval: float16)
    FOLDER/text_emb/text_emb_0.npy        (n, d) caption embeddings, row i is the caption of image row i
    FOLDER/metadata/metadata_0.parquet    n rows: image_path, caption, then one column per metadata key

Parts are numbered 0, 1, … zero-padded to the digits of the part count, as clip-retrieval pads them.
A row is one (image, caption) pair, so an index with five captions per image exports each image five
times (``side="pairs"``); an index whose sides are not paired exports one of them (``images`` or
``captions``). Exported rows also carry this project's ``image_id`` / ``caption_id``, so an import
gives back the same ids; embeddings stay float32 unless ``float16`` (clip-retrieval's own size).

Import groups rows into images by ``image_id`` (or ``image_path``), keeps every non-empty caption with
its image as ground truth, and writes the index through ``index.save_index_dir`` (whole or absent after
a crash); image paths are confined to ``images_root`` (``formats.confined_path``) and the model that
made the embeddings (a checkpoint or tower folder) is recorded, since text queries need it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from indexer.ann import build_vector_index
from indexer.build import _checkpoint_fields, ensure_zero_shot, load_model
from indexer.index import IndexDir, IndexDirError, Modality, check_target, load_index_dir, save_index_dir
from training.checkpoint import versions
from training.data.formats import confined_path
from training.data.tables import json_safe
from training.fsio import atomic_path, save_npy_atomic

log = logging.getLogger(__name__)

SIDES = ("auto", "pairs", "images", "captions")
KNOWN = ("image_path", "caption", "image_id", "caption_id")


def _part_names(n_parts: int) -> list[str]:
    width = int(math.log10(max(n_parts, 1))) + 1
    return [str(i).zfill(width) for i in range(n_parts)]


def _side(ix: IndexDir, side: str) -> str:
    c2i = np.asarray(ix.captions.meta.get("image", []), dtype=np.int64)
    paired = len(c2i) > 0 and (c2i >= 0).all() and len(set(c2i.tolist())) == len(ix.images.ids)
    if side == "auto":
        return "pairs" if paired else ("images" if len(ix.images.ids) else "captions")
    if side == "pairs" and not paired:
        raise IndexDirError(f"{ix.path}: not every caption has an image and every image a caption; export one side "
                            "(--side images or --side captions)")
    return side


def _metadata_columns(rows_meta: list[dict]) -> dict[str, pa.Array]:
    keys = list(dict.fromkeys(k for m in rows_meta for k in m))
    out = {}
    for k in keys:
        if k in KNOWN:
            log.warning("metadata key %r collides with a clip-retrieval column: left out", k)
            continue
        values = [m.get(k) for m in rows_meta]
        try:
            out[k] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: JSON text, as clip-retrieval's own metadata is
            out[k] = pa.array([None if v is None else json.dumps(v) for v in values])
    return out


def export_clip_retrieval(index_dir: str | Path, out: str | Path, *, side: str = "auto", float16: bool = False,
                          rows_per_part: int = 1_000_000) -> Path:
    """Write the index's embeddings and metadata in clip-retrieval's layout at ``out`` (written beside it
    and renamed into place, so ``out`` is whole or absent)."""
    if side not in SIDES:
        raise IndexDirError(f"side must be one of {', '.join(SIDES)}")
    ix, out = load_index_dir(index_dir), Path(out)
    if out.exists():
        raise IndexDirError(f"{out} exists; choose a new folder")
    side = _side(ix, side)
    img_meta, cap_meta = ix.images.meta, ix.captions.meta
    meta = img_meta.get("metadata") or [{} for _ in img_meta["ids"]]
    if side == "pairs":
        rows_img = np.asarray(cap_meta["image"], dtype=np.int64)
        table = {"image_path": [img_meta["paths"][i] for i in rows_img], "caption": list(cap_meta["texts"]),
                 "image_id": [img_meta["ids"][i] for i in rows_img], "caption_id": list(cap_meta["ids"])}
        rows_meta, img, txt = [meta[i] for i in rows_img], np.asarray(ix.images.vectors)[rows_img], np.asarray(ix.captions.vectors)
    elif side == "images":
        table = {"image_path": list(img_meta["paths"]), "image_id": list(img_meta["ids"])}
        rows_meta, img, txt = meta, np.asarray(ix.images.vectors), None
    else:
        table = {"caption": list(cap_meta["texts"]), "caption_id": list(cap_meta["ids"])}
        rows_meta, img, txt = [{} for _ in cap_meta["ids"]], None, np.asarray(ix.captions.vectors)
    n = len(next(iter(table.values())))
    dtype = np.float16 if float16 else np.float32
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        parts = [(a, min(a + rows_per_part, n)) for a in range(0, max(n, 1), rows_per_part)]
        for name, (a, b) in zip(_part_names(len(parts)), parts):
            for sub, vec in (("img_emb", img), ("text_emb", txt)):
                if vec is not None:
                    (tmp / sub).mkdir(exist_ok=True)
                    save_npy_atomic(tmp / sub / f"{sub}_{name}.npy", np.ascontiguousarray(vec[a:b], dtype=dtype))
            cols = {k: pa.array(v[a:b]) for k, v in table.items()} | _metadata_columns(rows_meta[a:b])
            (tmp / "metadata").mkdir(exist_ok=True)
            with atomic_path(tmp / "metadata" / f"metadata_{name}.parquet") as p:
                pq.write_table(pa.table(cols), p)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s → %s (%s, %d rows)", ix.path, out, side, n)
    return out


def _parts(folder: Path, sub: str, ext: str) -> list[Path]:
    files = sorted((folder / sub).glob(f"{sub}_*.{ext}"), key=lambda p: int(p.stem.rsplit("_", 1)[1])) \
        if (folder / sub).is_dir() else []
    bad = [p for p in files if not p.stem.rsplit("_", 1)[1].isdigit()]
    if bad:
        raise IndexDirError(f"{bad[0]}: not a clip-retrieval part name ({sub}_N.{ext})")
    return files


def read_clip_retrieval(folder: str | Path) -> tuple[np.ndarray | None, np.ndarray | None, list[dict]]:
    """(image embeddings, caption embeddings, metadata rows) of a clip-retrieval folder, float32, checked."""
    folder = Path(folder)
    meta_files = _parts(folder, "metadata", "parquet")
    img_files, txt_files = _parts(folder, "img_emb", "npy"), _parts(folder, "text_emb", "npy")
    if not meta_files or not (img_files or txt_files):
        raise IndexDirError(f"{folder}: not a clip-retrieval folder (metadata/metadata_N.parquet and "
                            "img_emb/img_emb_N.npy and/or text_emb/text_emb_N.npy)")
    rows: list[dict] = []
    for f in meta_files:
        rows.extend(pq.read_table(f).to_pylist())

    def stack(files: list[Path]) -> np.ndarray | None:
        if not files:
            return None
        if len(files) != len(meta_files):
            raise IndexDirError(f"{folder}: {len(files)} embedding parts but {len(meta_files)} metadata parts")
        arrs = [np.load(f, allow_pickle=False) for f in files]
        if any(a.ndim != 2 or a.dtype.kind != "f" for a in arrs) or len({a.shape[1] for a in arrs}) != 1:
            raise IndexDirError(f"{folder}: embedding parts must be 2-D float arrays of one width")
        v = np.concatenate(arrs).astype(np.float32)
        if len(v) != len(rows) or not np.isfinite(v).all():
            raise IndexDirError(f"{folder}: {len(v)} embeddings for {len(rows)} metadata rows (or non-finite values)")
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        if np.abs(norms - 1).max(initial=0) > 1e-3:  # float16 parts are normalised to ~1e-4: kept as they are
            log.warning("%s: embeddings are not L2-normalised; normalising them", folder)
            v = v / np.maximum(norms, 1e-12)
        return v
    return stack(img_files), stack(txt_files), rows


def _group(rows: list[dict], img: np.ndarray | None, root: Path) -> tuple[dict, list[int], dict, list[int]]:
    """Images (unique by image_id, else image_path) and captions of the rows: (images meta, the row of
    each image, captions meta, the row of each caption)."""
    by_key: dict = {}
    img_rows, cap_rows, c2i = [], [], []
    for r, row in enumerate(rows):
        if img is not None:
            key = row.get("image_id") if row.get("image_id") is not None else row.get("image_path", r)
            if key not in by_key:
                by_key[key] = len(img_rows)
                img_rows.append(r)
            k = by_key[key]
        else:
            k = -1
        if row.get("caption") is not None and str(row["caption"]).strip():
            cap_rows.append(r)
            c2i.append(k)
    first = [rows[r] for r in img_rows]
    paths = [str(confined_path(str(m.get("image_path") or f"row{r}"), root, f"metadata row {r}"))
             for r, m in zip(img_rows, first)]
    ids = [int(m["image_id"]) if m.get("image_id") is not None else k for k, m in enumerate(first)]
    images = {"ids": ids, "filenames": [str(m.get("image_path") or "") for m in first], "paths": paths,
              "captions": [[] for _ in img_rows]}
    for j, k in enumerate(c2i):
        if k >= 0:
            images["captions"][k].append(j)
    metadata = [{c: json_safe(v) for c, v in m.items() if c not in KNOWN} for m in first]
    if any(metadata):
        images["metadata"] = metadata
    caps = [rows[r] for r in cap_rows]
    captions = {"ids": [int(m["caption_id"]) if m.get("caption_id") is not None else j for j, m in enumerate(caps)],
                "texts": [str(m["caption"]).strip() for m in caps], "image": c2i}
    return images, img_rows, captions, cap_rows


def import_clip_retrieval(folder: str | Path, checkpoint: str | Path, out: str | Path, *,
                          images_root: str | Path | None = None, factory: str = "Flat", overwrite: bool = False,
                          name: str | None = None) -> IndexDir:
    """An index directory from a clip-retrieval folder; ``checkpoint`` is the model that embedded it (a
    run's checkpoint or a tower folder, whose zero-shot checkpoint is written into ``out``)."""
    out, folder = Path(out), Path(folder)
    check_target(out, overwrite)
    img, txt, rows = read_clip_retrieval(folder)
    if not Path(checkpoint).is_file():
        checkpoint = ensure_zero_shot(checkpoint, out)
    lm = load_model(checkpoint)
    dim = int(lm.model.image.embed_dim)
    for what, v in (("image", img), ("caption", txt)):
        if v is not None and v.shape[1] != dim:
            raise IndexDirError(f"{folder}: {what} embeddings have {v.shape[1]} dimensions, the model {dim}: not the model "
                                "that made them")
    root = Path(images_root) if images_root else folder
    images, img_rows, captions, cap_rows = _group(rows, img, root)
    img_vecs = img[img_rows] if img is not None else np.zeros((0, dim), np.float32)
    txt_vecs = txt[cap_rows] if txt is not None else np.zeros((0, dim), np.float32)
    truth = bool(len(captions["ids"])) and all(k >= 0 for k in captions["image"]) and len(img_vecs) > 0
    manifest = {"name": name or out.name, **_checkpoint_fields(lm, out), "model": lm.meta,
                "dataset": {"name": "clip-retrieval", "folder": str(folder.resolve()), "split": None},
                "image_roots": [str(root.resolve())] if images_root else [], "ground_truth": truth,
                "shortcuts": "none", "factory": factory, "metric": "inner_product", "dim": dim, "normalized": True,
                "skipped": [], "versions": versions(), "imported_from": "clip-retrieval"}

    def vindex(v):
        return build_vector_index(v, factory if len(v) else "Flat")
    return save_index_dir(out, manifest, Modality(vindex(img_vecs), img_vecs, images),
                          Modality(vindex(txt_vecs), txt_vecs, captions), overwrite=overwrite)
