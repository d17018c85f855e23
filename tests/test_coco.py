"""COCO from the official files: several folders merged into one dataset, the standard 5k test split
(with a stand-in id list), provenance, CxC / ECCV positives on it, and an index serving both folders.

The "downloads" are small hand-made COCO-format files with real JPEGs, in the 2014 naming
(``train2014/COCO_train2014_000000000001.jpg``) and the 2017 naming (``val2017/000000000001.jpg``).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.data.coco import CocoPair, KarpathyTest, convert_coco, discover_coco_root
from training.data.karpathy import DatasetError, dataset_info, load_karpathy

WORDS = ["a", "dog", "cat", "red", "car", "runs", "on", "grass", "two", "people", "sit", "bench"]


def write_coco(root: Path, year: str, sizes: dict[str, int], *, caps: int = 5, first_id: int = 1) -> dict[str, list]:
    """root/annotations/captions_{part}{year}.json + root/{part}{year}/ images, official layout.
    Returns {part: [(image id, [annotation ids])]}."""
    rng = np.random.default_rng(int(year))
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    out, img_id, ann_id = {}, first_id, 1000 * first_id
    for part, n in sizes.items():
        folder = root / f"{part}{year}"
        folder.mkdir(parents=True, exist_ok=True)
        images, anns, out[part] = [], [], []
        for _ in range(n):
            name = f"COCO_{part}{year}_{img_id:012d}.jpg" if year == "2014" else f"{img_id:012d}.jpg"
            Image.fromarray((rng.random((32, 40, 3)) * 255).astype(np.uint8)).save(folder / name)
            images.append({"id": img_id, "file_name": name, "width": 40, "height": 32})
            ids = []
            for _ in range(caps + (1 if img_id % 4 == 0 else 0)):  # some images have a 6th caption, as in COCO
                anns.append({"id": ann_id, "image_id": img_id,
                             "caption": " ".join(rng.choice(WORDS, size=int(rng.integers(3, 8)))).capitalize() + "."})
                ids.append(ann_id)
                ann_id += 1
            out[part].append((img_id, ids))
            img_id += 1
        data = {"info": {"year": int(year), "description": f"COCO {year} (hand-made)"}, "images": images,
                "annotations": anns}
        (root / "annotations" / f"captions_{part}{year}.json").write_text(json.dumps(data))
    return out


def stand_in_test_ids(path: Path, images: list[tuple[int, list[int]]]) -> list[int]:
    """A stand-in coco_test_ids.npy: five caption annotation ids per test image, in the listed order."""
    ids = [a for _, anns in images for a in anns[:5]]
    np.save(path, np.array(ids, dtype=np.int64))
    return ids


# ---- merge, filepath, per-file splits ---------------------------------------------------------------------
def test_two_folders_merge_into_one_dataset_2014(tmp_path):
    made = write_coco(tmp_path / "coco", "2014", {"train": 4, "val": 3})
    ann = tmp_path / "coco" / "annotations"
    out = tmp_path / "out" / "coco.json"
    res = convert_coco([CocoPair(ann / "captions_train2014.json", tmp_path / "coco" / "train2014", "train"),
                        CocoPair(ann / "captions_val2014.json", tmp_path / "coco" / "val2014", "test")], out)
    assert res["splits"] == {"train": 4, "test": 3} and res["images_root"] == "../coco"
    raw = json.loads(out.read_text())
    assert {im["filepath"] for im in raw["images"]} == {"train2014", "val2014"}
    ds = load_karpathy(out)
    assert ds.root == (tmp_path / "coco").resolve()
    assert all(im.path.is_file() for im in ds.images)
    assert ds.images[0].path == (tmp_path / "coco" / "train2014" / "COCO_train2014_000000000001.jpg").resolve()
    assert [im.cocoid for im in ds.split("test").images] == [i for i, _ in made["val"]]
    assert [c.annid for c in ds.split("test").captions] == [a for _, anns in made["val"] for a in anns]
    info = dataset_info(ds)
    assert info["split_provenance"]["method"] == "per_file"
    assert len(info["image_folders"]) == 2 and info["captions"] == sum(len(a) for p in made.values() for _, a in p)


def test_append_another_folder_the_issue_command(tmp_path, capsys):
    """The two commands of the issue, which failed with 'cannot append images under val2017', now work."""
    from app.cli import main

    write_coco(tmp_path / "coco", "2017", {"train": 3, "val": 2})
    c, out = tmp_path / "coco", str(tmp_path / "coco.json")
    assert main(["data", "convert-coco", "--captions", str(c / "annotations/captions_train2017.json"),
                 "--images-root", str(c / "train2017"), "--split", "train", "--out", out]) == 0
    assert json.loads(Path(out).read_text())["images_root"] == "coco/train2017"
    assert main(["data", "convert-coco", "--captions", str(c / "annotations/captions_val2017.json"),
                 "--images-root", str(c / "val2017"), "--split", "test", "--out", out, "--append"]) == 0
    raw = json.loads(Path(out).read_text())
    assert raw["images_root"] == "coco" and [im["filepath"] for im in raw["images"]] == ["train2017"] * 3 + ["val2017"] * 2
    assert [im["imgid"] for im in raw["images"]] == list(range(5))  # the first file's ids stay, the new ones continue
    ds = load_karpathy(out)
    assert ds.split_counts() == {"train": 3, "test": 2} and all(im.path.is_file() for im in ds.images)
    assert ds.meta["split_provenance"]["files"] == {str(c / "annotations/captions_train2017.json"): "train",
                                                    str(c / "annotations/captions_val2017.json"): "test"}


def test_pairs_on_the_command_line(tmp_path, capsys):
    from app.cli import main

    write_coco(tmp_path / "coco", "2014", {"train": 3, "val": 2})
    c = tmp_path / "coco"
    args = ["data", "convert-coco", "--captions", str(c / "annotations/captions_train2014.json"), "--images-root",
            str(c / "train2014"), "--split", "train", "--captions", str(c / "annotations/captions_val2014.json"),
            "--images-root", str(c / "val2014"), "--split", "val", "--out", str(tmp_path / "o.json")]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["splits"] == {"train": 3, "val": 2}
    assert main(args[:-2] + ["--split", "test", "--out", str(tmp_path / "p.json")]) == 2  # 3 splits for 2 files
    assert "3 --split values for 2 captions files" in capsys.readouterr().err


# ---- the standard test split ---------------------------------------------------------------------------
def _karpathy_2017(tmp_path, capsys, *extra):
    """A 2017-style download whose stand-in test images lie in both folders, converted by --coco-root."""
    from app.cli import main

    made = write_coco(tmp_path / "coco", "2017", {"train": 10, "val": 4})
    test_imgs = [made["val"][2], made["train"][1], made["val"][0], made["train"][7]]  # the id list's order
    ids = stand_in_test_ids(tmp_path / "test_ids.npy", test_imgs)
    out = tmp_path / "coco.json"
    assert main(["data", "convert-coco", "--coco-root", str(tmp_path / "coco"), "--karpathy-test",
                 str(tmp_path / "test_ids.npy"), "--val-size", "3", "--out", str(out), *extra]) == 0
    capsys.readouterr()
    return made, test_imgs, ids, out


def test_karpathy_test_split_from_an_id_list(tmp_path, capsys):
    from app.cli import main

    made, test_imgs, ids, out = _karpathy_2017(tmp_path, capsys)
    ds = load_karpathy(out)
    test = ds.split("test")
    assert [im.cocoid for im in test.images] == [i for i, _ in test_imgs]  # the list's order (COCO 1k folds)
    assert [c.annid for c in test.captions] == ids  # exactly the listed captions (6th captions left out)
    assert {im.path.parent.name for im in test.images} == {"train2017", "val2017"}
    assert ds.split_counts() == {"test": 4, "val": 3, "train": 7}
    others = {i for p in made.values() for i, _ in p} - {i for i, _ in test_imgs}
    assert {im.cocoid for im in ds.images if im.split != "test"} == others
    n_train_caps = sum(len(a) for p in made.values() for i, a in p if i in {im.cocoid for im in ds.split("train").images})
    assert len(ds.split("train").captions) == n_train_caps  # train keeps every caption
    prov = ds.meta["split_provenance"]
    assert prov["method"] == "karpathy_test" and "NOT Karpathy's" in prov["val"] and prov["val_seed"] == 0
    assert "1 further captions" in prov["test"]  # image 8 of train2017 had a 6th caption
    assert not prov["test"].startswith("Karpathy")  # a stand-in list is not called Karpathy's split
    # deterministic: the same command gives the same file; another seed another val
    first = out.read_text()
    assert main(["data", "convert-coco", "--coco-root", str(tmp_path / "coco"), "--karpathy-test",
                 str(tmp_path / "test_ids.npy"), "--val-size", "3", "--out", str(out)]) == 0
    assert out.read_text() == first
    assert main(["data", "convert-coco", "--coco-root", str(tmp_path / "coco"), "--karpathy-test",
                 str(tmp_path / "test_ids.npy"), "--val-size", "3", "--val-seed", "1", "--out", str(tmp_path / "s1.json")]) == 0
    assert ({im.cocoid for im in load_karpathy(tmp_path / "s1.json").split("val").images}
            != {im.cocoid for im in ds.split("val").images})
    # ltd data info says where the splits came from
    capsys.readouterr()
    assert main(["data", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "splits: karpathy test" in text and "NOT Karpathy's own val" in text and "folders: train2017, val2017" in text


def test_coco_root_defaults_to_the_standard_split_with_the_package_ids(tmp_path, capsys, monkeypatch):
    """--coco-root alone uses --karpathy-test with the ids eccv-caption ships (here a stand-in package dir)."""
    import training.data.coco as coco
    from app.cli import main

    made = write_coco(tmp_path / "coco", "2014", {"train": 5, "val": 4})
    pkg = tmp_path / "eccv_data"
    pkg.mkdir()
    stand_in_test_ids(pkg / "coco_test_ids.npy", made["val"][:2])
    monkeypatch.setattr(coco, "eccv_data_dir", lambda: pkg)
    assert main(["data", "convert-coco", "--coco-root", str(tmp_path / "coco"), "--val-size", "2",
                 "--out", str(tmp_path / "c.json")]) == 0
    assert "using the standard 5k test split" in capsys.readouterr().out
    ds = load_karpathy(tmp_path / "c.json")
    assert [im.cocoid for im in ds.split("test").images] == [i for i, _ in made["val"][:2]]
    assert ds.split_counts() == {"test": 2, "val": 2, "train": 5}
    assert ds.meta["split_provenance"]["test"].startswith("Karpathy's 5k test split (eccv-caption's list)")


def test_the_installed_package_ships_the_5k_test_caption_ids():
    from training.data.coco import default_test_ids, eccv_data_dir

    ids = np.load(default_test_ids())
    orig = json.loads((eccv_data_dir() / "original_caption_to_image.json").read_text())
    images = {orig[str(a)][0] for a in ids}
    assert len(ids) == 25_000 and len(set(ids.tolist())) == 25_000 and len(images) == 5_000


# ---- torn and partial inputs --------------------------------------------------------------------------
def _one_line_error(capsys, argv: list[str], *needles: str) -> None:
    from app.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


def test_torn_and_partial_inputs_give_one_line_errors(tmp_path, capsys):
    made = write_coco(tmp_path / "coco", "2014", {"train": 3, "val": 3})
    write_coco(tmp_path / "c17", "2017", {"val": 2}, first_id=50)
    c, ann = tmp_path / "coco", tmp_path / "coco" / "annotations"
    base = ["data", "convert-coco", "--out", str(tmp_path / "o.json")]
    # a missing image folder
    _one_line_error(capsys, base + ["--captions", str(ann / "captions_val2014.json"), "--images-root", str(c / "nope"),
                                    "--split", "test"], "image folder not found", str(c / "nope"))
    # a captions file for another year than its folder
    _one_line_error(capsys, base + ["--captions", str(tmp_path / "c17/annotations/captions_val2017.json"),
                                    "--images-root", str(c / "val2014"), "--split", "test"],
                    "captions_val2017.json holds COCO 2017 captions", "val2014")
    # a truncated captions file
    torn = tmp_path / "captions_torn.json"
    torn.write_text((ann / "captions_val2014.json").read_text()[:300])
    _one_line_error(capsys, base + ["--captions", str(torn), "--images-root", str(c / "val2014"), "--split", "test"],
                    str(torn), "not valid JSON")
    # a partly unpacked folder
    (c / "val2014" / f"COCO_val2014_{made['val'][1][0]:012d}.jpg").unlink()
    _one_line_error(capsys, base + ["--captions", str(ann / "captions_val2014.json"), "--images-root", str(c / "val2014"),
                                    "--split", "test"], "1 of 3 images", "captions_val2014.json", "missing")
    # --coco-root without the image folder of one captions file
    (c / "val2014").rename(c / "elsewhere")
    _one_line_error(capsys, ["data", "convert-coco", "--coco-root", str(c), "--out", str(tmp_path / "o.json")],
                    "image folder not found", str(c / "val2014"))
    assert not (tmp_path / "o.json").exists()


def test_karpathy_test_needs_every_test_image(tmp_path, capsys):
    made = write_coco(tmp_path / "coco", "2017", {"train": 4, "val": 3})
    stand_in_test_ids(tmp_path / "ids.npy", [made["train"][0], made["val"][0]])
    c = tmp_path / "coco"
    # only the val file: the test images in train2017 are missing
    _one_line_error(capsys, ["data", "convert-coco", "--captions", str(c / "annotations/captions_val2017.json"),
                             "--images-root", str(c / "val2017"), "--karpathy-test", str(tmp_path / "ids.npy"),
                             "--val-size", "1", "--out", str(tmp_path / "o.json")],
                    "5 of the 10 test caption ids", "convert both captions files of one year together")
    with pytest.raises(DatasetError, match="drop --split"):
        convert_coco([CocoPair(c / "annotations/captions_val2017.json", c / "val2017", "test")], tmp_path / "o.json",
                     karpathy_test=KarpathyTest(tmp_path / "ids.npy"))
    with pytest.raises(DatasetError, match="not enough for a val split"):
        convert_coco([CocoPair(c / "annotations/captions_train2017.json", c / "train2017"),
                      CocoPair(c / "annotations/captions_val2017.json", c / "val2017")], tmp_path / "o.json",
                     karpathy_test=KarpathyTest(tmp_path / "ids.npy", val_size=5))
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(DatasetError, match="bad.npy is not a numpy"):
        convert_coco([CocoPair(c / "annotations/captions_val2017.json", c / "val2017")], tmp_path / "o.json",
                     karpathy_test=KarpathyTest(tmp_path / "bad.npy"))
    assert not (tmp_path / "o.json").exists()


def test_years_are_not_mixed(tmp_path):
    write_coco(tmp_path / "coco", "2014", {"train": 2, "val": 2})
    write_coco(tmp_path / "coco", "2017", {"train": 3, "val": 1})  # the same image ids, split differently
    with pytest.raises(DatasetError, match="holds the captions of 2014 and 2017.*--year"):
        discover_coco_root(tmp_path / "coco")
    pairs = discover_coco_root(tmp_path / "coco", "2017")
    assert [p.images_root.name for p in pairs] == ["train2017", "val2017"]
    c = tmp_path / "coco"
    with pytest.raises(DatasetError, match="is in both .*captions_train2014.json and .*captions_train2017.json"):
        convert_coco([CocoPair(c / "annotations/captions_train2014.json", c / "train2014", "train"),
                      CocoPair(c / "annotations/captions_train2017.json", c / "train2017", "train")], tmp_path / "o.json")


@pytest.mark.parametrize("filepath, filename", [("../elsewhere", "a.jpg"), ("/etc", "passwd"), ("ok", "../../a.jpg"),
                                                ("a/../../b", "c.jpg"), ("C:\\\\x", "a.jpg")])
def test_reader_refuses_paths_outside_the_root(tmp_path, filepath, filename):
    p = tmp_path / "d.json"
    p.write_text(json.dumps({"images": [{"filename": filename, "filepath": filepath, "split": "test",
                                         "sentences": [{"raw": "x"}]}]}))
    with pytest.raises(DatasetError, match="must stay inside the images root"):
        load_karpathy(p, check_files=False)


def test_datasets_guide_coco_commands(tmp_path, capsys, monkeypatch):
    """The datasets guide's "COCO from the official files": the download line only fetches (not run here: no
    network in tests), the convert line works on an unpacked download, the demo line parses."""
    import shlex

    import training.data.coco as coco
    from app.cli import main
    from app.cli.parser import build_parser

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "datasets.md").read_text()
    block = guide.split("## COCO from the official files\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    cmds = [shlex.split(ln.split("  #")[0]) for ln in block.splitlines() if ln.startswith("ltd ")]
    assert [c[:3] for c in cmds] == [["ltd", "data", "convert-coco"], ["ltd", "demo", "--dataset"]]
    assert "images.cocodataset.org" in block
    made = write_coco(tmp_path / "coco", "2014", {"train": 4, "val": 3})
    (tmp_path / "pkg").mkdir()
    stand_in_test_ids(tmp_path / "pkg" / "coco_test_ids.npy", made["val"][:1])
    monkeypatch.setattr(coco, "eccv_data_dir", lambda: tmp_path / "pkg")
    monkeypatch.chdir(tmp_path)
    assert main(cmds[0][1:] + ["--val-size", "1"]) == 0
    assert load_karpathy(tmp_path / "coco" / "dataset_coco.json").split_counts() == {"test": 1, "val": 1, "train": 5}
    args = build_parser()[0].parse_args(cmds[1][1:])
    assert args.dataset == "coco/dataset_coco.json" and not args.no_serve
