"""Build index directories: a dataset split (with ground truth) or a free corpus (folder of images
and/or a text file of captions, no ground truth), and append to existing ones."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from indexer import image_roots
from indexer.ann import build_vector_index
from indexer.caption_texts import with_model_texts
from indexer.corpus import IMAGE_EXTS, check_corpus_inputs, image_files, read_captions_file
from indexer.embed import embed_captions, embed_image_features, embed_image_files
from indexer.file_meta import file_metadata
from indexer.index import (
    ZERO_SHOT,
    IndexDir,
    IndexDirError,
    Modality,
    append_to_index_dir,
    check_target,
    inside_roots,
    open_for_append,
    relative_to_index,
    save_index_dir,
)
from indexer.ray_engine import RayOptions, ray_embed, remove_shards
from training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    versions,
    zero_shot_checkpoint,
)
from training.data.formats import read_dataset
from training.data.karpathy import Split, image_folders
from training.data.members import location
from training.data.shortcuts import apply_shortcuts
from training.errors import UserValueError
from training.features import ExtractionSpec, extract_features, lookup_features
from training.fsio import sha256_file
from training.losses.objective import describe_loss
from training.models.dual_encoder import DualEncoder
from training.models.towers import source_from_dir
from training.regions import read_precomputed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbedEngine:
    """How a build embeds and stores an index's vectors: the FAISS ``factory`` of both sides, the
    ``runtime`` that runs the frozen image backbone (``training/models/runtimes.py``; None: the
    checkpoint's own) and ``ray``, a ``ray_engine.RayOptions`` to embed on a Ray cluster (None: in this
    process)."""

    factory: str = "Flat"
    runtime: str | None = None
    ray: RayOptions | None = None


@dataclass(frozen=True)
class IndexRequest:
    """The index :func:`build_dataset_index` or :func:`build_corpus_index` writes: the folder ``out``
    (``overwrite``: an index already there is replaced), its ``name`` in the manifest (None: the folder's
    name) and the ``engine`` that embeds and stores its vectors."""

    out: str | Path
    overwrite: bool = False
    name: str | None = None
    engine: EmbedEngine = field(default_factory=EmbedEngine)


@dataclass(frozen=True)
class CorpusSource:
    """What :func:`_corpus_items` embeds: the images of the folder ``images_dir`` and the captions of the
    file ``captions_file`` (either may be None), numbered from ``start_image_id`` and ``start_caption_id``.
    Items already in the index (``known_images``: content sha256 of indexed and of skipped files;
    ``known_texts``: caption text) are left out, so an append that is run twice adds nothing the second time."""

    images_dir: str | Path | None = None
    captions_file: str | Path | None = None
    start_image_id: int = 0
    start_caption_id: int = 0
    known_images: AbstractSet[str] = frozenset()
    known_texts: AbstractSet[str] = frozenset()


@dataclass
class LoadedModel:
    model: DualEncoder
    cfg: object
    checkpoint: Path
    sha256: str
    meta: dict


def load_model(checkpoint: str | Path, runtime: str | None = None) -> LoadedModel:
    """A checkpoint's model, on the process's device (``training.device``); ``runtime`` runs its frozen image
    backbone (``training/models/runtimes.py``)."""
    checkpoint = Path(checkpoint).resolve()
    ckpt = load_checkpoint(checkpoint)
    model, _, cfg = model_from_checkpoint(ckpt)
    if runtime and hasattr(model.image.backbone, "set_runtime"):
        model.image.backbone.set_runtime(runtime)
    if model.similarity != "cosine":
        raise IndexDirError(f"{checkpoint}: {model.similarity}-similarity models cannot use an inner-product FAISS "
                            "index; evaluate them with training validation instead")
    meta = {"train_name": cfg.train.name, "similarity": model.similarity, "embed_dim": int(model.image.embed_dim),
            "loss": describe_loss(cfg.loss),
            "backbone": cfg.model.backbone, "image_features": cfg.model.image_features,
            "image_encoder": cfg.model.image_encoder, "text_encoder": cfg.model.text_encoder, "epoch": ckpt.get("epoch"),
            "best_val_rsum": (ckpt.get("best") or {}).get("rsum")}
    return LoadedModel(model, cfg, checkpoint, sha256_file(checkpoint), meta)


def ensure_zero_shot(clip_dir: str | Path, index_dir: str | Path, text_tower: str | Path | None = None) -> Path:
    """``index_dir/zero_shot.pt`` for a tower folder (CLIP, SigLIP, open_clip …; ``text_tower``: another
    folder's text tower beside it): written once, and kept while the towers (config, weights, tokenizer,
    preprocessing) are the same, so its sha256 — which the index's manifest records and the server
    checks — stays put across rebuilds and appends. Index and checkpoint then move together."""
    path = Path(index_dir) / ZERO_SHOT
    if path.is_file():
        try:
            if load_checkpoint(path).get("clip") == source_from_dir(clip_dir, text_tower).spec:
                return path
        except CheckpointError as e:
            log.warning("replacing %s: %s", path, e)
    payload = zero_shot_checkpoint(clip_dir, text_tower)  # a folder that cannot be used fails here, before --out exists
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("zero-shot checkpoint of %s → %s", clip_dir, path)
    return save_checkpoint(path, payload)


def _checkpoint_fields(lm: LoadedModel, out: str | Path) -> dict:
    """Where the checkpoint is: relative to the index (found again when both move together) and absolute."""
    return {"checkpoint": str(lm.checkpoint), "checkpoint_relative": relative_to_index(Path(out), lm.checkpoint),
            "checkpoint_sha256": lm.sha256}


def _dataset_image_features(lm: LoadedModel, ds, idx: list[int], transform,
                            transform_id: str) -> tuple[torch.Tensor, dict[int, str]]:
    """Backbone features (views averaged) of dataset images ``idx``; reuses the training cache over the
    whole dataset when it is complete, otherwise extracts only these images."""
    m = lm.cfg.model
    if m.backbone == "precomputed":  # the file's features, or its regions for a region encoder
        store, _ = read_precomputed(m, ds, cache_dir=lm.cfg.data.cache_dir)
        return store.mean_view(idx), {}
    bb = lm.model.image.backbone
    all_paths = [im.path for im in ds.images]
    store = lookup_features(bb, all_paths, cache_dir=lm.cfg.data.cache_dir, n_views=m.crops, transform_id=transform_id)
    if store is not None:
        pos = {i: k for k, i in enumerate(idx)}
        return store.mean_view(idx), {pos[i]: r for i, r in store.failed.items() if i in pos}
    # Index numbering for the shortcut transform stays dataset-wide.
    sub_transform = None if transform is None else (lambda k, v: transform(idx[k], v))
    spec = ExtractionSpec(n_views=m.crops, workers=0 if transform else None, transform=sub_transform,
                          transform_id=f"{transform_id}|subset" if transform_id else "")
    store = extract_features(bb, [all_paths[i] for i in idx], cache_dir=lm.cfg.data.cache_dir, spec=spec)
    return store.mean_view(), dict(store.failed)


def _confined_split(sp: Split) -> tuple[Split, list[Path], list[dict]]:
    """The split without images whose file resolves outside the dataset's image folders (a symlink
    to elsewhere: the server would refuse to show it), those folders, and the skipped entries."""
    roots = image_folders(sp.images)
    out = [k for k, im in enumerate(sp.images) if not inside_roots(im.path.resolve(), roots)]
    if not out:
        return sp, roots, []
    log.warning("%d images resolve outside the dataset's image folders (symlinks?): skipped", len(out))
    keep = [k for k in range(len(sp.images)) if k not in set(out)]
    return (sp.keep_images(keep), roots,
            [{"file": str(sp.images[k].path), "reason": "resolves outside the dataset's image folders"} for k in out])


def split_images_meta(ds, kept_imgs: list, c2i: list[int]) -> dict:
    """The images side's metadata of a split: ids, file names, resolved paths (a shard member's shard,
    with ``members``: [name, offset, size]), caption positions, COCO ids, and the corpus's per-image
    ``metadata`` (a list of JSON-safe dicts, one per image row, when the dataset has any)."""
    locs = [location(im.path) for im in kept_imgs]
    caps: list[list[int]] = [[] for _ in kept_imgs]
    for j, i in enumerate(c2i):
        if i >= 0:
            caps[i].append(j)
    meta = {"ids": [im.id for im in kept_imgs], "filenames": [im.filename for im in kept_imgs],
            "paths": [p for p, _ in locs], "captions": caps}
    if any(m is not None for _, m in locs):
        meta["members"] = [m for _, m in locs]
    if any(im.cocoid is not None for im in kept_imgs):
        meta["cocoids"] = [im.cocoid for im in kept_imgs]
    if ds.image_meta:
        meta["metadata"] = [ds.image_meta[im.index] for im in kept_imgs]
    return meta


def build_dataset_index(checkpoint: str | Path, dataset: str | Path, split: str, request: IndexRequest, *,
                        images_root: str | None = None, shortcuts: str = "none", columns: str = "") -> IndexDir:
    """Index a split of a dataset in any format (``training/data/formats.py``; ground truth: its captions)
    where and how ``request`` says; ``columns``: a table's column roles."""
    out, factory, runtime, ray = request.out, request.engine.factory, request.engine.runtime, request.engine.ray
    check_target(Path(out), request.overwrite)
    ds = read_dataset(dataset, images_root=images_root, drop_missing=True, columns=columns)
    ds.split(split)  # an unknown split fails here, before the model loads
    lm = load_model(checkpoint, runtime)
    sp, roots, outside = _confined_split(ds.split(split))
    sc = apply_shortcuts(shortcuts, ds, seed=lm.cfg.train.seed, evaluation=True)
    idx = [im.index for im in sp.images]
    texts = [sc.caption(c) for c in sp.captions]
    if ray is not None:
        if sc.image_transform is not None:
            raise IndexDirError("--engine ray does not evaluate shortcuts; use the local engine")
        img_vecs, failed, txt_vecs = ray_embed_fn(lm, ray, runtime)(
            [im.path for im in sp.images], texts)
        keep = [k for k in range(len(idx)) if k not in failed]
    elif lm.model.image.frozen and (lm.model.image.backbone is None or lm.model.image.backbone.cache_inference):
        feats, failed = _dataset_image_features(lm, ds, idx, sc.image_transform, sc.transform_id)
        keep = [k for k in range(len(idx)) if k not in failed]
        img_vecs = embed_image_features(lm.model, feats[keep])
    else:  # from the files: a backbone being trained, or one whose embeddings must not pass through float16
        img_vecs, failed = embed_image_files(lm.model, [im.path for im in sp.images],
                                             transform=sc.image_transform, image_ids=idx)
        keep = [k for k in range(len(idx)) if k not in failed]
    if ray is None:
        txt_vecs = embed_captions(lm.model, texts)
    pos = {old: new for new, old in enumerate(keep)}
    c2i = [pos.get(int(i), -1) for i in sp.caption_to_image]
    kept_imgs = [sp.images[k] for k in keep]
    images_meta = split_images_meta(ds, kept_imgs, c2i)
    captions_meta = {"ids": [c.id for c in sp.captions], "texts": [c.raw for c in sp.captions], "image": c2i}
    if texts != captions_meta["texts"]:  # a shortcut setting rewrote them: read back with model_texts()
        with_model_texts(captions_meta, texts)
    if any(c.annid is not None for c in sp.captions):
        captions_meta["annids"] = [c.annid for c in sp.captions]
    skipped = outside + [{"file": str(sp.images[k].path), "reason": r} for k, r in sorted(failed.items())]
    manifest = {"name": request.name or Path(out).name, **_checkpoint_fields(lm, out),
                "model": lm.meta, "dataset": {"name": ds.name, "json": str(ds.json_path), "split": sp.name,
                                              "images_root": str(ds.root.resolve())},
                "image_roots": [str(r) for r in roots],
                "ground_truth": bool(sp.captions), "shortcuts": shortcuts, "factory": factory, "metric": "inner_product",
                "dim": int(img_vecs.shape[1]), "normalized": True, "skipped": skipped, "versions": versions()}
    ix = save_index_dir(out, manifest, Modality(build_vector_index(img_vecs, factory), img_vecs, images_meta),
                        Modality(build_vector_index(txt_vecs, factory), txt_vecs, captions_meta),
                        overwrite=request.overwrite)
    image_roots.record(ix.path, roots)
    _drop_shards(ray)
    return ix


