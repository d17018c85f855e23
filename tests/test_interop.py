"""clip-retrieval's layout (indexer/interop.py): export an index, import it back, the same search results;
a folder laid out as clip-retrieval writes it imports with its pairs as ground truth; hostile paths refused."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpora import corpus_items, write_images, write_table
from tiny_clip import make_tiny_clip

from indexer.index import IndexDirError


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from app.cli import main

    root = tmp_path_factory.mktemp("interop")
    items = corpus_items()
    write_images(items, root / "images")
    clip = make_tiny_clip(root / "clip")
    assert main(["index", "--checkpoint", str(clip), "--dataset", str(write_table(items, root / "c.csv")), "--split",
                 "train", "--out", str(root / "ix"), "--no-progress"]) == 0
    return {"root": root, "clip": clip, "ix": root / "ix"}


def test_export_writes_clip_retrievals_layout(built):
    from app.cli import main

    out = built["root"] / "emb"
    assert main(["export", "--index", str(built["ix"]), "--out", str(out)]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "img_emb/img_emb_0.npy", "metadata/metadata_0.parquet", "text_emb/text_emb_0.npy"]
    meta = pq.read_table(out / "metadata" / "metadata_0.parquet")
    assert meta.column_names[:4] == ["image_path", "caption", "image_id", "caption_id"]
    assert {"photographer", "year", "score"} <= set(meta.column_names) and meta.num_rows == 12
    img, txt = np.load(out / "img_emb" / "img_emb_0.npy"), np.load(out / "text_emb" / "text_emb_0.npy")
    assert img.shape == txt.shape == (12, 16) and np.allclose(np.linalg.norm(img, axis=1), 1, atol=1e-5)
    np.testing.assert_array_equal(img[0], img[1])  # one image, two captions: two rows
    assert main(["export", "--index", str(built["ix"]), "--out", str(out)]) == 2  # never over an existing folder


def test_round_trip_gives_the_same_index_and_search_results(built):
    from app.cli import main
    from indexer.index import load_index_dir

    out, back = built["root"] / "emb_rt", built["root"] / "back"
    assert main(["export", "--index", str(built["ix"]), "--out", str(out), "--rows-per-part", "5"]) == 0
    assert sorted(p.name for p in (out / "metadata").iterdir()) == ["metadata_0.parquet", "metadata_1.parquet",
                                                                    "metadata_2.parquet"]
    assert main(["import", "--clip-retrieval", str(out), "--checkpoint", str(built["clip"]), "--out", str(back),
                 "--images-root", str(built["root"])]) == 0
    a, b = load_index_dir(built["ix"]), load_index_dir(back)
    assert b.has_ground_truth and b.manifest["checkpoint_sha256"] == a.manifest["checkpoint_sha256"]
    for key in ("ids", "paths", "captions", "metadata"):
        assert a.images.meta[key] == b.images.meta[key], key
    for key in ("ids", "texts", "image"):
        assert a.captions.meta[key] == b.captions.meta[key], key
    np.testing.assert_array_equal(np.asarray(a.images.vectors), np.asarray(b.images.vectors))
    np.testing.assert_array_equal(np.asarray(a.captions.vectors), np.asarray(b.captions.vectors))
    for q, side in ((np.asarray(a.captions.vectors), "images"), (np.asarray(a.images.vectors), "captions")):
        sa, ia = getattr(a, side).index.search(q, 5)
        sb, ib = getattr(b, side).index.search(q, 5)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(sa, sb)
    assert main(["eval", "--index", str(back), "--relevance", "none", "--no-progress"]) == 0


def _clip_retrieval_folder(folder, rows, img, txt):
    for sub in ("img_emb", "text_emb", "metadata"):
        (folder / sub).mkdir(parents=True)
    np.save(folder / "img_emb" / "img_emb_0.npy", img.astype(np.float16))
    np.save(folder / "text_emb" / "text_emb_0.npy", txt.astype(np.float16))
    pq.write_table(pa.table(rows), folder / "metadata" / "metadata_0.parquet")


def test_a_folder_as_clip_retrieval_writes_it(built, tmp_path):
    from indexer.interop import import_clip_retrieval

    rng = np.random.default_rng(0)
    v = rng.normal(size=(4, 16)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    _clip_retrieval_folder(tmp_path / "cr", {"image_path": ["a.jpg", "b.jpg", "c.jpg", "d.jpg"],
                                             "caption": ["one", "two", None, "four"], "url": ["u1", "u2", "u3", "u4"]},
                           v, v[::-1])
    ix = import_clip_retrieval(tmp_path / "cr", built["clip"], tmp_path / "ix")
    assert ix.manifest["counts"] == {"images": 4, "captions": 3} and ix.has_ground_truth
    assert ix.captions.meta["image"] == [0, 1, 3] and ix.images.meta["metadata"][2] == {"url": "u3"}
    np.testing.assert_allclose(np.asarray(ix.images.vectors), v, atol=1e-3)  # float16 parts
    assert ix.image_roots == ()  # no --images-root: nothing is served


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd"])
def test_hostile_image_paths_are_refused_on_import(built, tmp_path, path):
    from indexer.interop import import_clip_retrieval
    from training.data.karpathy import DatasetError

    v = np.eye(16, dtype=np.float32)[:1]
    _clip_retrieval_folder(tmp_path / "cr", {"image_path": [path], "caption": ["x"]}, v, v)
    with pytest.raises(DatasetError, match="images root"):
        import_clip_retrieval(tmp_path / "cr", built["clip"], tmp_path / "ix", images_root=tmp_path)


def test_a_wrong_model_is_refused(built, tmp_path):
    from indexer.interop import import_clip_retrieval

    v = np.eye(8, dtype=np.float32)[:2]
    _clip_retrieval_folder(tmp_path / "cr", {"image_path": ["a.jpg", "b.jpg"], "caption": ["x", "y"]}, v, v)
    with pytest.raises(IndexDirError, match="8 dimensions, the model 16"):
        import_clip_retrieval(tmp_path / "cr", built["clip"], tmp_path / "ix")
