"""JPEG decoders: libjpeg-turbo through simplejpeg gives Pillow's pixels exactly (DCT scaling, EXIF
orientation, greyscale and progressive files included), falls back to Pillow where it should, never
decodes before the pixel budget is checked; the GPU decoder imports without its package or a GPU and
the CPU pipeline is unchanged beside it."""
from __future__ import annotations

import importlib
import io
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from training.data import gpu_decode, jpeg
from training.data.decode_pool import ImageViews, decoded_batches
from training.data.images import ImageError, Preprocess, load_image
from training.device import using_device

simplejpeg = pytest.importorskip("simplejpeg", reason="simplejpeg (a core dependency) is not installed")


def _photo(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 100 * np.sin(x / 37 + c) * np.cos(y / 23 - c) for c in range(3)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))


def _jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=kw.pop("quality", 88), **kw)
    return buf.getvalue()


def _both(data: bytes, monkeypatch, **kw) -> tuple[np.ndarray, np.ndarray]:
    monkeypatch.setattr(jpeg, "backend", "pillow")
    ref = np.asarray(load_image(data, **kw))
    monkeypatch.setattr(jpeg, "backend", "simplejpeg")
    return ref, np.asarray(load_image(data, **kw))


def _rotated(img: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    return _jpeg(img, exif=exif.tobytes())


CASES = {
    "4:2:0": lambda: _jpeg(_photo(300, 200)),
    "4:4:4": lambda: _jpeg(_photo(300, 200), subsampling=0),
    "greyscale": lambda: _jpeg(_photo(300, 200).convert("L")),
    "progressive": lambda: _jpeg(_photo(300, 200), progressive=True),
    "EXIF-rotated": lambda: _rotated(_photo(300, 200)),
    "odd size": lambda: _jpeg(_photo(333, 211, 2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("min_side", [0, 64, 40])  # full scale, 1/2 and 1/4 (draft mode's choices)
def test_simplejpeg_gives_pillows_pixels(case, min_side, monkeypatch):
    calls = []
    real = simplejpeg.decode_jpeg
    monkeypatch.setattr(jpeg.simplejpeg, "decode_jpeg", lambda *a, **k: calls.append(1) or real(*a, **k))
    ref, got = _both(CASES[case](), monkeypatch, min_side=min_side)
    assert calls, "the fast path was not taken"
    assert got.shape == ref.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref)


def test_the_fast_path_scales_in_the_dct_as_draft_mode_does(monkeypatch):
    ref, got = _both(_jpeg(_photo(640, 480)), monkeypatch, min_side=224)
    assert got.shape == ref.shape == (240, 320, 3)
    np.testing.assert_array_equal(got, ref)


def test_corrupt_and_other_files_go_to_pillow(monkeypatch, tmp_path):
    data = _jpeg(_photo(200, 150))
    monkeypatch.setattr(jpeg, "backend", "simplejpeg")
    with pytest.raises(ImageError, match="corrupt or truncated"):
        load_image(data[: len(data) // 2], name="half.jpg")  # simplejpeg refuses; Pillow's error is reported
    png = io.BytesIO()
    _photo(50, 40).save(png, "PNG")
    assert load_image(png.getvalue()).size == (50, 40)
    cmyk = _jpeg(_photo(60, 40).convert("CMYK"))
    np.testing.assert_array_equal(*_both(cmyk, monkeypatch))  # not RGB/L: Pillow decodes it both times
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    np.testing.assert_array_equal(*_both(str(path), monkeypatch))  # paths as well as bytes


def test_the_pixel_budget_is_checked_before_any_decode(monkeypatch):
    calls = []
    monkeypatch.setattr(jpeg.simplejpeg, "decode_jpeg", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(jpeg, "backend", "simplejpeg")
    with pytest.raises(ImageError, match="decompression-bomb guard"):
        load_image(_jpeg(_photo(400, 300)), max_pixels=100 * 100)
    assert calls == []


def test_without_simplejpeg_pillow_decodes(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # as if not installed
    fresh = importlib.reload(jpeg)
    try:
        assert fresh.simplejpeg is None and fresh.backend == "pillow"
        assert load_image(_jpeg(_photo(120, 90))).size == (120, 90)
    finally:
        monkeypatch.delitem(sys.modules, "simplejpeg")
        importlib.reload(jpeg)
    assert jpeg.backend == "simplejpeg"


def test_the_gpu_decoder_imports_without_its_package_and_the_cpu_path_is_unchanged(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    monkeypatch.setitem(sys.modules, "nvidia", None)
    fresh = importlib.reload(gpu_decode)
    try:
        assert fresh.nvimgcodec is None
        assert fresh.unavailable("cpu") == "the model runs on cpu"
        assert "nvImageCodec is not installed" in fresh.unavailable("cuda")
        with using_device("cuda"):
            assert not fresh.uses_gpu()
        assert fresh.decode_key(True, False) == {"decode": "draft"}
        paths = []
        for i in range(5):
            paths.append(tmp_path / f"{i}.jpg")
            paths[-1].write_bytes(_jpeg(_photo(250, 180, i)))
        pre = Preprocess(size=64, resize=64)
        got = list(fresh.image_batches(paths, range(5), pre, fresh.ExtractionSpec(batch_size=2, workers=0)))
        want = list(decoded_batches(ImageViews(paths, range(5), pre), batch_size=2, workers=0))
        assert [g[0] for g in got] == [w[0] for w in want]
        for (_, x, _), (_, y, _) in zip(got, want):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    finally:
        monkeypatch.undo()
        importlib.reload(gpu_decode)


@pytest.mark.skipif(gpu_decode.unavailable("cuda") is not None,
                    reason=f"GPU JPEG decoding cannot run here: {gpu_decode.unavailable('cuda')}")
def test_gpu_decoding_matches_the_cpu_path(tmp_path):
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(_jpeg(_photo(320 + 16 * i, 240, i)))
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 not really")
    paths.append(tmp_path / "bad.jpg")
    pre = Preprocess(size=224, resize=224)
    with using_device("cuda"):
        gpu = list(gpu_decode.gpu_decoded_batches(paths, range(7), pre, batch_size=8))
    cpu = list(decoded_batches(ImageViews(paths, range(7), pre), batch_size=8, workers=0))
    (gi, gx, gbad), (ci, cx, cbad) = gpu[0], cpu[0]
    assert gi == ci == list(range(6)) and [b[0] for b in gbad] == [b[0] for b in cbad] == [6]
    assert gx.device.type == "cuda" and gx.shape == cx.shape
    cos = torch.nn.functional.cosine_similarity(gx.cpu().flatten(1), cx.flatten(1))
    assert cos.min() > 0.995, cos


@pytest.mark.parametrize("size", [(224, 224), (231, 197), (5, 3)])
@pytest.mark.parametrize("stats", [((0.5,) * 3, (0.5,) * 3), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
def test_to_tensor_is_the_plain_formula_bit_for_bit(size, stats):
    img = _photo(*size, seed=size[0])
    pre = Preprocess(mean=stats[0], std=stats[1])
    arr = np.asarray(img, dtype=np.float32) / 255.0  # the reference: what to_tensor computed before
    ref = np.ascontiguousarray(((arr - np.asarray(stats[0], np.float32)) / np.asarray(stats[1], np.float32))
                               .transpose(2, 0, 1))
    got = pre.to_tensor(img)
    assert got.dtype == torch.float32 and got.is_contiguous()
    np.testing.assert_array_equal(got.numpy(), ref)