EmbedFn = Callable[[list[Path], list[str]], tuple[np.ndarray, dict[int, str], np.ndarray]]


def local_embed_fn(lm: LoadedModel) -> EmbedFn:
    """Images and captions embedded in this process (decoding in worker processes)."""
    def run(paths: list[Path], texts: list[str]):
        img, failed = (embed_image_files(lm.model, paths) if paths
                       else (np.zeros((0, lm.model.image.embed_dim), np.float32), {}))
        txt = (embed_captions(lm.model, texts) if texts
               else np.zeros((0, lm.model.text.out_dim), np.float32))
        return img, failed, txt
    return run


def ray_embed_fn(lm: LoadedModel, opts, runtime: str | None) -> EmbedFn:
    """Images and captions embedded by a Ray actor pool (``indexer/ray_engine.py``), in one run."""
    def run(paths: list[Path], texts: list[str]):
        return ray_embed(lm.checkpoint, lm.sha256, paths, texts, lm.model.image.embed_dim, opts, runtime=runtime)
    return run


def _drop_shards(ray) -> None:
    """The index is committed: a Ray run's shards are no longer needed to resume."""
    if ray is not None:
        remove_shards(ray)


def _new_images(folder: Path, known_images: set[str]) -> list[tuple[Path, str]]:
    files = image_files(folder)
    if not files:
        raise UserValueError(f"no image files ({', '.join(sorted(IMAGE_EXTS))}) under {folder}")
    seen, new = set(known_images), []
    for p in files:
        d = sha256_file(p)
        if d not in seen:
            seen.add(d)
            new.append((p, d))
    if len(new) < len(files):
        log.info("%d of %d images are already in the index: skipped", len(files) - len(new), len(files))
    return new


