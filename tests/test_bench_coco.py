"""bench/coco_cpu_presets.py: its COCO-shaped stand-in is a valid official download, and the projection
scales each part by what it is proportional to."""
from __future__ import annotations

import pytest
from conftest import write_karpathy


def test_stand_in_converts_like_an_official_download(tmp_path):
    from bench.coco_cpu_presets import make_fake_coco
    from training.data.coco import KarpathyTest, convert_coco, discover_coco_root
    from training.data.karpathy import load_karpathy

    src = write_karpathy(tmp_path / "f8k", 40, name="dataset_flickr8k.json")
    ids, n_test = make_fake_coco(src, tmp_path / "coco", 40)
    assert n_test == 3  # every 20th image of each folder
    res = convert_coco(discover_coco_root(tmp_path / "coco"), tmp_path / "c.json", karpathy_test=KarpathyTest(ids, val_size=5))
    assert res["splits"] == {"test": 3, "val": 5, "train": 32} and res["captions"] == 200
    ds = load_karpathy(tmp_path / "c.json")
    assert {im.path.parent.name for im in ds.split("test").images} == {"train2017", "val2017"}
    from PIL import Image
    assert Image.open(ds.images[0].path).size == (640, 480)


def test_projection_scales_each_part_by_its_own_measure():
    from bench.coco_cpu_presets import COCO_CAPTIONS, COCO_TRAIN_CAPTIONS, COCO_VAL_CAPTIONS, project

    p = {"cpu": {"captions": 10.0, "fixed": 3.0, "epoch": 2.0, "val": 0.5}, "steps": 10, "batch": 100, "captions": 1000,
         "val_captions": 100, "epochs": 4}
    out = project(p, "cpu")
    steps = -(-COCO_TRAIN_CAPTIONS // 100)
    assert out["captions"] == pytest.approx(10.0 * COCO_CAPTIONS / 1000) and out["fixed"] == 3.0
    assert out["epoch"] == pytest.approx(0.2 * steps) and out["val"] == pytest.approx(0.5 * COCO_VAL_CAPTIONS / 100)
    assert out["train"] == pytest.approx(3.0 + out["captions"] + 4 * (out["epoch"] + out["val"]) + out["val"])
