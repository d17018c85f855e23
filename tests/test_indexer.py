"""Indexer: FAISS wrapper, index directories, corpus indexing, evaluation reports, CxC, compare."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from indexer.index import IndexDirError, Modality, VectorIndex, load_index_dir, save_index_dir


def _unit(n, d, seed=0):
    v = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_flat_search_equals_bruteforce():
    base, q = _unit(500, 32, 0), _unit(20, 32, 1)
    idx = VectorIndex.build(base, "Flat")
    scores, ids = idx.search(q, 10)
    exact = q @ base.T
    ref = np.argsort(-exact, axis=1, kind="stable")[:, :10]
    assert (ids == ref).all()
    assert np.allclose(scores, np.take_along_axis(exact, ref, 1), atol=1e-5)
    assert idx.search(q[0], 10_000)[1].shape == (1, 500)  # k is capped at ntotal


@pytest.mark.parametrize("factory", ["HNSW32", "IVF16,Flat", "IVF8,PQ8"])
def test_approximate_factories_build_and_recall(factory):
    base, q = _unit(2000, 32, 0), _unit(50, 32, 1)
    idx = VectorIndex.build(base, factory)
    _, ids = idx.search(q, 10)
    ref = np.argsort(-(q @ base.T), axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ref)])
    assert recall > (0.3 if "PQ" in factory else 0.6)


def test_bad_factory_and_untrainable():
    with pytest.raises(IndexDirError, match="invalid FAISS factory"):
        VectorIndex.build(_unit(10, 8), "NoSuchIndex42")
    with pytest.raises(IndexDirError, match="cannot train"):
        VectorIndex.build(_unit(10, 8), "IVF1024,Flat")


def test_index_dir_roundtrip_and_atomicity(tmp_path):
    img, cap = _unit(4, 8, 0), _unit(8, 8, 1)
    mods = (Modality(VectorIndex.build(img), img, {"ids": [10, 11, 12, 13], "filenames": list("abcd"),
                                                    "paths": list("abcd"), "captions": [[0, 1], [2, 3], [4, 5], [6, 7]]}),
            Modality(VectorIndex.build(cap), cap, {"ids": list(range(8)), "texts": list("abcdefgh"),
                                                    "image": [0, 0, 1, 1, 2, 2, 3, 3]}))
    out = tmp_path / "ix"
    save_index_dir(out, {"name": "x", "checkpoint_sha256": "abc", "factory": "Flat", "ground_truth": True}, *mods)
    ix = load_index_dir(out, checkpoint_sha256="abc")
    assert ix.images.ids == [10, 11, 12, 13] and np.allclose(ix.captions.vectors, cap)
    assert ix.manifest["counts"] == {"images": 4, "captions": 8} and ix.manifest["format"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    with pytest.raises(FileExistsError, match="--overwrite"):
        save_index_dir(out, {"name": "x"}, *mods)
    with pytest.raises(IndexDirError, match="would not match the query encoder"):
        load_index_dir(out, checkpoint_sha256="def")
    (out / ix.manifest["files"]["captions.json"]["file"]).write_text(json.dumps({"ids": [1]}))
    with pytest.raises(IndexDirError, match="torn or replaced"):
        load_index_dir(out)
    with pytest.raises(IndexDirError, match="not an index directory"):
        load_index_dir(tmp_path)


@pytest.mark.slow
def test_index_eval_matches_training_validation(tiny_index_pair, tmp_path):
    """`ltd index` + `ltd eval` on the val split reproduce the R@k that training validation logged
    for the same (best) weights."""
    from app.cli import main

    run = tiny_index_pair["runs"]["ltd"]
    val_rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()
                if json.loads(ln)["type"] == "val"]
    best = max(val_rows[1:], key=lambda r: r["rsum"])
    out = tmp_path / "val_ix"
    assert main(["index", "--checkpoint", str(run / "best.pt"), "--dataset", str(tiny_index_pair["dataset"]),
                 "--split", "val", "--out", str(out), "--no-progress"]) == 0
    assert main(["eval", "--index", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    for k in ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10", "rsum"):
        assert report[k] == pytest.approx(best[k], abs=1e-3), k
    assert "t2i_nDCG@25_rougeL" in report and "i2t_R-P" in report
    md = (out / "report.md").read_text()
    assert "rsum" in md and "text → image" in md
    # the index refuses a different checkpoint
    other = tiny_index_pair["runs"]["bl"] / "best.pt"
    from training.fsio import sha256_file
    with pytest.raises(IndexDirError, match="Rebuild the index"):
        load_index_dir(out, checkpoint_sha256=sha256_file(other))


@pytest.mark.slow
def test_corpus_index_skips_corrupt_images_and_appends(tiny_index_pair, tmp_path, capsys):
    from app.cli import main

    ckpt = tiny_index_pair["runs"]["bl"] / "best.pt"
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (50, 40), (40 * i, 90, 200)).save(folder / f"ok{i}.jpg")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    good = (folder / "ok0.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (folder / "notes.txt").write_text("ignored: not an image extension")
    caps = tmp_path / "caps.txt"
    caps.write_text("a red circle\n\n a blue square \n")
    out = tmp_path / "corpus"
    assert main(["index", "--checkpoint", str(ckpt), "--images-dir", str(folder), "--captions-file", str(caps),
                 "--out", str(out), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"index": str(out), "images": 3, "captions": 2, "skipped": 2, "factory": "Flat"}
    ix = load_index_dir(out)
    assert sorted(s["file"].rsplit("/", 1)[-1] for s in ix.manifest["skipped"]) == ["broken.jpg", "truncated.jpg"]
    assert ix.captions.meta["texts"] == ["a red circle", "a blue square"] and not ix.has_ground_truth
    # append: ids continue, manifest counts follow
    more = tmp_path / "more"
    more.mkdir()
    Image.new("RGB", (30, 30), (1, 2, 3)).save(more / "x.png")
    assert main(["index", "--checkpoint", str(ckpt), "--images-dir", str(more), "--out", str(out), "--append",
                 "--no-progress"]) == 0
    ix = load_index_dir(out)
    assert ix.images.ids == [0, 1, 2, 3] and ix.manifest["counts"]["images"] == 4
    assert ix.images.index.ntotal == 4 and ix.images.meta["filenames"][-1] == "x.png"
    # eval on a corpus index is refused clearly
    assert main(["eval", "--index", str(out)]) == 2
    assert "without ground truth" in capsys.readouterr().err


@pytest.mark.slow
def test_cxc_positives_from_package(tmp_path):
    """CxC extra positives come from the eccv-caption package's id maps."""
    from indexer.relevance import coco_positives
    from training.data.coco import eccv_data_dir

    data = eccv_data_dir()
    i2t = json.loads((data / "cxc_image_to_caption.json").read_text())
    orig = json.loads((data / "original_image_to_caption.json").read_text())
    cocoids = [int(c) for c in list(orig)[:40]]
    annids = [int(a) for c in cocoids for a in orig[str(c)]]
    img = _unit(len(cocoids), 8)
    cap = _unit(len(annids), 8, 1)
    c2i = [k for k, c in enumerate(cocoids) for _ in orig[str(c)]]
    mods = (Modality(VectorIndex.build(img), img, {"ids": cocoids, "filenames": [str(c) for c in cocoids],
                                                    "paths": [""] * len(cocoids), "cocoids": cocoids,
                                                    "captions": [[j for j, i in enumerate(c2i) if i == k]
                                                                 for k in range(len(cocoids))]}),
            Modality(VectorIndex.build(cap), cap, {"ids": annids, "texts": [""] * len(annids), "image": c2i,
                                                    "annids": annids}))
    ix = save_index_dir(tmp_path / "cxc", {"name": "cxc", "factory": "Flat", "ground_truth": True}, *mods)
    i2t_extra, t2i_extra, i2t_q, t2i_q = coco_positives(ix, "cxc")
    assert i2t_q is None and t2i_q is None  # CxC keeps every query
    pos = {a: j for j, a in enumerate(annids)}
    for k, c in enumerate(cocoids):
        expected = sorted(pos[int(a)] for a in i2t.get(str(c), []) if int(a) in pos)
        assert i2t_extra[k].tolist() == expected
    assert sum(len(e) for e in i2t_extra) > 0  # the sample has CxC links within itself
    from indexer.evaluate import EvalOptions, evaluate_index
    rep = evaluate_index(ix, EvalOptions(relevance=None, cxc=True))
    assert rep["meta"]["ground_truth"] == "cxc" and 0 <= rep["i2t_R@1"] <= 100
    # without COCO ids, CxC is refused with a clear message
    ix.images.meta.pop("cocoids")
    with pytest.raises(IndexDirError, match="COCO image ids"):
        coco_positives(ix, "cxc")


