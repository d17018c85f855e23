"""One small captioned corpus written in every format the readers take: CSV, TSV, parquet, webdataset
shards (the same images, captions, splits and metadata in each), for tests/test_corpora.py."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

WORDS = ["a", "red", "blue", "green", "circle", "square", "dog", "cat", "on", "the", "left", "right", "big", "small"]


def corpus_items(n: int = 12, seed: int = 0, caps: int = 2) -> list[dict]:
    """n images (name, PNG bytes, captions, split, metadata); splits cycle train, train, val, test."""
    rng = np.random.default_rng(seed)
    splits = ["train", "train", "val", "test"]
    items = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray((rng.random((30 + i % 3, 40, 3)) * 255).astype(np.uint8)).save(buf, "PNG")
        captions = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 7)))) for _ in range(caps)]
        meta = {"photographer": f"p{i % 3}", "year": 2000 + i, "score": float("nan") if i == 3 else i / 10}
        items.append({"name": f"img{i:03d}.png", "png": buf.getvalue(), "captions": captions,
                      "split": splits[i % 4], "meta": meta})
    return items


def write_images(items: list[dict], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for it in items:
        (folder / it["name"]).write_bytes(it["png"])
    return folder


def write_table(items: list[dict], path: Path, sep: str = ",", images_prefix: str = "images/") -> Path:
    """One row per caption: filepath, title, split, photographer, year, score."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=sep)
        w.writerow(["filepath", "title", "split", "photographer", "year", "score"])
        for it in items:
            for c in it["captions"]:
                m = it["meta"]
                w.writerow([images_prefix + it["name"], c, it["split"], m["photographer"], m["year"], m["score"]])
    return path


def write_parquet(items: list[dict], path: Path, images_prefix: str = "images/") -> Path:
    """One row per image, the captions as a list cell; typed metadata columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image_path": [images_prefix + it["name"] for it in items],
                      "caption": [it["captions"] for it in items], "split": [it["split"] for it in items],
                      "photographer": [it["meta"]["photographer"] for it in items],
                      "year": [it["meta"]["year"] for it in items], "score": [it["meta"]["score"] for it in items]})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=5)
    return path


def write_saved_dataset(items: list[dict], folder: Path, *, splits: bool = False, embed: bool = False,
                        images_prefix: str = "images/") -> Path:
    """The layout ``datasets``' ``save_to_disk`` writes, without the ``datasets`` package: Arrow stream
    files ``data-0000K-of-0000N.arrow`` (two here), ``dataset_info.json`` and ``state.json``; with
    ``splits``, a DatasetDict (``dataset_dict.json`` and a folder per split, "val" saved as "validation",
    no split column). The image column is the Image feature, ``{bytes, path}``: paths only, or the
    image bytes with ``embed``."""
    import pyarrow as pa

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])

    def write_part(part: list[dict], where: Path, with_split: bool) -> None:
        where.mkdir(parents=True, exist_ok=True)
        cols = {"image": pa.array([{"bytes": it["png"] if embed else None, "path": images_prefix + it["name"]}
                                   for it in part], image_type),
                "caption": [it["captions"] for it in part],
                **({"split": [it["split"] for it in part]} if with_split else {}),
                "photographer": [it["meta"]["photographer"] for it in part],
                "year": [it["meta"]["year"] for it in part], "score": [it["meta"]["score"] for it in part]}
        table = pa.table(cols)
        halves = [table.slice(0, len(part) // 2), table.slice(len(part) // 2)]
        names = [f"data-{k:05d}-of-{len(halves):05d}.arrow" for k in range(len(halves))]
        for name, half in zip(names, halves):
            with pa.OSFile(str(where / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                for batch in half.to_batches(max_chunksize=3):
                    w.write_batch(batch)
        (where / "dataset_info.json").write_text(json.dumps({"features": {"image": {"_type": "Image"}}}))
        (where / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                      "_fingerprint": "0", "_split": None}))

    if not splits:
        write_part(items, folder, True)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    names = {"train": "train", "val": "validation", "test": "test"}
    for split, name in names.items():
        write_part([it for it in items if it["split"] == split], folder / name, False)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": list(names.values())}))
    return folder


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def write_shards(items: list[dict], folder: Path, per_shard: int = 5) -> list[Path]:
    """webdataset shards shard-000000.tar …: KEY.png, KEY.txt (captions, one per line), KEY.json."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for s in range(0, len(items), per_shard):
        path = folder / f"shard-{s // per_shard:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for it in items[s:s + per_shard]:
                key = Path(it["name"]).stem
                _add(tf, f"{key}.png", it["png"])
                _add(tf, f"{key}.txt", "\n".join(it["captions"]).encode())
                _add(tf, f"{key}.json", json.dumps({"split": it["split"], **it["meta"]}).encode())
        out.append(path)
    return out
