"""Synthetic shortcuts (SVL): digits on images and captions, deterministic by seed, picklable."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.data.karpathy import Dataset, parse_karpathy, tokenize
from training.data.shortcuts import (
    SHORTCUT_SETTINGS,
    apply_shortcuts,
    caption_with_number,
    draw_number,
    glyph_bank,
    glyph_layout,
    number_digits,
    parse_setting,
    render_patches,
)

N_IMAGES = 40


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Dataset:
    data = {"images": [
        {"filename": f"{i:03d}.jpg", "split": ["train", "val", "test"][i % 3],
         "sentences": [{"raw": f"a dog runs on the grass {i}"}, {"raw": "two cats"}]}
        for i in range(N_IMAGES)
    ]}
    return parse_karpathy(data, json_path=None, root=tmp_path_factory.mktemp("sc"), check_files=False)


def _noise(w: int = 224, h: int = 224, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _px(img: Image.Image) -> np.ndarray:
    return np.asarray(img).astype(np.int16)


# ------------------------------------------------------------------------------------------------
# settings
# ------------------------------------------------------------------------------------------------
def test_parse_setting():
    assert parse_setting("none") == ("none", None)
    assert parse_setting("unique") == ("unique", None)
    assert parse_setting("image_only") == ("image_only", None)
    assert parse_setting("caption_only") == ("caption_only", None)
    assert parse_setting("bits:1") == ("bits", 1)
    assert parse_setting("bits:19") == ("bits", 19)


@pytest.mark.parametrize("bad", ["", "uniq", "bits", "bits:", "bits:0", "bits:20", "bits:x", "bits:-3", "all"])
def test_bad_settings_name_valid_choices(bad, ds):
    with pytest.raises(ValueError) as e:
        parse_setting(bad)
    msg = str(e.value)
    for choice in (*SHORTCUT_SETTINGS, "bits:N"):
        assert choice in msg
    with pytest.raises(ValueError):
        apply_shortcuts(bad, ds)


# ------------------------------------------------------------------------------------------------
# captions
# ------------------------------------------------------------------------------------------------
def test_caption_tokens_zero_padded(ds):
    assert number_digits(1992) == [0, 0, 1, 9, 9, 2]
    assert caption_with_number("a dog runs on the grass", 1992) == "a dog runs on the grass 0 0 1 9 9 2"
    sc = apply_shortcuts("unique", ds)
    c = ds.captions[ds.images[7].caption_indices[1]]
    assert sc.caption(c) == "two cats 0 0 0 0 0 7"
    assert tokenize(sc.caption(c))[-6:] == ["0", "0", "0", "0", "0", "7"]
    for c in ds.captions:  # both captions of an image carry the image's number
        assert sc.caption(c) == f"{c.raw} " + " ".join(f"{c.image_index:06d}")


def test_none_and_image_only_leave_captions(ds):
    for setting in ("none", "image_only"):
        sc = apply_shortcuts(setting, ds)
        assert all(sc.caption(c) == c.raw for c in ds.captions)
    assert apply_shortcuts("none", ds).number(3) is None
    assert apply_shortcuts("image_only", ds).number(3) == 3


def test_none_and_caption_only_leave_images(ds):
    for setting in ("none", "caption_only"):
        sc = apply_shortcuts(setting, ds)
        assert sc.image_transform is None
        assert sc.transform_id == ""  # same pixels as no shortcut: shares the plain feature cache
    sc = apply_shortcuts("caption_only", ds)
    assert sc.caption(ds.captions[0]).endswith(" 0 0 0 0 0 0")


# ------------------------------------------------------------------------------------------------
# images
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["unique", "image_only", "bits:8"])
def test_digits_drawn_in_top_band_only(ds, setting):
    sc = apply_shortcuts(setting, ds, seed=1)
    img = _noise()
    before = _px(img)
    out = sc.image_transform(5, img)
    assert out.size == img.size and out.mode == "RGB"
    assert np.array_equal(_px(img), before)  # the input view is not modified in place
    lay = glyph_layout(224, 224)
    band = lay.y + lay.side
    diff = np.any(_px(out) != before, axis=2)
    assert diff[:band].any()
    assert not diff[band:].any()  # nothing below the glyph band changes
    assert lay.side / 224 > 1 / 10  # clearly visible: glyph patch ~1/8 of the height


def test_patch_pixels_equal_upscaled_glyphs(ds):
    sc = apply_shortcuts("unique", ds, seed=3)
    idx = 17
    out = _px(sc.image_transform(idx, _noise()))
    lay = glyph_layout(224, 224)
    patches = render_patches(17, 224, 224, seed=3, image_index=idx)
    bank = glyph_bank("digits")
    table = bank.patches(lay.side, lay.pad)
    for k, digit in enumerate(number_digits(17)):
        x0, y0, x1, y1 = lay.box(k)
        for ch in range(3):
            assert np.array_equal(out[y0:y1, x0:x1, ch], patches[k])
        sample = bank.sample(digit, 3, idx, k)
        assert bank.labels[sample] == digit  # the glyph is a sample of the right digit
        assert np.array_equal(patches[k], table[sample])
        # white strokes on a dark patch: the border is black, the glyph has bright ink
        assert patches[k][0].max() == 0 and patches[k][:, 0].max() == 0 and patches[k].max() > 200
    # the glyph is the 8x8 sample upscaled, so downscaling it back recovers the original closely
    g = lay.side - 2 * lay.pad
    inner = patches[5][lay.pad: lay.pad + g, lay.pad: lay.pad + g].astype(np.float32) / 255
    small = np.asarray(Image.fromarray(inner, "F").resize((8, 8), Image.BOX))
    assert np.abs(small - bank.images[bank.sample(7, 3, idx, 5)]).mean() < 0.1


def test_patches_evenly_spaced_and_inside(ds):
    for w, h in [(224, 224), (32, 32), (64, 300), (300, 40), (37, 251)]:
        lay = glyph_layout(w, h)
        gaps = np.diff(lay.xs)
        assert gaps.max() - gaps.min() <= 1
        assert lay.xs[0] >= 0 and lay.xs[-1] + lay.side <= w and lay.y + lay.side <= h
        assert all(lay.xs[k] + lay.side <= lay.xs[k + 1] for k in range(5))  # no overlap
        out = draw_number(_noise(w, h), 123456)
        assert out.size == (w, h)
    with pytest.raises(ValueError):
        glyph_layout(16, 16)


def test_grayscale_view():
    img = Image.new("L", (64, 64), 128)
    out = draw_number(img, 42)
    assert out.mode == "L" and np.asarray(out)[40:].min() == 128


def test_deterministic_by_seed(ds):
    img = _noise()
    a = apply_shortcuts("unique", ds, seed=0).image_transform(9, img)
    b = apply_shortcuts("unique", ds, seed=0).image_transform(9, img)
    c = apply_shortcuts("unique", ds, seed=1).image_transform(9, img)
    assert np.array_equal(_px(a), _px(b))
    assert not np.array_equal(_px(a), _px(c))  # another seed draws other samples of the digits
    # images with the same number still get different handwriting (glyph choice uses the index)
    sc = apply_shortcuts("bits:1", ds, seed=0, evaluation=True)
    assert sc.number(2) == sc.number(4) == 0
    assert not np.array_equal(_px(sc.image_transform(2, img)), _px(sc.image_transform(4, img)))


def test_numpy_indices_match_python_ints(ds):
    # loaders hand out numpy integers; the 64-bit hash must accept them and give the same pixels
    img = _noise()
    sc = apply_shortcuts("unique", ds, seed=0)
    assert np.array_equal(_px(sc.image_transform(np.int64(7), img)), _px(sc.image_transform(7, img)))
    assert sc.number(np.int64(7)) == sc.number(7)


def test_transform_pickles(ds):
    for setting in ("unique", "image_only", "bits:5"):
        sc = apply_shortcuts(setting, ds, seed=4)
        t2 = pickle.loads(pickle.dumps(sc.image_transform))
        img = _noise(seed=2)
        assert np.array_equal(_px(t2(11, img)), _px(sc.image_transform(11, img)))


# ------------------------------------------------------------------------------------------------
# numbers and ids
# ------------------------------------------------------------------------------------------------
def test_bits_numbers(ds):
    ev = apply_shortcuts("bits:3", ds, seed=0, evaluation=True)
    assert [ev.number(i) for i in range(N_IMAGES)] == [i % 8 for i in range(N_IMAGES)]
    tr = apply_shortcuts("bits:3", ds, seed=0)
    nums = [tr.number(i) for i in range(N_IMAGES)]
    assert all(0 <= n < 8 for n in nums) and len(set(nums)) > 1
    assert nums == [apply_shortcuts("bits:3", ds, seed=0).number(i) for i in range(N_IMAGES)]
    assert nums != [apply_shortcuts("bits:3", ds, seed=1).number(i) for i in range(N_IMAGES)]
    assert nums != [i % 8 for i in range(N_IMAGES)]
    big = apply_shortcuts("bits:19", ds, seed=0)
    assert all(0 <= big.number(i) < 2**19 for i in range(N_IMAGES))
    c = ds.captions[ds.images[10].caption_indices[0]]
    assert tr.caption(c) == caption_with_number(c.raw, tr.number(10))
    assert ev.caption(c) == f"{c.raw} 0 0 0 0 0 2"


def test_unique_numbers_distinct(ds):
    sc = apply_shortcuts("unique", ds)
    nums = [sc.number(im.index) for im in ds.images]
    assert nums == list(range(N_IMAGES))
    with pytest.raises(IndexError):
        sc.number(N_IMAGES)


def test_transform_ids(ds):
    ids = {
        (s, seed, ev): apply_shortcuts(s, ds, seed=seed, evaluation=ev).transform_id
        for s in ("unique", "image_only", "bits:4", "bits:5") for seed in (0, 1) for ev in (False, True)
    }
    assert len(set(ids.values())) == len(ids)
    assert all(i and "sklearn-digits" in i for i in ids.values())
    assert apply_shortcuts("none", ds).transform_id == ""
    assert apply_shortcuts("none", ds).setting == "none"
    assert apply_shortcuts(" BITS:04 ", ds).setting == "bits:4"


def test_mnist_glyph_source(ds, tmp_path: Path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    y = np.arange(30) % 10
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=y)
    sc = apply_shortcuts("unique", ds, glyphs=tmp_path / "mnist.npz")
    assert "mnist:" in sc.transform_id
    assert sc.transform_id != apply_shortcuts("unique", ds).transform_id
    out = sc.image_transform(3, _noise())
    assert out.size == (224, 224)
    with pytest.raises(FileNotFoundError):
        apply_shortcuts("unique", ds, glyphs=tmp_path / "nope.npz")
