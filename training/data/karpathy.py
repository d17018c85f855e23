"""Reader for the Karpathy split JSON (COCO, Flickr30k, Flickr8k and our synthetic scenes).

One code path for every dataset: ``images[].filename|filepath|split|sentences[].raw``. Extra keys
that some files carry (``cocoid``, ``imgid``, ``sentid``, ``annid``) are kept as ids so that external
ground truth (CxC, relevance matrices) can be joined on them.

Image paths resolve as ``root/filepath/filename``. The root is, in order: the ``images_root``
argument; an ``"images_root"`` key in the JSON (relative to the JSON's folder); ``JSON_DIR/images``
when that folder exists and the JSON has no ``filepath`` entries; else the JSON's folder. Per-image
``filepath`` lets one dataset span several folders under its root (COCO's ``train2014/`` and
``val2014/``); ``filepath`` and ``filename`` must stay inside the root (relative, no ``..``), because
the folders they name are the only ones an index built from the dataset may serve files from.
"""
from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from training.errors import UserError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
# Karpathy's COCO JSON has a "restval" split: the part of val2014 that is not val/test. It is train.
SPLIT_ALIASES = {"restval": "train", "dev": "val", "validation": "val"}
_TOKEN_RE = re.compile(r"[a-z0-9]+")
_DRIVE = re.compile(r"^[A-Za-z]:")


class DatasetError(UserError, ValueError):
    """A dataset file that cannot be used, with a message that says what to fix."""


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words: the tokenisation of Karpathy's ``tokens`` field."""
    return _TOKEN_RE.findall(text.lower())


@dataclass(frozen=True)
class ImageRecord:
    index: int  # position in Dataset.images
    id: int  # public id: the JSON's imgid (or position when absent)
    filename: str
    path: Path
    split: str
    caption_indices: tuple[int, ...]
    cocoid: int | None = None


@dataclass(frozen=True)
class CaptionRecord:
    index: int  # position in Dataset.captions
    id: int  # public id: the JSON's sentid (or position when absent)
    image_index: int
    raw: str
    tokens: tuple[str, ...]
    annid: int | None = None  # COCO annotation id, when known (CxC ground truth uses it)


@dataclass
class Split:
    """The images and captions of one split, with local (0-based, dense) indices."""

    name: str
    images: list[ImageRecord]
    captions: list[CaptionRecord]
    caption_to_image: np.ndarray  # (n_captions,) local image index of each caption

    def keep_images(self, keep: list[int] | np.ndarray) -> Split:
        """The split restricted to local images ``keep`` (in that order) and their captions."""
        keep = [int(i) for i in keep]
        remap = {old: new for new, old in enumerate(keep)}
        caps = [c for c, img in zip(self.captions, self.caption_to_image) if int(img) in remap]
        c2i = np.array([remap[int(i)] for i in self.caption_to_image if int(i) in remap], dtype=np.int64)
        return Split(self.name, [self.images[i] for i in keep], caps, c2i)

    @property
    def image_to_captions(self) -> list[np.ndarray]:
        order = np.argsort(self.caption_to_image, kind="stable")
        bounds = np.searchsorted(self.caption_to_image[order], np.arange(len(self.images) + 1))
        return [order[bounds[i] : bounds[i + 1]] for i in range(len(self.images))]

    def __len__(self) -> int:
        return len(self.images)


@dataclass
class Dataset:
    name: str
    json_path: Path | None
    root: Path
    images: list[ImageRecord]
    captions: list[CaptionRecord]
    missing: list[str] = field(default_factory=list)  # filenames dropped because missing on disk
    meta: dict = field(default_factory=dict)
    # per image (by ImageRecord.index), the JSON-safe metadata of a table or shard corpus; [] = none
    image_meta: list[dict] = field(default_factory=list)

    def split(self, name: str) -> Split:
        name = SPLIT_ALIASES.get(name, name)
        imgs = [im for im in self.images if im.split == name]
        if not imgs:
            counts = self.split_counts()
            raise DatasetError(
                f"split {name!r} of dataset {self.name!r} is empty; splits present: "
                + ", ".join(f"{k} ({v} images)" for k, v in counts.items())
            )
        local = {im.index: i for i, im in enumerate(imgs)}
        caps = [self.captions[c] for im in imgs for c in im.caption_indices]
        c2i = np.array([local[c.image_index] for c in caps], dtype=np.int64)
        return Split(name=name, images=imgs, captions=caps, caption_to_image=c2i)

    def split_counts(self) -> dict[str, int]:
        return dict(Counter(im.split for im in self.images))


