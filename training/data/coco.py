"""The official COCO caption files → one Karpathy-format JSON, optionally on the standard 5k test split.

COCO ships its images in several folders (``train2014/`` + ``val2014/``, or ``train2017/`` +
``val2017/``) with one captions file each; the retrieval literature evaluates on Karpathy's 5k test
images, which are spread over both 2017 folders. So a conversion takes several (captions file, image
folder) pairs and writes one dataset whose ``images_root`` is the folders' common parent and whose
images each carry their folder as ``filepath``; the 2014 (``COCO_val2014_000000391895.jpg``) and
2017 (``000000391895.jpg``) namings take the same path.

``karpathy_test``: the test split is the 5,000 images of the 25,000 caption annotation ids that the
``eccv-caption`` package ships (``coco_test_ids.npy``, the SCAN/VSE++ order, five per image), with
those 25,000 captions; a val split of ``val_size`` images is drawn with a fixed seed from the rest —
not Karpathy's own val, whose ids no installed package ships — and the remainder is train. The JSON
records where each split came from (``split_provenance``; ``ltd data info`` prints it), and keeps
COCO's image and annotation ids (``cocoid``, ``annid``) so that CxC and ECCV Caption positives join
onto the test split.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.convert import check_split, merge_images, read_json
from training.data.karpathy import DatasetError, tokenize
from training.fsio import sha256_file, write_json_atomic

log = logging.getLogger(__name__)

COCO_YEARS = ("2014", "2017")
_FOLDER_YEAR = re.compile(r"^(?:train|val|test)(20\d\d)$")
_FILE_2014 = re.compile(r"^COCO_(?:train|val|test)(20\d\d)_\d+\.\w+$")


@dataclass(frozen=True)
class CocoPair:
    """One official captions file and the folder holding its images; ``split`` None = decided later
    (``karpathy_test``)."""

    captions: Path
    images_root: Path
    split: str | None = None


@dataclass(frozen=True)
class KarpathyTest:
    """The standard splits for :func:`convert_coco`: ``ids``, a ``.npy`` of the test split's caption
    annotation ids (e.g. :func:`default_test_ids`), and the val split of ``val_size`` images drawn with
    ``val_seed`` from the rest (the module docstring says how)."""

    ids: str | Path
    val_size: int = 5000
    val_seed: int = 0


def eccv_data_dir() -> Path:
    """The id maps shipped by ``eccv-caption`` (found without importing it: its import warns about ujson)."""
    spec = importlib.util.find_spec("eccv_caption")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("the COCO 5k test ids, CxC and ECCV Caption need the eccv-caption package "
                           "(pip install eccv-caption)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def default_test_ids() -> Path:
    """``coco_test_ids.npy``: the 25,000 caption annotation ids of the 5k test images, five per image."""
    return eccv_data_dir() / "coco_test_ids.npy"


# ---- finding the files -------------------------------------------------------------------------------------
def _annotation_dirs(root: Path) -> list[Path]:
    return [d for d in [root / "annotations", *sorted(root.glob("annotations_trainval20*/annotations"))] if d.is_dir()]


def discover_coco_root(root: str | Path, year: str | None = None) -> list[CocoPair]:
    """The (captions file, image folder) pairs of an official COCO download unpacked under ``root``:
    ``annotations/captions_{train,val}YEAR.json`` with ``trainYEAR/`` and ``valYEAR/``."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"COCO root not found: {root}")
    ann_dirs = _annotation_dirs(root)
    if not ann_dirs:
        raise DatasetError(f"{root} has no annotations/ folder (unpack annotations_trainval2014.zip or "
                           "annotations_trainval2017.zip there)")
    found: dict[str, dict[str, Path]] = defaultdict(dict)
    for d in ann_dirs:
        for f in sorted(d.glob("captions_*20*.json")):
            m = re.fullmatch(r"captions_(train|val)(20\d\d)\.json", f.name)
            if m:
                found[m[2]].setdefault(m[1], f)
    if year is not None:
        if str(year) not in found:
            raise DatasetError(f"no captions_*{year}.json under {', '.join(map(str, ann_dirs))}")
        found = {str(year): found[str(year)]}
    if not found:
        raise DatasetError(f"no captions_train20xx.json / captions_val20xx.json under {', '.join(map(str, ann_dirs))}")
    if len(found) > 1:
        raise DatasetError(f"{root} holds the captions of {' and '.join(sorted(found))}, which are the same images "
                           "split differently; choose one with --year")
    (yr, files), = found.items()
    pairs = []
    for part in ("train", "val"):
        if part not in files:
            raise DatasetError(f"{root}: captions_{part}{yr}.json is missing (found {', '.join(f.name for f in files.values())})")
        folder = root / f"{part}{yr}"
        if not folder.is_dir():
            raise DatasetError(f"image folder not found: {folder} (the images of {files[part]}; unzip {part}{yr}.zip there)")
        pairs.append(CocoPair(files[part], folder))
    return pairs


