"""Region inputs (issue 21): the packaged CNN's grid cells from the feature cache and precomputed
regions read from disk reach the model as the same rows; the reader's formats, boxes and refusals."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from training.features import ExtractionSpec, extract_features
from training.models.backbones import EfficientNetLite0
from training.regions import RegionFeatureError, load_region_features, spatial_features

IDS = [10, 11, 12, 13]
NAMES = [f"im{i}.jpg" for i in range(4)]
SPLITS = ["train", "train", "val", "test"]


@pytest.fixture(scope="module")
def grid_store(tmp_path_factory):
    """Grid features (2 × 2 cells × 1280 at 64 px) of four images, through the real feature cache."""
    root = tmp_path_factory.mktemp("grid")
    paths = []
    for i in range(4):
        p = root / NAMES[i]
        Image.new("RGB", (80, 64), (60 * i, 200 - 40 * i, 90)).save(p)
        paths.append(p)
    net = EfficientNetLite0("grid", image_size=64)
    return extract_features(net, paths, cache_dir=root / "cache", spec=ExtractionSpec(workers=0))


def _regions(store) -> np.ndarray:
    return np.asarray(store.features)[:, 0].reshape(4, 4, 1280)  # (N, R, C), cell by cell


def _write_sources(arr: np.ndarray, root):
    """The same region array in every format the reader takes."""
    np.save(root / "all.npy", arr)
    order = [2, 0, 3, 1]
    np.savez(root / "by_id.npz", features=arr[order], ids=np.array([IDS[i] for i in order]))
    np.savez(root / "by_name.npz", features=arr[order], ids=np.array([NAMES[i] for i in order]))
    (root / "per_image").mkdir()
    for i in range(4):
        if i % 2:
            np.save(root / "per_image" / f"{IDS[i]}.npy", arr[i])  # named by image id
        else:
            np.savez(root / "per_image" / f"im{i}.npz", feat=arr[i])  # by file-name stem, bottom-up key
    (root / "per_split").mkdir()
    for split, rows in (("train", [0, 1]), ("dev", [2]), ("test", [3])):  # SCAN/VSRN naming: dev = val
        np.save(root / "per_split" / f"{split}_ims.npy", arr[rows])
    return ["all.npy", "by_id.npz", "by_name.npz", "per_image", "per_split"]


@pytest.mark.slow
def test_grid_cache_and_precomputed_reader_give_identical_model_inputs(grid_store, tmp_path):
    from training.config import load_config
    from training.data.vocab import Vocab
    from training.models.dual_encoder import ModelDims, build_model

    arr = _regions(grid_store)
    cache_rows = grid_store.mean_view()
    torch.manual_seed(0)
    grid_cfg = load_config("synthetic_baseline", ["model.image_encoder=vsrn", "model.image_features=grid",
                                                  "model.image_size=64", "model.reasoning_dim=16"])
    model = build_model(grid_cfg, Vocab.build([["a"]])).eval()
    want = model.encode_image_features(cache_rows)
    for name in _write_sources(arr, tmp_path):
        store, region_dim = load_region_features(tmp_path / name, IDS, NAMES, SPLITS, cache_dir=tmp_path / "c")
        assert region_dim == 1280 and store.features.shape == (4, 1, 4 * 1280), name
        assert np.array_equal(np.asarray(store.features), np.asarray(grid_store.features)), name
        torch.testing.assert_close(model.encode_image_features(store.mean_view()), want, atol=0, rtol=0)
    # a model built for precomputed regions with the same weights computes the same embeddings
    pre_cfg = load_config("synthetic_baseline", ["model.image_encoder=vsrn", "model.backbone=precomputed",
                                                 "model.precomputed_path=x", "model.region_dim=1280",
                                                 "model.reasoning_dim=16"])
    pre = build_model(pre_cfg, Vocab.build([["a"]]), dims=ModelDims(feat_dim=4 * 1280))
    pre.load_state_dict(model.state_dict(), strict=False)
    torch.testing.assert_close(pre.eval().encode_image_features(store.mean_view()), want, atol=0, rtol=0)


def test_the_assembled_cache_is_reused_and_rebuilt_when_the_source_changes(tmp_path):
    arr = np.random.default_rng(0).random((4, 3, 5)).astype(np.float32)
    np.save(tmp_path / "a.npy", arr)
    s1, _ = load_region_features(tmp_path / "a.npy", IDS, NAMES, SPLITS, cache_dir=tmp_path / "c")
    s2, _ = load_region_features(tmp_path / "a.npy", IDS, NAMES, SPLITS, cache_dir=tmp_path / "c")
    assert s1.key == s2.key and len(list((tmp_path / "c" / "features").iterdir())) == 1
    np.save(tmp_path / "a.npy", arr[::-1] * 2)
    s3, _ = load_region_features(tmp_path / "a.npy", IDS, NAMES, SPLITS, cache_dir=tmp_path / "c")
    assert s3.key != s1.key
    np.testing.assert_allclose(np.asarray(s3.features)[0, 0], (arr[3] * 2).reshape(-1), rtol=1e-3)
    assert not [p for p in (tmp_path / "c" / "features").rglob(".*tmp*")]  # no temporaries left behind


def test_boxes_become_five_spatial_features_per_region(tmp_path):
    feats = np.ones((4, 2, 3), np.float32)
    boxes = np.array([[[0, 0, 50, 100], [25, 50, 100, 100]]] * 4, np.float32)  # pixels of a 100 × 200 image
    (tmp_path / "d").mkdir()
    for i in range(4):
        np.savez(tmp_path / "d" / f"{IDS[i]}.npz", x=feats[i], bbox=boxes[i], image_w=100, image_h=200)
    store, region_dim = load_region_features(tmp_path / "d", IDS, NAMES, SPLITS, cache_dir=tmp_path / "c")
    assert region_dim == 8
    row = np.asarray(store.features)[0, 0].reshape(2, 8)
    np.testing.assert_allclose(row[0], [1, 1, 1, 0, 0, 0.5, 0.5, 0.25], rtol=1e-3)
    np.testing.assert_allclose(row[1], [1, 1, 1, 0.25, 0.25, 1, 0.5, 0.1875], rtol=1e-3)
    _, without = load_region_features(tmp_path / "d", IDS, NAMES, SPLITS, boxes=False, cache_dir=tmp_path / "c")
    assert without == 3
    with pytest.raises(RegionFeatureError, match="boxes look like pixels"):
        spatial_features(boxes[0])


@pytest.mark.parametrize("make, message", [
    (lambda d: np.save(d / "x.npy", np.zeros((3, 2, 4))), "expected \\(N, R, C\\) region features for the dataset's 4"),
    (lambda d: np.save(d / "x.npy", np.zeros((4, 8))), "expected \\(N, R, C\\)"),
    (lambda d: [np.save(d / f"{i}.npy", np.zeros((2 + (i == 12), 4))) for i in IDS], "same number of regions"),
    (lambda d: [np.save(d / f"{i}.npy", np.zeros((2, 4))) for i in IDS[:3]], "no region features for 1 of 4"),
    (lambda d: [np.save(d / f"{s}_ims.npy", np.zeros((n, 2, 4))) for s, n in (("train", 3), ("val", 1), ("test", 1))],
     "expected \\(2, R, C\\) for the 2 train images"),
    (lambda d: np.savez(d / "x.npz", features=np.zeros((4, 2, 4)), ids=np.array([10, 11, 12, 99])), "no features for 1"),
])
def test_the_reader_refuses_what_it_cannot_align(tmp_path, make, message):
    d = tmp_path / "src"
    d.mkdir()
    make(d)
    files = sorted(d.iterdir())
    src = files[0] if len(files) == 1 and files[0].suffix in (".npy", ".npz") and files[0].stem == "x" else d
    with pytest.raises(RegionFeatureError, match=message):
        load_region_features(src, IDS, NAMES, SPLITS, cache_dir=tmp_path / "c")
    assert not (tmp_path / "c" / "features").exists() or not list((tmp_path / "c" / "features").rglob("features.npy"))
