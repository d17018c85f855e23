"""Decoding in worker processes: order kept, bad files reported not fatal, draft decoding reduces the
decoded size of large JPEGs and has a feature-cache entry of its own."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from training.data.decode_pool import ImageViews, decode_key, decoded_batches
from training.data.images import Preprocess, load_image
from training.features import cache_key


def _jpegs(tmp_path, n=5, size=(640, 480)):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        p = tmp_path / f"im{i}.jpg"
        Image.fromarray((rng.random((size[1], size[0], 3)) * 255).astype(np.uint8)).save(p, quality=85)
        out.append(p)
    return out


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_keep_order_and_report_bad_files(tmp_path, workers):
    paths = _jpegs(tmp_path, 5, (80, 60))
    paths[2].write_bytes(b"not a jpeg")
    pre = Preprocess(size=32, resize=32)
    got, bad = [], []
    for idx, x, failed in decoded_batches(ImageViews(paths, range(5), pre), batch_size=2, workers=workers):
        got += idx
        bad += failed
        assert x is None or x.shape == (len(idx), 3, 32, 32)
    assert got == [0, 1, 3, 4] and [i for i, _ in bad] == [2] and "im2.jpg" in bad[0][1]
    direct = pre(load_image(paths[3]))
    batch = next(x for idx, x, _ in decoded_batches(ImageViews(paths, [3], pre), workers=workers))
    np.testing.assert_array_equal(batch[0].numpy(), direct.numpy())  # the worker decodes exactly as load_image


def test_draft_decoding_decodes_large_jpegs_at_reduced_scale(tmp_path, monkeypatch):
    path = _jpegs(tmp_path, 1)[0]
    pre = Preprocess(size=224, resize=224)
    seen = []
    import training.data.decode_pool as dp

    def spy(p, **kw):
        img = load_image(p, **kw)
        seen.append(img.size)
        return img
    monkeypatch.setattr(dp, "load_image", spy)
    full = ImageViews([path], [0], pre, 1)[0][1]
    draft = ImageViews([path], [0], pre, 1, draft=True)[0][1]
    assert seen == [(640, 480), (320, 240)]  # DCT scale 1/2: the short side stays >= 224
    assert full.shape == draft.shape == (1, 3, 224, 224)
    assert not np.array_equal(full.numpy(), draft.numpy())  # different pixels, hence its own cache key


def test_draft_decoding_has_its_own_cache_key(tmp_path):
    paths = _jpegs(tmp_path, 1, (40, 30))
    key = {"backbone": "x"}
    assert cache_key(key, paths, 1) != cache_key(key, paths, 1, draft=True)
    assert decode_key(False) == {}  # keys written before draft decoding existed stay valid


def test_default_decoder_pool_scales_with_the_inference_threads(monkeypatch):
    from training.data.decode_pool import default_workers

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert default_workers(1000, 32) == 2  # one decoder starved OpenVINO's streams on 2 cores
    assert default_workers(1000, 32, threads=1) == 1  # a 1-thread Ray actor: still overlaps decoding
    assert default_workers(32, 32) == 0  # a single batch: a pool only adds its start-up
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert default_workers(1000, 32) == 9
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert default_workers(1000, 32) == 0  # nothing to overlap with