def resolve_images_root(json_path: Path, data: dict, images_root: str | Path | None) -> Path:
    if images_root is not None:
        return Path(images_root)
    if data.get("images_root"):
        return (json_path.parent / data["images_root"]).resolve()
    has_filepath = any(im.get("filepath") for im in data["images"][:100])
    if not has_filepath and (json_path.parent / "images").is_dir():
        return json_path.parent / "images"
    return json_path.parent


def _inside_root(filepath: str, filename: str, where: str) -> None:
    """Refuse a record that names a file outside the dataset's root: an absolute path or a ``..`` part
    would let a hostile JSON have any readable file indexed and then served."""
    for key, value in (("filepath", filepath), ("filename", filename)):
        parts = PurePosixPath(value.replace("\\", "/")).parts
        if value.startswith(("/", "\\")) or ".." in parts or _DRIVE.match(value):
            raise DatasetError(f"{where}: {key} {value!r} must stay inside the images root (relative, without '..')")
    if not filename.strip("./\\"):
        raise DatasetError(f"{where}: filename {filename!r} is not a file name")


def image_folders(images: list[ImageRecord]) -> list[Path]:
    """The resolved folders (root/filepath) that hold these images: the only places an index built
    from them serves files from."""
    return sorted({p.resolve() for p in {im.path.parent for im in images}})


def _require(obj: dict, key: str, where: str) -> object:
    if not isinstance(obj, dict) or key not in obj:
        raise DatasetError(f"{where}: missing key {key!r} (Karpathy format needs images[].{key})")
    return obj[key]


def _parse_captions(sents: list, where: str, img_id: int, has_imgid: bool, image_index: int,
                    captions: list[CaptionRecord]) -> list[int]:
    """Validate one image's sentences and append them to ``captions``; their indices."""
    cap_idx = []
    for s_pos, s in enumerate(sents):
        raw = _require(s, "raw", f"{where}.sentences[{s_pos}]")
        if not isinstance(raw, str):
            raise DatasetError(f"{where}.sentences[{s_pos}]: 'raw' must be a string")
        if "imgid" in s and has_imgid and int(s["imgid"]) != img_id:
            raise DatasetError(
                f"{where}.sentences[{s_pos}]: caption belongs to imgid {s['imgid']}, "
                f"but is listed under image {img_id} (caption for an unknown/other image)"
            )
        c_index = len(captions)
        captions.append(CaptionRecord(index=c_index, id=int(s.get("sentid", c_index)), image_index=image_index,
                                      raw=raw.strip(), tokens=tuple(tokenize(raw)),
                                      annid=int(s["annid"]) if "annid" in s else None))
        cap_idx.append(c_index)
    return cap_idx