def _new_texts(path: Path, known_texts: set[str]) -> list[str]:
    all_texts = read_captions_file(path)
    if not all_texts:
        raise UserValueError(f"{path} has no captions (one per line expected)")
    texts = [t for t in dict.fromkeys(all_texts) if t not in known_texts] if known_texts else all_texts
    if len(texts) < len(all_texts) and known_texts:
        log.info("%d of %d captions are already in the index: skipped", len(all_texts) - len(texts), len(all_texts))
    return texts


def _corpus_items(lm: LoadedModel, source: CorpusSource, embed: EmbedFn):
    """Embeddings and metadata of a folder's images and a file's captions, those already in the index left
    out (:class:`CorpusSource` says which)."""
    folder = Path(source.images_dir) if source.images_dir else None
    new = _new_images(folder, source.known_images) if folder else []
    outside = [p for p, _ in new if not inside_roots(p.resolve(), [folder.resolve()])]
    if outside:  # links to files elsewhere: the server would refuse to show them, so they are not indexed
        log.warning("%d files under %s resolve outside it (symlinks): skipped", len(outside), folder)
        new = [(p, d) for p, d in new if p not in set(outside)]
    texts = _new_texts(Path(source.captions_file), source.known_texts) if source.captions_file else []
    img_vecs, failed, txt_vecs = embed([p for p, _ in new], texts)
    ok = [(p, d) for k, (p, d) in enumerate(new) if k not in failed]
    skipped = [{"file": str(p), "reason": "resolves outside the images folder"} for p in outside]
    skipped += [{"file": str(new[k][0]), "reason": r, "sha256": new[k][1]} for k, r in sorted(failed.items())]
    start_image_id, start_caption_id = source.start_image_id, source.start_caption_id
    images_meta = {"ids": list(range(start_image_id, start_image_id + len(ok))),
                   "filenames": [str(p.relative_to(folder)) for p, _ in ok],
                   "paths": [str(p.resolve()) for p, _ in ok], "captions": [[] for _ in ok], "sha256": [d for _, d in ok],
                   "metadata": [file_metadata(p, folder) for p, _ in ok]}  # folder, file time, EXIF date, size
    captions_meta = {"ids": list(range(start_caption_id, start_caption_id + len(texts))), "texts": texts,
                     "image": [-1] * len(texts)}
    return img_vecs, images_meta, txt_vecs, captions_meta, skipped


