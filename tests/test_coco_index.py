"""An index built from a merged COCO file: trained, indexed and served from both image folders, with
CxC and ECCV Caption positives attached to its test split, and image serving confined to the
dataset's folders."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import tiny_config
from fastapi.testclient import TestClient
from test_coco import stand_in_test_ids, write_coco


@pytest.fixture(scope="module")
def coco_index(tmp_path_factory):
    """A 2017-style download (test images in both folders) → --karpathy-test JSON → a tiny model → its
    test index. Returns (root, made, test images, index dir)."""
    from app.cli import main
    from app.pipeline import train_run
    from indexer.build import IndexRequest, build_dataset_index

    root = tmp_path_factory.mktemp("coco_e2e")
    made = write_coco(root / "coco", "2017", {"train": 24, "val": 6}, caps=5)
    test_imgs = [made["val"][0], made["train"][3], made["val"][4], made["train"][10], made["train"][17]]
    stand_in_test_ids(root / "ids.npy", test_imgs)
    assert main(["data", "convert-coco", "--coco-root", str(root / "coco"), "--karpathy-test", str(root / "ids.npy"),
                 "--val-size", "5", "--out", str(root / "coco.json")]) == 0
    cfg = tiny_config(extra=[f"data.path={root / 'coco.json'}", "train.epochs=1", "train.batch_size=16"])
    res = train_run(cfg, root / "run")
    ix = build_dataset_index(res.run_dir / "best.pt", root / "coco.json", "test", IndexRequest(root / "index"))
    return root, made, test_imgs, ix


@pytest.mark.training
@pytest.mark.slow
def test_index_holds_the_test_split_from_both_folders(coco_index):
    root, _, test_imgs, ix = coco_index
    assert ix.images.meta["cocoids"] == [i for i, _ in test_imgs]
    assert ix.captions.meta["annids"] == [a for _, anns in test_imgs for a in anns[:5]]
    folders = {(root / "coco" / d).resolve() for d in ("train2017", "val2017")}
    assert {os.path.dirname(p) for p in ix.images.meta["paths"]} == {str(f) for f in folders}
    assert set(ix.image_roots) == folders and sorted(ix.manifest["image_roots"]) == sorted(map(str, folders))


def _stand_in_maps(pkg, test_imgs, cocoids_by_ann):
    """CxC / ECCV id maps over the hand-made test split: image 0 also matches the captions of image 1
    (CxC and ECCV); ECCV re-annotates only images 0 and 2 and captions of image 0."""
    (i0, a0), (_, a1), (i2, a2) = test_imgs[0], test_imgs[1], test_imgs[2]
    cxc_i2t = {str(i): anns[:5] for i, anns in test_imgs}
    cxc_i2t[str(i0)] = a0[:5] + a1[:2]
    cxc_t2i = {str(a): [cocoids_by_ann[a]] for _, anns in test_imgs for a in anns[:5]}
    for a in a1[:2]:
        cxc_t2i[str(a)].append(i0)
    eccv_i2t = {str(i0): a0[:5] + a1[:5], str(i2): a2[:5]}
    eccv_t2i = {str(a): [i0, i2] for a in a0[:5]}
    for name, obj in (("cxc_image_to_caption", cxc_i2t), ("cxc_caption_to_image", cxc_t2i),
                      ("eccv_image_to_caption", eccv_i2t), ("eccv_caption_to_image", eccv_t2i)):
        (pkg / f"{name}.json").write_text(json.dumps(obj))


@pytest.mark.slow
@pytest.mark.training
def test_cxc_and_eccv_positives_attach_to_the_test_split(coco_index, tmp_path, monkeypatch):
    import indexer.relevance as relevance
    from indexer.evaluate import EvalOptions, evaluate_index
    from indexer.metrics import query_metrics

    _, _, test_imgs, ix = coco_index
    _stand_in_maps(tmp_path, test_imgs, {a: i for i, anns in test_imgs for a in anns})
    monkeypatch.setattr(relevance, "eccv_data_dir", lambda: tmp_path)
    i2t, t2i, iq, tq = relevance.coco_positives(ix, "cxc")
    # the maps' positives by index position (they include the original ones, which the metrics add anyway)
    assert i2t[0].tolist() == [0, 1, 2, 3, 4, 5, 6] and t2i[5].tolist() == [0, 1] and t2i[7].tolist() == [1]
    assert iq is None and tq is None
    sims = np.asarray(ix.images.vectors) @ np.asarray(ix.captions.vectors).T
    c2i = np.asarray(ix.captions.meta["image"])
    # CxC: every query, the original positives plus CxC's
    rep = evaluate_index(ix, EvalOptions(relevance=None, cxc=True))
    ref = query_metrics(sims, [np.concatenate([np.flatnonzero(c2i == k), i2t[k]]) for k in range(len(c2i) // 5)])
    assert rep["meta"]["ground_truth"] == "cxc" and rep["meta"]["queries"] == {"i2t": 5, "t2i": 25}
    assert rep["i2t_R@1"] == pytest.approx(100 * np.mean(ref["hit@1"]), abs=1e-3)
    assert rep["i2t_R-P"] == pytest.approx(100 * np.mean(ref["rprec"]), abs=1e-3)
    # ECCV Caption: only the re-annotated queries (images 0 and 2, the captions of image 0)
    rep = evaluate_index(ix, EvalOptions(relevance=None, eccv=True))
    assert rep["meta"]["ground_truth"] == "eccv" and rep["meta"]["queries"] == {"i2t": 2, "t2i": 5}
    ref_t = query_metrics(sims.T[:5], [np.array([0, 2])] * 5)
    assert rep["t2i_R@1"] == pytest.approx(100 * np.mean(ref_t["hit@1"]), abs=1e-3)
    assert rep["t2i_R-P"] == pytest.approx(100 * np.mean(ref_t["rprec"]), abs=1e-3)
    with pytest.raises(Exception, match="choose one"):
        evaluate_index(ix, EvalOptions(relevance=None, cxc=True, eccv=True))


@pytest.mark.training
@pytest.mark.slow
def test_server_serves_images_from_both_folders_and_nothing_else(coco_index, tmp_path):
    from app.api.main import create_app
    from app.api.settings import Settings
    from indexer.index import load_index_dir

    root, _, _, ix = coco_index
    settings = Settings(models={"coco": str(ix.path)}, ui=False, load_in_background=False, torch_threads=0,
                        faiss_threads=0)
    with TestClient(create_app(settings)) as client:
        mf = client.get("/api/models/coco").json()["manifest"]
        assert len(mf["image_roots"]) == 2 and not any(r.startswith("/") for r in mf["image_roots"])
        for pos, image_id in enumerate(ix.images.ids):
            r = client.get(f"/api/images/{image_id}")
            assert r.status_code == 200 and r.content == open(ix.images.meta["paths"][pos], "rb").read()
            assert client.get(f"/api/images/{image_id}/thumbnail?size=32").status_code == 200
        # a file of the index swapped for a link to a file outside the dataset's folders is not served
        secret = tmp_path / "secret.jpg"
        victim = ix.images.meta["paths"][1]
        secret.write_bytes(open(victim, "rb").read())
        backup = tmp_path / "backup.jpg"
        os.replace(victim, backup)
        try:
            os.symlink(secret, victim)
            r = client.get(f"/api/images/{ix.images.ids[1]}")
            assert r.status_code == 404 and "outside the index's image folders" in r.json()["detail"]
            assert str(secret) not in r.text
        finally:
            os.unlink(victim)
            os.replace(backup, victim)
    with pytest.raises(Exception, match="outside the index's image folders"):
        fresh = load_index_dir(ix.path)
        fresh.images.meta["paths"][0] = str(secret)
        fresh.image_file(0)


def test_demo_recognises_a_coco_json(tmp_path):
    from app.cli.demo import PRESETS, dataset_kind

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.json").write_text('{"dataset": "coco", "images_root": "x", "images": []}')
    (tmp_path / "a" / "f8k.json").write_text('{"dataset": "flickr8k", "images": []}')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "dataset_coco.json").write_text('{"images": [], "dataset": "coco"}')  # Karpathy's: key at the end
    assert dataset_kind(tmp_path / "a" / "mine.json") == "coco" and dataset_kind(tmp_path / "b") == "coco"
    assert dataset_kind(tmp_path / "a" / "f8k.json") == "karpathy"
    assert PRESETS["coco"] == ("coco_fne_sbert_baseline", "coco_fne_sbert_ltd")


@pytest.mark.training
@pytest.mark.slow
def test_demo_on_a_converted_coco_json(coco_index, tmp_path, capsys):
    """`ltd demo --dataset coco.json` trains the COCO presets, indexes the 5k-style test split, compares."""
    from conftest import TINY

    from app.cli import main

    root = coco_index[0]
    sets = [a for s in TINY + ["train.epochs=1"] for a in ("--set", s)]
    assert main(["demo", "--dataset", str(root / "coco.json"), "--out", str(tmp_path), "--no-serve", "--no-progress",
                 *sets]) == 0
    out = capsys.readouterr().out
    assert "baseline coco_fne_sbert_baseline, LTD coco_fne_sbert_ltd" in out and "| rsum |" in out
    report = json.loads((tmp_path / "coco" / "indexes" / "ltd" / "report.json").read_text())
    assert report["n_images"] == 5 and report["n_captions"] == 25