# ---- reading one pair --------------------------------------------------------------------------------------
def _data_year(data: dict) -> str | None:
    """The COCO release a captions file belongs to: its 2014-style file names say it; else info.year."""
    for im in data["images"][:20]:
        m = _FILE_2014.match(Path(str(im.get("file_name", ""))).name)
        if m:
            return m[1]
    year = (data.get("info") or {}).get("year") if isinstance(data.get("info"), dict) else None
    return str(year) if str(year) in COCO_YEARS else None


def _check_year(pair: CocoPair, data: dict) -> None:
    """A captions file for another year than its folder (val2017 captions beside val2014/) is refused
    before the file-by-file check would report 5,000 missing images."""
    m = _FOLDER_YEAR.match(pair.images_root.name)
    year = _data_year(data)
    if m and year and m[1] != year:
        raise DatasetError(f"{pair.captions} holds COCO {year} captions, but its image folder {pair.images_root} "
                           f"is a {m[1]} folder; pair captions_*{m[1]}.json with {pair.images_root.name}/")


def _check_files(pair: CocoPair, images: list[dict]) -> None:
    missing = [im["_path"] for im in images if not os.path.isfile(im["_path"])]
    if missing:
        raise DatasetError(f"{len(missing):,} of {len(images):,} images of {pair.captions} are missing under "
                           f"{pair.images_root} (first: {Path(missing[0]).name}); is the folder fully unpacked?")


def read_pair(pair: CocoPair, *, check_files: bool = True) -> list[dict]:
    """One captions file → Karpathy image records (captions sorted by annotation id), each with its
    absolute ``_path``. COCO ids are kept: ``cocoid`` per image, ``annid`` per caption."""
    cf = pair.captions
    if not pair.images_root.is_dir():
        raise DatasetError(f"image folder not found: {pair.images_root} (the images of {cf})")
    data = read_json(cf)
    for key in ("images", "annotations"):
        if not isinstance(data.get(key), list):
            raise DatasetError(f"{cf}: missing {key!r} list (is this a COCO captions_*.json file?)")
    _check_year(pair, data)
    by_image: dict[int, list[dict]] = defaultdict(list)
    ids = set()
    for i, im in enumerate(data["images"]):
        if not isinstance(im, dict) or "id" not in im or "file_name" not in im:
            raise DatasetError(f"{cf}: images[{i}] needs 'id' and 'file_name'")
        ids.add(im["id"])
    orphans = 0
    for j, a in enumerate(data["annotations"]):
        if not isinstance(a, dict) or "image_id" not in a or not isinstance(a.get("caption"), str):
            raise DatasetError(f"{cf}: annotations[{j}] needs 'image_id' and a 'caption' string")
        if a["image_id"] not in ids:
            orphans += 1
            continue
        by_image[a["image_id"]].append(a)
    if orphans:
        raise DatasetError(f"{cf}: {orphans} captions refer to image ids that are not in its 'images' list "
                           "(captions for unknown images)")
    out = []
    for im in data["images"]:
        anns = sorted(by_image.get(im["id"], []), key=lambda a: a.get("id", 0))
        if not anns:
            continue
        name = Path(str(im["file_name"]))
        out.append({
            "_path": str(pair.images_root / name), "filename": name.name, "cocoid": int(im["id"]),
            "split": pair.split,
            "sentences": [{"raw": a["caption"].strip(), "tokens": tokenize(a["caption"]),
                           **({"annid": int(a["id"])} if "id" in a else {})} for a in anns],
        })
    if check_files:
        _check_files(pair, out)
    log.info("%s: %d captioned images, %d captions", cf.name, len(out), sum(len(i["sentences"]) for i in out))
    return out