def build_corpus_index(checkpoint: str | Path, request: IndexRequest, *, images_dir: str | Path | None = None,
                       captions_file: str | Path | None = None) -> IndexDir:
    """Index a folder of images and/or a file of captions (no ground truth) where and how ``request`` says
    (its engine's ``ray``: embedded on a Ray cluster instead of in this process)."""
    out, factory, runtime, ray = request.out, request.engine.factory, request.engine.runtime, request.engine.ray
    check_corpus_inputs(images_dir, captions_file)
    check_target(Path(out), request.overwrite)
    lm = load_model(checkpoint, runtime)
    embed = ray_embed_fn(lm, ray, runtime) if ray else local_embed_fn(lm)
    img_vecs, images_meta, txt_vecs, captions_meta, skipped = _corpus_items(
        lm, CorpusSource(images_dir, captions_file), embed)
    def vindex(v):  # an empty side cannot train IVF/PQ; it stays an (empty) exact index
        return build_vector_index(v, factory if len(v) else "Flat")
    manifest = {"name": request.name or Path(out).name, **_checkpoint_fields(lm, out),
                "model": lm.meta, "dataset": {"name": "corpus", "images_dir": str(images_dir or ""),
                                              "captions_file": str(captions_file or ""), "split": None},
                "image_roots": [str(Path(images_dir).resolve())] if images_dir else [],
                "ground_truth": False, "shortcuts": "none", "factory": factory, "metric": "inner_product",
                "dim": int(lm.model.image.embed_dim), "normalized": True, "skipped": skipped, "versions": versions()}
    ix = save_index_dir(out, manifest, Modality(vindex(img_vecs), img_vecs, images_meta),
                        Modality(vindex(txt_vecs), txt_vecs, captions_meta), overwrite=request.overwrite)
    image_roots.record(ix.path, [images_dir] if images_dir else [])
    _drop_shards(ray)
    return ix


