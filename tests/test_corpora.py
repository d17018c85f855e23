"""CSV, TSV, parquet and webdataset corpora (tests/corpora.py writes one corpus in each): the same
dataset from every format, hostile paths refused, metadata into the index, index → eval → train from
each, and a shard corpus indexed under a memory bound it does not fit in."""
from __future__ import annotations

import json
import shutil
import tarfile

import numpy as np
import pytest
from corpora import corpus_items, write_images, write_parquet, write_saved_dataset, write_shards, write_table
from tiny_clip import make_tiny_clip

from training.data.formats import read_dataset
from training.data.karpathy import DatasetError
from training.data.members import ImageMember


@pytest.fixture(scope="module")
def items():
    return corpus_items()


@pytest.fixture(scope="module")
def corpus(items, tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_images(items, root / "images")
    write_shards(items, root / "shards")
    out = {"csv": write_table(items, root / "captions.csv"), "tsv": write_table(items, root / "captions.tsv", sep="\t"),
            "parquet": write_parquet(items, root / "captions.parquet"), "shards": root / "shards",
            "braces": root / "shards" / "shard-{000000..000002}.tar", "root": root,
            "datasets": write_saved_dataset(items, root / "hf"), "datasets-dict": write_saved_dataset(items, root / "hfd",
                                                                                                    splits=True)}
    write_images(items, root / "hf" / "images")
    write_images(items, root / "hfd" / "images")
    return out


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return make_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet", "shards", "braces", "datasets", "datasets-dict"])
def test_every_format_reads_the_same_dataset(corpus, items, fmt):
    ds = read_dataset(corpus[fmt])
    if fmt == "datasets-dict":  # a DatasetDict is read split folder by split folder (test, train, validation)
        order = {"test": 0, "train": 1, "val": 2}
        items = sorted(items, key=lambda it: order[it["split"]])
    assert [len(im.caption_indices) for im in ds.images] == [2] * len(items)
    assert [ds.captions[im.caption_indices[0]].raw for im in ds.images] == [it["captions"][0] for it in items]
    assert [im.split for im in ds.images] == [it["split"] for it in items]
    assert ds.split_counts() == {"train": 6, "val": 3, "test": 3}
    assert len(ds.image_meta) == len(items)
    if fmt in ("shards", "braces"):
        assert all(isinstance(im.path, ImageMember) for im in ds.images)
        assert ds.images[4].path.read_bytes() == items[4]["png"]
        assert ds.image_meta[3] == {"key": "img003", "photographer": "p0", "year": 2003, "score": None}
    else:
        assert ds.images[4].path.read_bytes() == items[4]["png"]
        typed = fmt in ("parquet", "datasets", "datasets-dict")
        m = items[3]["meta"]
        score = None if m["score"] is None or m["score"] != m["score"] else m["score"]  # NaN → null when typed
        want = {"photographer": m["photographer"], "year": m["year"], "score": score}
        assert ds.image_meta[3] == (want if typed else {"photographer": m["photographer"], "year": str(m["year"]),
                                                        "score": str(m["score"])})
    json.dumps(ds.image_meta, allow_nan=False)  # JSON-safe


def test_a_saved_dataset_with_images_inside_is_refused_plainly(items, tmp_path):
    folder = write_saved_dataset(items, tmp_path / "embedded", embed=True)
    with pytest.raises(DatasetError, match="stored inside the dataset"):
        read_dataset(folder)


def test_columns_are_named_or_found(corpus, tmp_path):
    ds = read_dataset(corpus["csv"], columns="image=filepath,caption=title,split=,metadata=year")
    assert set(ds.split_counts()) == {"test"} and ds.image_meta[0] == {"year": "2000"}  # no split column: test
    with pytest.raises(DatasetError, match="no column 'nope'"):
        read_dataset(corpus["csv"], columns="caption=nope")
    with pytest.raises(DatasetError, match="ROLE=COLUMN"):
        read_dataset(corpus["csv"], columns="picture=filepath")
    bad = tmp_path / "x.csv"
    bad.write_text("photo,words\na.png,hello\n")
    with pytest.raises(DatasetError, match="no image column"):
        read_dataset(bad)


@pytest.mark.parametrize("path", ["../outside.png", "images/../../outside.png", "/etc/passwd", "C:/x.png"])
def test_hostile_table_paths_are_refused(corpus, tmp_path, path):
    t = tmp_path / "t.csv"
    t.write_text(f"image,caption\n{path},a caption\n")
    (tmp_path / "outside.png").write_bytes(b"x")
    with pytest.raises(DatasetError, match="images root"):
        read_dataset(t)


def test_absolute_paths_inside_the_root_and_an_images_root(corpus, items, tmp_path):
    t = tmp_path / "abs.csv"
    rows = [f"{corpus['root'] / 'images' / it['name']},{it['captions'][0]}" for it in items[:3]]
    t.write_text("image,caption\n" + "\n".join(rows) + "\n")
    with pytest.raises(DatasetError, match="outside the images root"):
        read_dataset(t)  # the table's own folder is not where the images are
    assert len(read_dataset(t, images_root=corpus["root"]).images) == 3
    rel = tmp_path / "rel.csv"
    rel.write_text("image,caption\n" + "\n".join(f"{it['name']},x" for it in items[:2]) + "\n")
    assert read_dataset(rel, images_root=corpus["root"] / "images").images[1].path.read_bytes() == items[1]["png"]


def test_one_image_in_two_splits_is_refused(tmp_path, items):
    write_images(items[:1], tmp_path / "images")
    t = tmp_path / "t.csv"
    t.write_text(f"image,caption,split\nimages/{items[0]['name']},a,train\nimages/{items[0]['name']},b,test\n")
    with pytest.raises(DatasetError, match="belongs to one split"):
        read_dataset(t)


def test_shard_member_names_are_never_paths(tmp_path, items):
    """A member named ../../x.png is an image inside the shard, nothing more; links and compressed
    shards are not read."""
    import io

    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in (("../../etc/evil.png", items[0]["png"]), ("../../etc/evil.txt", b"a caption")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("linked.png")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    ds = read_dataset(path)
    assert len(ds.images) == 1 and ds.images[0].path.read_bytes() == items[0]["png"]
    assert ds.captions[0].raw == "a caption" and not (tmp_path.parent / "etc").exists()
    gz = tmp_path / "x.tar.gz"
    gz.write_bytes(b"")
    with pytest.raises(DatasetError, match="compressed shards"):
        read_dataset(gz)


def test_a_truncated_shard_image_is_skipped_with_its_reason(tmp_path, items):
    from training.data.images import ImageError, load_image

    write_shards(items[:2], tmp_path / "s", per_shard=2)
    ds = read_dataset(tmp_path / "s")
    m = ds.images[1].path
    bad = ImageMember(m.container, m.offset, m.size + 10_000_000, m.name)
    with pytest.raises(ImageError, match="shard ends"):
        load_image(bad)
    assert load_image(m).size == (40, 31)


@pytest.fixture(scope="module")
def indexes(corpus, clip_dir, tmp_path_factory):
    from app.cli import main

    out = {}
    for fmt in ("csv", "parquet", "shards"):
        out[fmt] = tmp_path_factory.mktemp("ix") / fmt
        assert main(["index", "--checkpoint", str(clip_dir), "--dataset", str(corpus[fmt]), "--split", "train",
                     "--out", str(out[fmt]), "--no-progress"]) == 0
    return out


def test_indexes_from_every_format_agree_and_carry_the_metadata(indexes, items):
    from indexer.index import load_index_dir

    ixs = {k: load_index_dir(v) for k, v in indexes.items()}
    train = [it for it in items if it["split"] == "train"]
    for fmt, ix in ixs.items():
        assert ix.images.meta["metadata"][0]["photographer"] == train[0]["meta"]["photographer"], fmt
        assert len(ix.images.meta["metadata"]) == len(train) == len(ix.images.ids)
        assert ix.captions.meta["texts"] == [c for it in train for c in it["captions"]]
    # the same pixels from a file and from a shard member: the same embeddings
    np.testing.assert_allclose(np.asarray(ixs["shards"].images.vectors), np.asarray(ixs["csv"].images.vectors), atol=1e-6)
    np.testing.assert_allclose(np.asarray(ixs["parquet"].images.vectors), np.asarray(ixs["csv"].images.vectors), atol=1e-6)
    members = ixs["shards"].images.meta["members"]
    assert members[0][0] == "img000.png" and ixs["shards"].images.meta["paths"][0].endswith("shard-000000.tar")


def test_a_corpus_index_evaluates_and_serves(indexes, items):
    from fastapi.testclient import TestClient

    from app.api.main import create_app
    from app.api.settings import Settings
    from app.cli import main

    assert main(["eval", "--index", str(indexes["shards"]), "--relevance", "none", "--no-progress"]) == 0
    rep = json.loads((indexes["shards"] / "report.json").read_text())
    assert rep["n_images"] == 6 and rep["n_captions"] == 12
    settings = Settings(models={"wds": str(indexes["shards"])}, ui=False, load_in_background=False,
                        torch_threads=0, faiss_threads=0)
    with TestClient(create_app(settings)) as client:
        r = client.post("/api/search/text", json={"query": "a red circle", "model": "wds", "k": 3})
        assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text
        top = r.json()["results"][0]["id"]
        ix = client.app.state.service.registry.get("wds").index
        name = ix.images.meta["members"][ix.images.ids.index(top)][0]
        r = client.get(f"/api/images/{top}")  # an image inside a shard: its bytes, read from the shard
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        assert r.content == next(it["png"] for it in items if it["name"] == name)
        again = client.get(f"/api/images/{top}", headers={"If-None-Match": r.headers["etag"]})
        assert again.status_code == 304
        thumb = client.get(f"/api/images/{top}/thumbnail?size=64")
        assert thumb.status_code == 200 and thumb.content[:3] == b"\xff\xd8\xff"


def test_shard_members_are_served_only_as_the_index_recorded_them(indexes):
    """A member whose range leaves its shard, whose name is no image, whose bytes are no image, or that is
    larger than an image may be is not served; a malformed member record is refused."""
    import dataclasses

    from indexer.index import load_index_dir
    from search.errors import NotFound
    from search.files import servable_image
    from training.data.members import MAX_MEMBER_BYTES, ImageMember

    ix = load_index_dir(indexes["shards"])
    good = ImageMember.recorded(ix.image_file(0), ix.images.meta["members"], 0)
    assert servable_image(good, "image 0") == good
    shard_size = good.container.stat().st_size
    for bad in (dataclasses.replace(good, offset=shard_size - 4),  # runs past the end of the shard
                dataclasses.replace(good, name="img000.txt"),  # not an image name
                dataclasses.replace(good, offset=good.offset + 512),  # starts inside the image: no image type
                dataclasses.replace(good, size=MAX_MEMBER_BYTES + 1)):
        with pytest.raises(NotFound):
            servable_image(bad, "image 0")
    for record in (["img000.png", -1, 10], ["img000.png", 0, 0], [3, 0, 10], ["img000.png", True, 10], "x"):
        with pytest.raises(ValueError):
            ImageMember.recorded(good.container, [record], 0)
    assert ImageMember.recorded(good.container, None, 0) is None  # a row that is a file


@pytest.mark.slow
@pytest.mark.training
def test_fine_tuning_reads_shards_and_tables(corpus, clip_dir, tmp_path):
    from app.cli import main

    for fmt in ("shards", "csv"):
        sets = ["data.path=" + str(corpus[fmt]), f"model.clip_path={clip_dir}", "train.batch_size=6", "train.epochs=1",
                "optim.warmup_steps=1", "train.log_every=1", "train.checkpoint_every=0"]
        assert main(["train", "--config", "f30k_clip_ltd", "--out", str(tmp_path / fmt), "--no-progress",
                     *[a for s in sets for a in ("--set", s)]]) == 0
        steps = [json.loads(ln) for ln in (tmp_path / fmt / "metrics.jsonl").read_text().splitlines()]
        assert sum(r["type"] == "step" for r in steps) == 2  # 12 training captions in batches of 6


@pytest.mark.slow
def test_a_shard_corpus_larger_than_the_memory_bound_indexes(clip_dir, tmp_path):
    """~30 MB of incompressible images in shards, indexed while Python's traced allocations (bytes read,
    numpy arrays) stay under 6 MB: images are read one batch at a time, never the corpus."""
    import io
    import tracemalloc

    from PIL import Image

    from indexer.build import IndexRequest, build_dataset_index
    from training.checkpoint import save_checkpoint, zero_shot_checkpoint

    rng = np.random.default_rng(0)
    big = []
    for i in range(160):
        buf = io.BytesIO()
        Image.fromarray((rng.random((256, 256, 3)) * 255).astype(np.uint8)).save(buf, "PNG", compress_level=1)
        big.append({"name": f"n{i:04d}.png", "png": buf.getvalue(), "captions": [f"noise {i}"], "split": "test",
                    "meta": {"i": i}})
    total = sum(len(b["png"]) for b in big)
    write_shards(big, tmp_path / "big", per_shard=40)
    del big
    ckpt = save_checkpoint(tmp_path / "zs.pt", zero_shot_checkpoint(clip_dir))
    tracemalloc.start()
    try:
        ix = build_dataset_index(ckpt, tmp_path / "big", "test", IndexRequest(tmp_path / "ix"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 25e6 and ix.manifest["counts"]["images"] == 160
    assert peak < 6e6, f"peak {peak / 1e6:.1f} MB of Python allocations for a {total / 1e6:.0f} MB corpus"
    shutil.rmtree(tmp_path / "big")
