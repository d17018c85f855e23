"""Grid features of EfficientNet-Lite0: layout, agreement with the pooled features and the package
model, and a cache entry of their own."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from training.features import ExtractionSpec, cache_key, extract_features
from training.models.backbones import EfficientNetLite0, grid_regions, grid_side


@pytest.fixture(scope="module", autouse=True)
def fp32_features():
    """These tests compare float32 paths; on a CPU with native bf16 the torch path would otherwise run
    under bf16 autocast (its own cache key; tests/test_runtimes.py checks that path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LTD_FEATURE_DTYPE", "float32")
        yield


@pytest.fixture(scope="module")
def nets():
    return {f: EfficientNetLite0(f, image_size=96) for f in ("pooled", "grid")}


def test_grid_side_follows_the_five_stride_two_stages():
    assert grid_side(224) == 7 and grid_side(160) == 5 and grid_side(96) == 3 and grid_side(100) == 4


@pytest.mark.slow
def test_grid_mean_equals_the_pooled_feature(nets):
    x = torch.randn(3, 3, 96, 96).clamp(-1, 1)
    pooled = nets["pooled"].extract(x)
    grid = nets["grid"].extract(x)
    assert grid.shape == (3, 9 * 1280) and nets["grid"].out_dim == 9 * 1280
    regions = grid_regions(grid)
    assert regions.shape == (3, 9, 1280)
    torch.testing.assert_close(regions.mean(1), pooled, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_fused_grid_matches_the_package_model_cell_by_cell(nets):
    x = torch.randn(2, 3, 96, 96).clamp(-1, 1)
    net = nets["grid"]
    with torch.no_grad():
        ref = net.net.extract_features(x)  # (B, C, H, W) from the unfused package model
    regions = grid_regions(net.extract(x))
    torch.testing.assert_close(regions[:, 1 * 3 + 2], ref[:, :, 1, 2], atol=2e-3, rtol=2e-3)  # row 1, column 2
    torch.testing.assert_close(regions, ref.flatten(2).transpose(1, 2), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(grid_regions(net(x).detach()), regions, atol=2e-3, rtol=2e-3)  # trainable path


def test_grid_regions_rejects_a_wrong_width():
    with pytest.raises(ValueError, match="grid features must be"):
        grid_regions(torch.zeros(2, 1000))


@pytest.mark.slow
def test_grid_features_have_their_own_cache_entry(nets, tmp_path):
    paths = []
    for i in range(2):
        p = tmp_path / f"im{i}.png"
        Image.new("RGB", (120, 100), (30 * i, 200, 90)).save(p)
        paths.append(p)
    keys = {f: cache_key(n.cache_key(), paths, 1) for f, n in nets.items()}
    assert keys["grid"] != keys["pooled"]
    store = extract_features(nets["grid"], paths, cache_dir=tmp_path / "c", spec=ExtractionSpec(workers=0))
    pooled = extract_features(nets["pooled"], paths, cache_dir=tmp_path / "c", spec=ExtractionSpec(workers=0))
    assert store.features.shape == (2, 1, 9 * 1280) and store.key == keys["grid"]
    means = grid_regions(store.tensor()[:, 0]).mean(1).numpy()
    np.testing.assert_allclose(means, pooled.tensor()[:, 0].numpy(), atol=2e-2, rtol=1e-2)  # both float16