def append_corpus(index_dir: str | Path, checkpoint: str | Path, *, images_dir=None, captions_file=None,
                  runtime: str | None = None) -> IndexDir:
    """Add a folder's images and/or a file's captions to a corpus index; what is already there is skipped."""
    check_corpus_inputs(images_dir, captions_file)
    lm = load_model(checkpoint, runtime)
    ix = open_for_append(index_dir, checkpoint_sha256=lm.sha256)
    if ix.has_ground_truth:
        raise IndexDirError(f"{index_dir} indexes a dataset split; --append adds to corpus indexes only")
    next_img = max(ix.images.ids, default=-1) + 1
    next_cap = max(ix.captions.ids, default=-1) + 1
    # photos already indexed, and files already tried and skipped: neither is embedded or listed again
    known_images = {d for d in ix.images.meta.get("sha256", []) if d}
    known_images |= {s["sha256"] for s in ix.manifest.get("skipped", []) if s.get("sha256")}
    corpus = CorpusSource(images_dir, captions_file, next_img, next_cap, known_images=known_images,
                          known_texts=set(ix.captions.meta.get("texts", [])))
    img_vecs, images_meta, txt_vecs, captions_meta, skipped = _corpus_items(lm, corpus, local_embed_fn(lm))
    if not len(img_vecs) and not len(txt_vecs) and not skipped:
        log.info("%s: nothing new to add", index_dir)
        return ix
    sources = {"images_dir": str(images_dir or ""), "captions_file": str(captions_file or ""),
               "images": len(img_vecs), "captions": len(txt_vecs), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    roots = [str(r) for r in ix.image_roots] + ([str(Path(images_dir).resolve())] if images_dir else [])
    out = append_to_index_dir(ix, (img_vecs, images_meta), (txt_vecs, captions_meta), skipped=skipped,
                              sources=sources, image_roots=sorted(set(roots)))
    image_roots.record(out.path, [images_dir] if images_dir else [])  # only the folder given now
    return out