@pytest.mark.slow
def test_compare_two_models(tiny_index_pair, tmp_path, capsys):
    from app.cli import main
    from indexer.disagreement import compare_indexes

    a, b = load_index_dir(tiny_index_pair["bl"]), load_index_dir(tiny_index_pair["ltd"])
    rows = compare_indexes(a, b)
    n_img, n_cap = len(a.images.ids), len(a.captions.ids)
    assert len(rows) == n_img + n_cap
    dis = [r["disagreement"] for r in rows]
    assert dis == sorted(dis, reverse=True)
    r = rows[0]
    assert r["winner"] == ("b" if r["b_rank"] < r["a_rank"] else "a" if r["a_rank"] < r["b_rank"] else "tie")
    csv_path = tmp_path / "cmp.csv"
    assert main(["compare", "--index", str(a.path), "--index", str(b.path), "--top", "5", "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n| t2i |") + out.count("\n| i2t |") == 5
    assert len(csv_path.read_text().splitlines()) == len(rows) + 1
    # different splits cannot be compared
    meta = {**b.captions.meta, "ids": [i + 1000 for i in b.captions.meta["ids"]]}
    save_index_dir(tmp_path / "other", b.manifest, b.images, Modality(b.captions.index, b.captions.vectors, meta))
    assert main(["compare", "--index", str(a.path), "--index", str(tmp_path / "other")]) == 2
    assert "do not index the same items" in capsys.readouterr().err
