"""open_clip, rebuilt without importing open_clip (training/models/open_clip_tower.py), against what open_clip
3.3 itself computed for a tiny random model (tests/fixtures/open_clip_tiny, written by
tests/make_open_clip_fixture.py in a venv where open_clip imports): tokens, preprocessed pixels and the
normalised encode_text / encode_image outputs; then zero-shot index → eval → serve and LTD fine-tuning."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "open_clip_tiny"


@pytest.fixture(scope="module")
def expected():
    with np.load(FIXTURE / "expected.npz") as z:
        return {k: z[k] for k in z.files} | json.loads((FIXTURE / "texts.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def source():
    from training.models.open_clip_tower import OpenClipSource

    return OpenClipSource.from_dir(str(FIXTURE))


def _images():
    from training.data.images import load_image

    return [load_image(FIXTURE / f"image{i}.png") for i in range(5)]


def test_tokens_are_open_clips(source, expected):
    from training.models.open_clip_text import OpenClipTokenizer

    tok = OpenClipTokenizer(source.spec["bpe"], 16)
    assert torch.equal(tok(expected["texts"]), torch.from_numpy(expected["tokens"]))


def test_preprocessing_is_open_clips(source, expected):
    pre = source.image_backbone().preprocess
    ours = torch.stack([pre(im) for im in _images()])
    np.testing.assert_allclose(ours.numpy(), expected["pixels"], atol=1e-6)


def test_embeddings_are_open_clips(source, expected):
    img, txt = source.image_backbone(), source.text_encoder()
    with torch.no_grad():
        i = torch.nn.functional.normalize(img(torch.from_numpy(expected["pixels"])), dim=-1)
        t = txt(txt.prepare(expected["texts"]))
    np.testing.assert_allclose(i.numpy(), expected["image"], atol=1e-5)
    np.testing.assert_allclose(t.numpy(), expected["text"], atol=1e-5)
    assert float(source.logit_scale) == pytest.approx(2.5)


def test_a_model_name_with_a_training_checkpoint(tmp_path, expected, monkeypatch):
    """open_clip:NAME:epoch_N.pt: the config comes from an installed open_clip_torch's files (a stand-in
    package here, never imported), the weights from a training checkpoint loaded as plain tensors."""
    import importlib.util
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from training.models.open_clip_tower import OpenClipSource

    pkg = tmp_path / "site" / "open_clip"
    (pkg / "model_configs").mkdir(parents=True)
    (pkg / "model_configs" / "tiny-oc.json").write_text(json.dumps(json.loads((FIXTURE / "open_clip_config.json")
                                                                              .read_text())["model_cfg"]))
    shutil.copy(FIXTURE / "bpe_simple_vocab_16e6.txt.gz", pkg)
    state = {"module." + k: v for k, v in load_file(str(FIXTURE / "open_clip_model.safetensors")).items()}
    torch.save({"epoch": 3, "name": "run", "state_dict": state}, tmp_path / "epoch_3.pt")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: SimpleNamespace(submodule_search_locations=[str(pkg)]) if n == "open_clip" else real(n, *a))
    src = OpenClipSource.from_dir(f"open_clip:tiny-oc:{tmp_path / 'epoch_3.pt'}")
    txt = src.text_encoder()
    with torch.no_grad():
        np.testing.assert_allclose(txt(txt.prepare(expected["texts"])).numpy(), expected["text"], atol=1e-5)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["model_cfg"]["vision_cfg"].update(timm_model_name="vit_small"), "open_clip's own code"),
    (lambda c: c["model_cfg"]["text_cfg"].update(hf_model_name="xlm-roberta-base"), "open_clip's own code"),
    (lambda c: c["model_cfg"]["vision_cfg"].update(layers=[3, 4, 6, 3]), "ModifiedResNet"),
])
def test_architectures_that_need_open_clips_code_are_refused(tmp_path, edit, message):
    from training.models.open_clip_tower import OpenClipSource
    from training.models.tower_files import TowerError

    d = tmp_path / "oc"
    shutil.copytree(FIXTURE, d)
    cfg = json.loads((d / "open_clip_config.json").read_text())
    edit(cfg)
    (d / "open_clip_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TowerError, match=message):
        OpenClipSource.from_dir(str(d))


@pytest.fixture(scope="module")
def zero_shot(tmp_path_factory):
    from app.cli import main
    from training.prepare import resolve_dataset_path

    scenes = resolve_dataset_path("", synthetic_images=60)
    out = tmp_path_factory.mktemp("oc") / "index"
    assert main(["index", "--checkpoint", str(FIXTURE), "--dataset", str(scenes), "--split", "test", "--out", str(out),
                 "--no-progress"]) == 0
    return out


def test_zero_shot_index_evaluates_and_serves(zero_shot, source):
    from fastapi.testclient import TestClient
    from PIL import Image

    from app.api.main import create_app
    from app.api.settings import Settings
    from app.cli import main
    from indexer.index import load_index_dir
    from training.data.images import load_image

    ix = load_index_dir(zero_shot)
    img, txt = source.image_backbone(), source.text_encoder()
    with torch.no_grad():
        px = torch.stack([img.preprocess(load_image(p)) for p in ix.images.meta["paths"]])
        ref_i = torch.nn.functional.normalize(img(px), dim=-1).numpy()
        ref_t = txt(txt.prepare(ix.captions.meta["texts"])).numpy()
    np.testing.assert_allclose(np.asarray(ix.images.vectors), ref_i, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ix.captions.vectors), ref_t, atol=1e-5)
    assert main(["eval", "--index", str(zero_shot), "--relevance", "none", "--no-progress"]) == 0
    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(1).random((40, 60, 3)) * 255).astype(np.uint8)).save(buf, "JPEG")
    settings = Settings(models={"oc": str(zero_shot)}, ui=False, load_in_background=False, torch_threads=0, faiss_threads=0)
    with TestClient(create_app(settings)) as client:
        r = client.post("/api/search/text", json={"query": "a red circle", "model": "oc", "k": 3})
        assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text
        r = client.post("/api/search/image", files={"file": ("q.jpg", buf.getvalue(), "image/jpeg")},
                        data={"model": "oc", "k": "3"})
        assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text


@pytest.mark.slow
@pytest.mark.training
def test_ltd_fine_tunes_open_clip(zero_shot, tmp_path):
    from app.cli import main
    from training.checkpoint import load_checkpoint

    sets = ["data.path=synthetic", "data.synthetic_images=60", "train.batch_size=120", "train.epochs=1",
            "optim.warmup_steps=1", "optim.lr=1e-3", "train.log_every=1", "train.checkpoint_every=0",
            f"model.clip_path={FIXTURE}"]
    assert main(["train", "--config", "f30k_clip_ltd", "--out", str(tmp_path / "run"), "--no-progress",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    ckpt, zs = load_checkpoint(tmp_path / "run" / "best.pt"), load_checkpoint(zero_shot / "zero_shot.pt")
    for key in ("image.backbone.tower.conv1.weight", "text.tower.token_embedding.weight", "logit_scale"):
        assert not torch.equal(ckpt["model"][key], zs["model"][key]), key