def parse_karpathy(
    data: dict,
    *,
    json_path: Path | None = None,
    root: Path,
    check_files: bool = True,
    drop_missing: bool = False,
) -> Dataset:
    """Build a Dataset from an already-loaded Karpathy dict (validates every record)."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DatasetError(f"{json_path}: expected a JSON object with an 'images' list (Karpathy format)")
    if not data["images"]:
        raise DatasetError(f"{json_path}: the 'images' list is empty")
    images: list[ImageRecord] = []
    captions: list[CaptionRecord] = []
    seen_ids: set[int] = set()
    missing: list[str] = []
    for pos, im in enumerate(data["images"]):
        where = f"{json_path}: images[{pos}]"
        filename = str(_require(im, "filename", where))
        split = SPLIT_ALIASES.get(str(_require(im, "split", where)), str(im["split"]))
        sents = _require(im, "sentences", where)
        if not isinstance(sents, list):
            raise DatasetError(f"{where}: 'sentences' must be a list")
        img_id = int(im.get("imgid", pos))
        if img_id in seen_ids:
            raise DatasetError(f"{where}: duplicate imgid {img_id}")
        seen_ids.add(img_id)
        filepath = str(im.get("filepath") or "")
        _inside_root(filepath, filename, where)
        path = root / filepath / filename
        if check_files and not path.is_file():
            missing.append(str(path))
            if drop_missing:
                continue
        index = len(images)
        cap_idx = _parse_captions(sents, where, img_id, "imgid" in im, index, captions)
        images.append(
            ImageRecord(
                index=index,
                id=img_id,
                filename=filename,
                path=path,
                split=split,
                caption_indices=tuple(cap_idx),
                cocoid=int(im["cocoid"]) if "cocoid" in im else None,
            )
        )
    if missing and not drop_missing:
        raise DatasetError(
            f"{len(missing)} of {len(data['images'])} images listed in {json_path} are missing under "
            f"{root}; first: {', '.join(missing[:3])}. Fix the images root (--set data.images_root=DIR, or "
            f"--images-root where a command has it) or drop them (--set data.drop_missing=true)."
        )
    if missing:
        log.warning("dropped %d images missing on disk (first: %s)", len(missing), missing[:3])
    if not images:
        raise DatasetError(f"{json_path}: no usable images (all {len(missing)} missing on disk)")
    cap_ids = [c.id for c in captions]
    if len(set(cap_ids)) != len(cap_ids):
        dup = next(k for k, v in Counter(cap_ids).items() if v > 1)
        raise DatasetError(f"{json_path}: duplicate sentid {dup}")
    return Dataset(
        name=str(data.get("dataset", json_path.stem if json_path else "dataset")),
        json_path=json_path,
        root=root,
        images=images,
        captions=captions,
        missing=missing,
        meta={k: v for k, v in data.items() if k != "images"},
    )


def load_karpathy(
    json_path: str | Path,
    *,
    images_root: str | Path | None = None,
    check_files: bool = True,
    drop_missing: bool = False,
) -> Dataset:
    """Read and validate a Karpathy split JSON. Raises DatasetError with a clear message."""
    json_path = Path(json_path)
    if json_path.is_dir():
        candidates = sorted(json_path.glob("dataset_*.json"))
        if len(candidates) != 1:
            raise DatasetError(
                f"{json_path} is a folder; expected exactly one dataset_*.json in it, found "
                f"{[c.name for c in candidates] or 'none'}"
            )
        json_path = candidates[0]
    if not json_path.is_file():
        raise DatasetError(f"dataset file not found: {json_path}")
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{json_path} is not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{json_path} is not UTF-8 text: {e}") from None
    if not isinstance(data, dict) or "images" not in data:
        raise DatasetError(f"{json_path}: expected a JSON object with an 'images' list (Karpathy format)")
    root = resolve_images_root(json_path, data, images_root)
    return parse_karpathy(
        data, json_path=json_path, root=root, check_files=check_files, drop_missing=drop_missing
    )


def dataset_info(ds: Dataset) -> dict:
    """Counts and caption-length statistics per split (what `ltd data info` prints)."""
    out: dict = {"dataset": ds.name, "json": str(ds.json_path), "images_root": str(ds.root), "splits": {}}
    for name in sorted(ds.split_counts(), key=lambda s: (SPLITS.index(s) if s in SPLITS else 9, s)):
        sp = ds.split(name)
        lens = np.array([len(c.tokens) for c in sp.captions]) if sp.captions else np.zeros(1)
        per_img = np.bincount(sp.caption_to_image, minlength=len(sp.images))
        out["splits"][name] = {
            "images": len(sp.images),
            "captions": len(sp.captions),
            "captions_per_image": [int(per_img.min()), int(per_img.max())],
            "caption_tokens": {
                "mean": round(float(lens.mean()), 2),
                "median": float(np.median(lens)),
                "p95": float(np.percentile(lens, 95)),
                "max": int(lens.max()),
            },
        }
    out["images"] = len(ds.images)
    out["captions"] = len(ds.captions)
    out["image_folders"] = [str(p) for p in image_folders(ds.images)]
    # Where the splits came from (``ltd data convert-coco`` records it; other files: as given in the file)
    out["split_provenance"] = ds.meta.get("split_provenance") or {"method": "as given in the file"}
    out["missing_files"] = len(ds.missing)
    out["missing_examples"] = ds.missing[:5]
    return out


def labelled_mask(n: int, fraction: float, seed: int) -> np.ndarray:
    """A seeded random subset of a split's ``n`` images (True = kept). The captioner's SR-PL runs keep
    the captions of these training images (``data.labelled_fraction``), and a retrieval run with
    ``data.train_fraction`` keeps the same images for the same seed: a judge of the labelled half."""
    mask = np.zeros(n, dtype=bool)
    k = n if fraction >= 1 else max(1, int(round(fraction * n)))
    mask[np.random.default_rng([seed, 1807]).permutation(n)[:k]] = True
    return mask
