"""CLIP as this project's encoders, with a tiny randomly initialised CLIP saved in the Hugging Face layout
(``tests/tiny_clip.py``): zero-shot index → fine-tune two steps with LTD and with IFM (with and
without shortcuts) → index → serve; CLIP's own features as the reference; unsafe folders refused."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from tiny_clip import make_tiny_clip

TINY_RUN = ["data.path=synthetic", "data.synthetic_images=60", "train.batch_size=120", "train.epochs=1",
            "optim.warmup_steps=1", "optim.lr=1e-3", "train.log_every=1", "train.checkpoint_every=0"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return make_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


@pytest.fixture(scope="module")
def scenes():
    from training.prepare import resolve_dataset_path

    return resolve_dataset_path("", synthetic_images=60)


@pytest.fixture(scope="module")
def zero_shot(clip_dir, scenes, tmp_path_factory):
    from app.cli import main

    out = tmp_path_factory.mktemp("zs") / "index"
    assert main(["index", "--checkpoint", str(clip_dir), "--dataset", str(scenes), "--split", "test", "--out", str(out),
                 "--no-progress"]) == 0
    return out


def clip_reference(clip_dir, texts, paths):
    """CLIP's own normalised features, through transformers' own loading, tokenizer and processor."""
    from PIL import Image
    from transformers import CLIPModel, CLIPTokenizer
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    model = CLIPModel.from_pretrained(clip_dir, use_safetensors=True).eval()  # the test's own folder
    tok, proc = CLIPTokenizer.from_pretrained(clip_dir), CLIPImageProcessorPil.from_pretrained(clip_dir)
    with torch.no_grad():
        t = model.get_text_features(**tok(list(texts), padding=True, return_tensors="pt")).pooler_output
        px = proc([Image.open(p).convert("RGB") for p in paths], return_tensors="pt")["pixel_values"]
        i = model.get_image_features(pixel_values=px).pooler_output
    return (torch.nn.functional.normalize(i, dim=-1).numpy(), torch.nn.functional.normalize(t, dim=-1).numpy())


@pytest.mark.slow
def test_zero_shot_index_scores_what_clip_computes(clip_dir, zero_shot):
    from indexer.index import load_index_dir

    ix = load_index_dir(zero_shot)
    img, txt = np.asarray(ix.images.vectors), np.asarray(ix.captions.vectors)
    ref_img, ref_txt = clip_reference(clip_dir, ix.captions.meta["texts"], ix.images.meta["paths"])
    assert img.shape == ref_img.shape and txt.shape == ref_txt.shape == (len(txt), 16)
    np.testing.assert_allclose(img @ txt.T, ref_img @ ref_txt.T, atol=1e-5)
    np.testing.assert_allclose(img, ref_img, atol=1e-5)
    np.testing.assert_allclose(txt, ref_txt, atol=1e-5)
    assert ix.manifest["checkpoint_relative"] == "zero_shot.pt" and ix.manifest["model"]["embed_dim"] == 16


@pytest.mark.slow
def test_zero_shot_evaluates_and_is_rebuilt_only_when_the_clip_changes(clip_dir, zero_shot, scenes, tmp_path):
    from app.cli import main

    assert main(["eval", "--index", str(zero_shot), "--relevance", "none", "--no-progress"]) == 0
    assert json.loads((zero_shot / "report.json").read_text())["rsum"] > 0
    copy = tmp_path / "index"
    shutil.copytree(zero_shot, copy)
    before = (copy / "zero_shot.pt").stat().st_mtime_ns
    assert main(["index", "--checkpoint", str(clip_dir), "--dataset", str(scenes), "--split", "val", "--out",
                 str(copy), "--overwrite", "--no-progress"]) == 0
    assert (copy / "zero_shot.pt").stat().st_mtime_ns == before  # same CLIP: same checkpoint, same sha256


def test_the_preprocessing_is_the_processors_on_any_shape(clip_dir):
    from PIL import Image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from training.models.clip_files import ClipPreprocess, read_preprocess

    pre, proc = ClipPreprocess.from_spec(read_preprocess(clip_dir)), CLIPImageProcessorPil.from_pretrained(clip_dir)
    rng = np.random.default_rng(0)
    for w, h in ((50, 37), (37, 61), (32, 32), (300, 101)):
        img = Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))
        ref = proc([img], return_tensors="pt")["pixel_values"][0]
        assert torch.equal(pre(img), ref), (w, h)


def test_the_tokenizer_reads_vocab_and_merges_or_tokenizer_json(clip_dir, tmp_path):
    from transformers import CLIPTokenizer

    from training.models.clip import build_tokenizer
    from training.models.clip_files import read_tokenizer

    spec = read_tokenizer(clip_dir, 77)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "vocab.json").write_text(json.dumps(spec["vocab"]))
    (legacy / "merges.txt").write_text("#version: 0.2\n" + "\n".join(spec["merges"]) + "\n")
    assert read_tokenizer(legacy, 77) == spec
    texts = ["A red circle on the left.", "the big dog 0 1 9 9 2 2", "ünïcödé and a very " + "long " * 90 + "caption"]
    ours, theirs = build_tokenizer(spec), CLIPTokenizer.from_pretrained(clip_dir)
    kw = dict(padding=True, truncation=True, max_length=77, return_tensors="pt")
    assert torch.equal(ours(texts, **kw)["input_ids"], theirs(texts, **kw)["input_ids"])


def test_a_pickle_only_folder_is_refused_without_unpickling(tmp_path, scenes, capsys, monkeypatch):
    from app.cli import main

    folder = make_tiny_clip(tmp_path / "old-clip", pickle_only=True)
    capsys.readouterr()  # transformers' own progress bar while the test writes the folder
    calls = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(a) or pytest.fail("torch.load was called"))
    assert main(["index", "--checkpoint", str(folder), "--dataset", str(scenes), "--out", str(tmp_path / "ix"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pytorch_model.bin" in err and "never loaded" in err
    assert main(["train", "--config", "f30k_clip_baseline", "--set", f"model.clip_path={folder}", "--out",
                 str(tmp_path / "run"), "--no-progress", *[a for s in TINY_RUN for a in ("--set", s)]]) == 2
    assert "pytorch_model.bin" in capsys.readouterr().err and not calls
    assert not (tmp_path / "ix").exists() or not any((tmp_path / "ix").iterdir())


@pytest.mark.parametrize("folder_error, message", [
    (lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
    (lambda d: (d / "preprocessor_config.json").unlink(), "no preprocessor_config.json"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64), "not a readable safetensors file"),
    (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "siglip"})), "is not 'clip'"),
])
def test_broken_folders_fail_with_one_line(clip_dir, tmp_path, folder_error, message):
    from training.models.clip import ClipSource
    from training.models.clip_files import ClipError

    d = tmp_path / "c"
    shutil.copytree(clip_dir, d)
    folder_error(d)
    with pytest.raises(ClipError, match=message):
        ClipSource.from_dir(d).model()


def test_only_the_configs_hyperparameters_reach_transformers(clip_dir, tmp_path):
    from training.models.clip import ClipSource

    d = tmp_path / "c"
    shutil.copytree(clip_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    hostile = {"_attn_implementation": "kernels-community/flash-attn", "attn_implementation": "someone/kernel",
               "auto_map": {"AutoModel": "evil.Model"}, "transformers_weights": "adapter_model.bin"}
    cfg.update(hostile)
    cfg["text_config"].update(hostile)
    (d / "config.json").write_text(json.dumps(cfg))
    model = ClipSource.from_dir(d).model()  # builds, with nothing of the above
    for c in (model.config, model.config.text_config):
        assert c._attn_implementation in (None, "eager", "sdpa") and not hasattr(c, "auto_map")
        assert getattr(c, "transformers_weights", None) is None


@pytest.fixture(scope="module")
def fine_tuned(clip_dir, scenes, tmp_path_factory):
    """Two steps of the paper's recipe with LTD and with IFM, without and with unique shortcuts, each
    indexed on test without (and, when trained with them, with) the shortcuts."""
    from app.cli import main

    root, out = tmp_path_factory.mktemp("ft"), {}
    for name, preset, shortcuts in (("ltd", "f30k_clip_ltd", "none"), ("ltd_sc", "f30k_clip_ltd", "unique"),
                                    ("ifm", "f30k_clip_ifm", "none"), ("ifm_sc", "f30k_clip_ifm", "unique")):
        sets = [*TINY_RUN, f"model.clip_path={clip_dir}", f"data.shortcuts={shortcuts}"]
        assert main(["train", "--config", preset, "--out", str(root / name), "--no-progress",
                     *[a for s in sets for a in ("--set", s)]]) == 0
        for sc in {"none", shortcuts}:
            assert main(["index", "--checkpoint", str(root / name / "best.pt"), "--dataset", str(scenes), "--out",
                         str(root / f"{name}_{sc}"), "--shortcuts", sc, "--no-progress"]) == 0
        out[name] = root / name
    return out


def _metrics(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.training
def test_fine_tuning_runs_the_recipe_and_moves_clip(fine_tuned, clip_dir, zero_shot):
    from training.checkpoint import load_checkpoint

    zs = load_checkpoint(zero_shot / "zero_shot.pt")["model"]
    for name, run in fine_tuned.items():
        steps = [r for r in _metrics(run) if r["type"] == "step"]
        assert len(steps) == 2, name  # 240 training captions in batches of 120
        ckpt = load_checkpoint(run / "best.pt")
        assert ckpt["clip"]["weights_sha256"] and ckpt["backbone_trained"] and not ckpt["excluded_prefixes"]
        state = ckpt["model"]
        for key in ("image.backbone.vision.embeddings.patch_embedding.weight", "text.text_model.final_layer_norm.weight",
                    "logit_scale"):  # both towers and the pretrained temperature were fine-tuned
            assert not torch.equal(state[key], zs[key]), (name, key)
        assert steps[0]["tau"] != steps[1]["tau"]  # CLIP's temperature is fine-tuned, and logged
        if name.startswith("ltd"):
            assert "lambda" in steps[0] and any(k.startswith("decoder.") for k in state)
        else:
            assert ckpt["config"]["loss"]["contrastive"] == "ifm"


@pytest.mark.slow
@pytest.mark.training
def test_shortcuts_reach_the_fine_tuned_images(fine_tuned):
    from indexer.index import load_index_dir

    root = fine_tuned["ltd_sc"].parent
    plain, marked = load_index_dir(root / "ltd_sc_none"), load_index_dir(root / "ltd_sc_unique")
    assert plain.manifest["shortcuts"] == "none" and marked.manifest["shortcuts"] == "unique"
    assert not np.allclose(np.asarray(plain.images.vectors), np.asarray(marked.images.vectors), atol=1e-4)


@pytest.mark.slow
@pytest.mark.training
def test_a_clip_checkpoint_does_not_need_its_folder(fine_tuned, clip_dir, tmp_path, zero_shot):
    from training.checkpoint import model_from_checkpoint

    texts = ["a red circle", "two blue squares on the right"]
    before = model_from_checkpoint(fine_tuned["ifm"] / "best.pt")[0].embed_texts(texts)
    moved = tmp_path / "moved"
    shutil.move(str(clip_dir), moved)
    try:
        after = model_from_checkpoint(fine_tuned["ifm"] / "best.pt")[0].embed_texts(texts)
        zs = model_from_checkpoint(zero_shot / "zero_shot.pt")[0]
    finally:
        shutil.move(str(moved), clip_dir)
    assert torch.equal(before, after) and zs.logit_scale is not None


@pytest.mark.slow
@pytest.mark.training
def test_served_side_by_side(zero_shot, fine_tuned):
    from fastapi.testclient import TestClient
    from PIL import Image

    from app.api.main import create_app
    from app.api.settings import Settings

    root = fine_tuned["ltd"].parent
    settings = Settings(models={"zs": str(zero_shot), "ltd": str(root / "ltd_none")}, ui=False, load_in_background=False,
                        torch_threads=0, faiss_threads=0)
    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(1).random((40, 60, 3)) * 255).astype(np.uint8)).save(buf, "JPEG")
    with TestClient(create_app(settings)) as client:
        for model in ("zs", "ltd"):
            r = client.post("/api/search/text", json={"query": "a red circle", "model": model, "k": 3})
            assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text
            r = client.post("/api/search/image", files={"file": ("q.jpg", buf.getvalue(), "image/jpeg")},
                            data={"model": model, "k": "3"})
            assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text


@pytest.mark.slow
@pytest.mark.training
def test_a_clip_judge_scores_captions(fine_tuned, scenes):
    from training.captioning.retrieval_reward import load_judge
    from training.data.karpathy import load_karpathy

    ds = load_karpathy(scenes)
    words = ["<pad>", "a", "red", "circle"]
    judge = load_judge(fine_tuned["ltd"] / "best.pt", ds, words)
    emb = judge.embed_ids(torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    assert emb.shape == (1, 16) and judge.images.shape == (len(ds.images), 16)
    assert torch.isfinite(judge.similarities(emb, torch.arange(4))).all()


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.parametrize("sets", [
    ["model.backbone=clip", "model.text_encoder=gru", "model.freeze_backbone=true"],  # CLIP images, a GRU beside
    ["model.text_encoder=clip", "model.image_head=linear"],  # the packaged CNN beside CLIP's text tower
])
def test_one_clip_tower_beside_another_encoder(clip_dir, tmp_path, sets):
    from app.pipeline import train_run
    from training.checkpoint import model_from_checkpoint
    from training.config import load_config

    cfg = load_config("synthetic_baseline", [*TINY_RUN, "model.image_size=64", "model.text_hidden=32",
                                             "model.head_hidden=64", f"model.clip_path={clip_dir}", *sets])
    res = train_run(cfg, tmp_path / "run")
    model = model_from_checkpoint(res.run_dir / "best.pt")[0]
    assert model.embed_texts(["a red circle"]).shape == (1, 16) and model.logit_scale is None  # CLIP's joint space


def test_fine_tuning_images_are_the_preprocessed_views_with_the_shortcut(clip_dir, scenes):
    """Without augmentation (CLIP), an end-to-end batch holds exactly the views the feature cache and
    the index see, shortcut digits included."""
    from training.data.decode_pool import ImageViews
    from training.data.image_batches import AugmentedImageBatches, EpochPosition
    from training.data.karpathy import load_karpathy
    from training.data.shortcuts import apply_shortcuts
    from training.models.clip_files import ClipPreprocess, read_preprocess

    ds = load_karpathy(scenes)
    pre, sc = ClipPreprocess.from_spec(read_preprocess(clip_dir)), apply_shortcuts("unique", ds, seed=3)
    paths, ids = [im.path for im in ds.images], np.array([5, 17, 42])
    at = EpochPosition(seed=0, epoch=0, skip=0)
    batch = AugmentedImageBatches(paths, pre, [ids], at, augment=False, transform=sc.image_transform)[0]
    views = ImageViews(paths, ids, pre, 1, transform=sc.image_transform)
    assert torch.equal(batch, torch.cat([views[k][1] for k in range(len(ids))]))
    plain = AugmentedImageBatches(paths, pre, [ids], at, augment=False)[0]
    assert not torch.equal(batch, plain)  # the digits are there