# ---- the standard test split -------------------------------------------------------------------------------
def _load_ids(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(f"test id list not found: {path}")
    try:
        ids = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DatasetError(f"{path} is not a numpy .npy array of integers: {e}") from None
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or not len(ids):
        raise DatasetError(f"{path}: expected a 1-d integer array of caption annotation ids, got {ids.dtype} {ids.shape}")
    return ids.astype(np.int64)


def karpathy_split(images: list[dict], test_ids: Path, *, val_size: int = 5000, val_seed: int = 0,
                   sources: list[str] = ()) -> tuple[list[dict], dict]:
    """Assign test / val / train (see the module docstring). Returns (images in the order test in the
    id list's order, then val, then train; provenance)."""
    ids = _load_ids(test_ids)
    owner: dict[int, tuple[int, dict]] = {}
    for k, im in enumerate(images):
        for s in im["sentences"]:
            if "annid" in s:
                owner[s["annid"]] = (k, s)
    absent = [int(a) for a in ids if int(a) not in owner]
    if absent:
        raise DatasetError(
            f"{len(absent):,} of the {len(ids):,} test caption ids in {test_ids} are not in {', '.join(sources) or 'the files'} "
            f"(first: {absent[0]}); the 5k test images are in val2014 (2014) or spread over train2017 and val2017 "
            "(2017): convert both captions files of one year together (and only COCO's official files)")
    test_order: list[int] = []
    test_caps: dict[int, list[dict]] = defaultdict(list)
    for a in ids:
        k, s = owner[int(a)]
        if k not in test_caps:
            test_order.append(k)
        test_caps[k].append(s)
    dropped = sum(len(images[k]["sentences"]) for k in test_order) - len(ids)
    for k in test_order:
        images[k]["sentences"], images[k]["split"] = test_caps[k], "test"
    rest = sorted((k for k in range(len(images)) if k not in test_caps), key=lambda k: images[k]["cocoid"])
    if len(rest) <= val_size:
        raise DatasetError(f"only {len(rest):,} images are outside the test split, not enough for a val split of "
                           f"{val_size:,} and a train split (lower --val-size)")
    perm = np.random.default_rng(val_seed).permutation(len(rest))
    val = sorted(rest[i] for i in perm[:val_size])
    val_set = set(val)
    train = [k for k in rest if k not in val_set]
    for k in val:
        images[k]["split"] = "val"
    for k in train:
        images[k]["split"] = "train"
    n_test_caps = len(ids)
    what = ("Karpathy's 5k test split (eccv-caption's list): " if _is_package_list(test_ids) else "")
    provenance = {
        "method": "karpathy_test",
        "test": f"{what}the {len(test_order):,} images of the {n_test_caps:,} caption ids in {test_ids.name} "
                f"(sha256 {sha256_file(test_ids)[:12]}), with exactly those captions"
                + (f" ({dropped} further captions of these images left out)" if dropped else ""),
        "val": f"{len(val):,} images drawn at random (seed {val_seed}) from the images outside test: NOT Karpathy's "
               "own val split, whose ids are not shipped by any installed package",
        "train": f"the other {len(train):,} images (all their captions)",
        "test_ids": str(test_ids), "val_size": val_size, "val_seed": val_seed,
    }
    order = test_order + val + train
    return [images[k] for k in order], provenance


def _is_package_list(path: Path) -> bool:
    try:
        return path.resolve() == default_test_ids().resolve()
    except DatasetError:
        return False


# ---- the conversion ----------------------------------------------------------------------------------------
def convert_coco(pairs: list[CocoPair], out: str | Path, *, append: bool = False,
                 karpathy_test: KarpathyTest | None = None, dataset: str = "coco", check_files: bool = True) -> dict:
    """Official COCO caption files (one ``CocoPair`` each) → one Karpathy JSON at ``out``. With
    ``karpathy_test`` (the test split's caption ids and the val split's size and seed) the splits are
    assigned as the module docstring says; else every pair names its split. Returns counts."""
    out = Path(out)
    if not pairs:
        raise DatasetError("no captions files given")
    if karpathy_test is not None:
        if append:
            raise DatasetError("--karpathy-test assigns the splits across all files at once; drop --append and "
                               "convert every captions file in one command")
        if any(p.split for p in pairs):
            raise DatasetError("--karpathy-test assigns the splits itself; drop --split")
    elif any(p.split is None for p in pairs):
        raise DatasetError("give --split for every captions file, or --karpathy-test for the standard 5k test split")
    pairs = [CocoPair(Path(p.captions), Path(p.images_root), None if p.split is None else check_split(p.split))
             for p in pairs]
    images: list[dict] = []
    seen: dict[int, Path] = {}
    for pair in pairs:
        for im in read_pair(pair, check_files=check_files):
            if im["cocoid"] in seen:
                raise DatasetError(
                    f"COCO image id {im['cocoid']} is in both {seen[im['cocoid']]} and {pair.captions}; the 2014 and "
                    "2017 files hold the same images split differently: convert one year")
            seen[im["cocoid"]] = pair.captions
            images.append(im)
    if not images:
        raise DatasetError("no captioned images found in the given files")
    sources = [str(p.captions) for p in pairs]
    if karpathy_test is not None:
        kt = karpathy_test
        images, provenance = karpathy_split(images, Path(kt.ids), val_size=kt.val_size, val_seed=kt.val_seed,
                                            sources=sources)
    else:
        provenance = {"method": "per_file", "files": {str(p.captions): p.split for p in pairs}}
    merged = merge_images(out, images, dataset, append, provenance=provenance, key="cocoid")
    write_json_atomic(out, merged)
    counts: dict[str, int] = defaultdict(int)
    for im in images:
        counts[im["split"]] += 1
    return {"images": len(images), "captions": sum(len(i["sentences"]) for i in images), "splits": dict(counts),
            "images_root": merged["images_root"], "out": str(out)}
