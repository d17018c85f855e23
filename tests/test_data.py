"""Dataset layer: Karpathy reader, validation errors, converters, image loading, vocabulary."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from conftest import flickr8k_json, requires_flickr8k, write_karpathy
from PIL import Image

from training.data.coco import CocoPair, convert_coco
from training.data.convert import convert_flickr
from training.data.images import ImageError, Preprocess, load_image
from training.data.karpathy import DatasetError, dataset_info, load_karpathy, tokenize
from training.data.vocab import Vocab, pad_batch


def test_reader_resolves_images_and_splits(tmp_path):
    p = write_karpathy(tmp_path, 6, splits=["train", "restval", "train", "val", "test", "test"])
    ds = load_karpathy(p)
    assert ds.split_counts() == {"train": 3, "val": 1, "test": 2}  # restval counts as train
    assert all(im.path.is_file() for im in ds.images)
    test = ds.split("test")
    assert len(test.images) == 2 and len(test.captions) == 10
    assert test.caption_to_image.tolist() == [0] * 5 + [1] * 5
    assert [len(c) for c in test.image_to_captions] == [5, 5]
    assert ds.captions[0].tokens == tuple(tokenize(ds.captions[0].raw))


def test_reader_filepath_and_folder_argument(tmp_path):
    p = write_karpathy(tmp_path, 4, filepath="val2014", name="dataset_coco.json")
    ds = load_karpathy(tmp_path)  # a folder with exactly one dataset_*.json
    assert ds.json_path == p and ds.images[0].path == tmp_path / "val2014" / "img000.jpg"


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"images": []}', "empty"),
    ('[1, 2]', "Karpathy format"),
    ('{"images": [{"split": "train", "sentences": []}]}', "missing key 'filename'"),
    ('{"images": [{"filename": "a.jpg", "sentences": []}]}', "missing key 'split'"),
    ('{"images": [{"filename": "a.jpg", "split": "train", "sentences": [{"tokens": []}]}]}', "missing key 'raw'"),
])
def test_reader_clear_errors(tmp_path, content, message):
    p = tmp_path / "dataset_bad.json"
    p.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_karpathy(p, check_files=False)


def test_reader_caption_for_unknown_image(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps({"images": [{"filename": "a.jpg", "imgid": 1, "split": "train",
                                         "sentences": [{"raw": "x", "imgid": 7}]}]}))
    with pytest.raises(DatasetError, match="unknown/other image"):
        load_karpathy(p, check_files=False)


def test_missing_files_reported_and_droppable(tmp_path):
    p = write_karpathy(tmp_path, 6)
    for i in (1, 2, 3):
        (tmp_path / "images" / f"img{i:03d}.jpg").unlink()
    with pytest.raises(DatasetError, match=r"3 of 6 images .* missing.*img001.jpg"):
        load_karpathy(p)
    ds = load_karpathy(p, drop_missing=True)
    assert len(ds.images) == 3 and len(ds.missing) == 3 and len(ds.captions) == 15
    assert dataset_info(ds)["missing_files"] == 3


def test_empty_split_error_names_present_splits(tmp_path):
    p = write_karpathy(tmp_path, 3, splits=["train", "train", "train"])
    with pytest.raises(DatasetError, match=r"split 'test' .* is empty; splits present: train \(3 images\)"):
        load_karpathy(p).split("test")


def test_convert_coco_roundtrip(tmp_path):
    img_root = tmp_path / "coco" / "val2014"
    img_root.mkdir(parents=True)
    for i in (10, 20):
        Image.new("RGB", (32, 32), (i, i, i)).save(img_root / f"COCO_val2014_{i:012d}.jpg")
    ann = {"images": [{"id": 10, "file_name": f"COCO_val2014_{10:012d}.jpg"},
                      {"id": 20, "file_name": f"COCO_val2014_{20:012d}.jpg"},
                      {"id": 30, "file_name": "uncaptioned.jpg"}],
           "annotations": [{"id": 5, "image_id": 10, "caption": "A dog."}, {"id": 3, "image_id": 10, "caption": "A cat "},
                           {"id": 9, "image_id": 20, "caption": "Two cars"}]}
    cf = tmp_path / "captions_val2014.json"
    cf.write_text(json.dumps(ann))
    out = tmp_path / "out" / "dataset_coco.json"
    res = convert_coco([CocoPair(cf, img_root, "test")], out)
    assert res == {"images": 2, "captions": 3, "splits": {"test": 2}, "images_root": "../coco/val2014", "out": str(out)}
    ds = load_karpathy(out)
    assert [im.cocoid for im in ds.images] == [10, 20]
    assert [c.annid for c in ds.captions] == [3, 5, 9]  # sorted by annotation id
    assert ds.captions[0].raw == "A cat" and ds.split_counts() == {"test": 2}
    # --append adds another split; duplicates are refused and nothing is written
    cf2 = tmp_path / "captions_train2014.json"
    Image.new("RGB", (32, 32)).save(img_root / "t.jpg")
    cf2.write_text(json.dumps({"images": [{"id": 99, "file_name": "t.jpg"}],
                               "annotations": [{"id": 1, "image_id": 99, "caption": "x"}]}))
    convert_coco([CocoPair(cf2, img_root, "restval")], out, append=True)
    assert load_karpathy(out).split_counts() == {"test": 2, "train": 1}
    before = out.read_text()
    with pytest.raises(DatasetError, match="already in"):
        convert_coco([CocoPair(cf2, img_root, "train")], out, append=True)
    assert out.read_text() == before


def test_convert_coco_errors(tmp_path):
    cf = tmp_path / "c.json"
    cf.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                              "annotations": [{"id": 1, "image_id": 2, "caption": "x"}]}))
    with pytest.raises(DatasetError, match="unknown images"):
        convert_coco([CocoPair(cf, tmp_path, "train")], tmp_path / "o.json")
    cf.write_text(json.dumps({"annotations": []}))
    with pytest.raises(DatasetError, match="missing 'images'"):
        convert_coco([CocoPair(cf, tmp_path, "train")], tmp_path / "o.json")
    with pytest.raises(DatasetError, match="split must be one of"):
        convert_coco([CocoPair(cf, tmp_path, "holdout")], tmp_path / "o.json")
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("fmt", ["token", "csv"])
def test_convert_flickr(tmp_path, fmt):
    imgs = tmp_path / "Flicker8k_Dataset"
    imgs.mkdir()
    names = ["1000_a.jpg", "1001_b.jpg", "1002_c.jpg"]
    for n in names:
        Image.new("RGB", (20, 20)).save(imgs / n)
    if fmt == "token":
        lines = [f"{n}#{k}\tcaption {k} of {n} ." for n in names for k in range(5)]
        tok = tmp_path / "Flickr8k.token.txt"
        tok.write_text("\n".join(reversed(lines)) + "\n")
    else:
        lines = ["image_name| comment_number| comment"] + [f"{n}| {k}| caption {k} of {n} ." for n in names for k in range(5)]
        tok = tmp_path / "results.csv"
        tok.write_text("\n".join(lines))
    (tmp_path / "train.txt").write_text("1000_a.jpg\n1001_b.jpg\n")
    (tmp_path / "test.txt").write_text("1002_c.jpg\n")
    out = tmp_path / "dataset_flickr8k.json"
    res = convert_flickr(tok, imgs, out, split_files={"train": tmp_path / "train.txt", "test": tmp_path / "test.txt"})
    assert res["splits"] == {"train": 2, "test": 1} and res["unassigned"] == 0
    ds = load_karpathy(out)
    assert [c.raw for c in ds.captions[:2]] == ["caption 0 of 1000_a.jpg .", "caption 1 of 1000_a.jpg ."]
    assert ds.images[2].split == "test"


def test_convert_flickr_bad_line(tmp_path):
    tok = tmp_path / "t.txt"
    tok.write_text("no tab here\n")
    with pytest.raises(DatasetError, match="expected 'FILE#N<TAB>caption'"):
        convert_flickr(tok, tmp_path, tmp_path / "o.json", default_split="train")


def _jpeg_bytes(size=(40, 30), mode="RGB", fmt="JPEG") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128 if mode in ("L", "I;16") else (10, 200, 30)[: len(mode)] if mode != "CMYK" else (0, 0, 0, 0)).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize("mode,fmt", [("L", "PNG"), ("RGBA", "PNG"), ("CMYK", "JPEG"), ("P", "PNG"), ("LA", "PNG"),
                                      ("I;16", "PNG"), ("RGB", "WEBP"), ("1", "BMP")])
def test_load_image_modes_become_rgb(mode, fmt):
    img = Image.new(mode, (16, 12))
    buf = io.BytesIO()
    img.save(buf, fmt)
    out = load_image(buf.getvalue())
    assert out.mode == "RGB" and out.size == (16, 12)


def test_load_image_bad_files(tmp_path):
    with pytest.raises(ImageError, match="not a recognised image"):
        load_image(b"definitely not an image")
    good = _jpeg_bytes((200, 200))
    with pytest.raises(ImageError, match="corrupt or truncated"):
        load_image(good[: len(good) // 2])
    with pytest.raises(ImageError, match="decompression-bomb guard"):
        load_image(_jpeg_bytes((400, 400)), max_pixels=100_000)
    with pytest.raises(ImageError, match="cannot open"):
        load_image(tmp_path / "nope.jpg")
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PDF")
    with pytest.raises(ImageError):
        load_image(buf.getvalue())


def test_preprocess_shapes_and_crops():
    img = Image.fromarray(np.arange(300 * 200 * 3, dtype=np.uint8).reshape(200, 300, 3))
    pre = Preprocess(size=64, resize=64)
    x = pre(img)
    assert x.shape == (3, 64, 64) and -1.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert pre(img, 10).shape == (10, 3, 64, 64)
    two = pre(img, 2)
    assert np.allclose(two[0].numpy()[:, :, ::-1], two[1].numpy())  # second view is the mirror
    with pytest.raises(ValueError):
        pre(img, 3)


def test_vocab_roundtrip_and_specials():
    toks = [tokenize("A dog runs on the grass."), tokenize("A cat sits."), tokenize("a dog")]
    v = Vocab.build(toks, min_count=2)
    assert v.words[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"] and set(v.words[4:]) == {"a", "dog"}
    assert v.words[4] == "a"  # most frequent first
    ids = v.encode_text("A dog flies", add_bos_eos=True)
    assert ids == [v.bos_id, v.index["a"], v.index["dog"], v.unk_id, v.eos_id]
    assert v.decode(ids) == ["a", "dog", "<unk>"]
    assert Vocab.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    with pytest.raises(ValueError):
        Vocab.build(toks, min_count=0)
    batch, lengths = pad_batch([[5, 6, 7], [], [8]])
    assert batch.tolist() == [[5, 6, 7], [0, 0, 0], [8, 0, 0]] and lengths.tolist() == [3, 1, 1]


@pytest.mark.slow
def test_cli_data_info_and_synth_determinism(tmp_path, capsys):
    from app.cli import main

    assert main(["data", "synth", "--out", str(tmp_path / "a"), "--images", "40", "--size", "64"]) == 0
    assert main(["data", "synth", "--out", str(tmp_path / "b"), "--images", "40", "--size", "64"]) == 0
    ja, jb = tmp_path / "a" / "dataset_synthetic.json", tmp_path / "b" / "dataset_synthetic.json"
    assert ja.read_bytes() == jb.read_bytes()
    for f in sorted((tmp_path / "a" / "images").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / "images" / f.name).read_bytes()
    capsys.readouterr()
    assert main(["data", "info", str(ja)]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "test" in out and "missing files: 0" in out
    assert main(["data", "info", str(tmp_path / "nope.json")]) == 2
    assert "dataset file not found" in capsys.readouterr().err


@requires_flickr8k
def test_flickr8k_counts(capsys):
    ds = load_karpathy(flickr8k_json())
    assert ds.split_counts() == {"train": 6000, "val": 1000, "test": 1000}
    assert len(ds.captions) == 40_000 and not ds.missing
    assert all(len(im.caption_indices) == 5 for im in ds.images)
    from app.cli import main

    assert main(["data", "info", str(flickr8k_json())]) == 0
    out = capsys.readouterr().out
    assert "6,000" in out and "40,000" in out
