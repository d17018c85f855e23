"""SigLIP, sentence-transformers CLIP and a sentence-transformers text tower beside a CLIP image tower,
each a tiny random model saved in its ecosystem's layout (tests/tiny_towers.py): zero-shot index →
eval → serve (a text and an image query), embeddings equal to the ecosystem's own forward pass, and
LTD fine-tuning."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from tiny_clip import make_tiny_clip

pytest.importorskip("sentencepiece", reason="SigLIP's tokenizer needs the towers extra (sentencepiece)")
from tiny_towers import SENTENCES, make_tiny_siglip, make_tiny_st_clip, make_tiny_st_text

TINY_RUN = ["data.path=synthetic", "data.synthetic_images=60", "train.batch_size=120", "train.epochs=1",
            "optim.warmup_steps=1", "optim.lr=1e-3", "train.log_every=1", "train.checkpoint_every=0"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("towers")
    clip = make_tiny_clip(root / "clip")
    return {"siglip": make_tiny_siglip(root / "siglip"), "clip": clip, "st_clip": make_tiny_st_clip(clip, root / "st_clip"),
            "st_text": make_tiny_st_text(root / "st_text")}


@pytest.fixture(scope="module")
def scenes():
    from training.prepare import resolve_dataset_path

    return resolve_dataset_path("", synthetic_images=60)


LAYOUTS = {"siglip": ("siglip", None), "st_clip": ("st_clip", None), "paired": ("clip", "st_text")}


@pytest.fixture(scope="module")
def zero_shot(folders, scenes, tmp_path_factory):
    from app.cli import main

    out = {}
    for name, (image, text) in LAYOUTS.items():
        out[name] = tmp_path_factory.mktemp("zs") / name
        args = ["index", "--checkpoint", str(folders[image]), "--dataset", str(scenes), "--split", "test",
                "--out", str(out[name]), "--no-progress"] + (["--text-tower", str(folders[text])] if text else [])
        assert main(args) == 0, name
    return out


def _images(paths):
    from PIL import Image

    return [Image.open(p).convert("RGB") for p in paths]


def reference(name, folders, texts, paths):
    """(image, text) embeddings, normalised, from the ecosystem's own classes and forward pass."""
    f = torch.nn.functional.normalize
    if name == "siglip":
        from transformers import SiglipModel, SiglipTokenizer
        from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

        d = folders["siglip"]
        model = SiglipModel.from_pretrained(d, use_safetensors=True).eval()
        tok, proc = SiglipTokenizer.from_pretrained(d), SiglipImageProcessorPil.from_pretrained(d)
        with torch.no_grad():
            t = model.get_text_features(**tok(list(texts), padding="max_length", truncation=True, return_tensors="pt")).pooler_output
            i = model.get_image_features(**proc(_images(paths), return_tensors="pt")).pooler_output
        return f(i, dim=-1).numpy(), f(t, dim=-1).numpy()
    from sentence_transformers import SentenceTransformer

    image_model = SentenceTransformer(str(folders["st_clip"]), device="cpu")
    text_model = image_model if name == "st_clip" else SentenceTransformer(str(folders["st_text"]), device="cpu")
    i = image_model.encode(_images(paths), convert_to_tensor=True, batch_size=64)
    t = text_model.encode(list(texts), convert_to_tensor=True, batch_size=64)
    return f(i, dim=-1).numpy(), f(t, dim=-1).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_shot_embeddings_are_the_ecosystems_own(name, folders, zero_shot):
    from indexer.index import load_index_dir

    ix = load_index_dir(zero_shot[name])
    ref_img, ref_txt = reference(name, folders, ix.captions.meta["texts"], ix.images.meta["paths"])
    np.testing.assert_allclose(np.asarray(ix.images.vectors), ref_img, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ix.captions.vectors), ref_txt, atol=1e-5)


@pytest.mark.slow
def test_multilingual_queries_embed_as_sentence_transformers_does(folders, zero_shot):
    from sentence_transformers import SentenceTransformer

    from training.checkpoint import model_from_checkpoint

    model = model_from_checkpoint(zero_shot["paired"] / "zero_shot.pt")[0]
    ours = model.embed_texts(SENTENCES).numpy()
    ref = SentenceTransformer(str(folders["st_text"]), device="cpu").encode(SENTENCES, normalize_embeddings=True)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_shot_evaluates_and_serves(name, zero_shot):
    from fastapi.testclient import TestClient
    from PIL import Image

    from app.api.main import create_app
    from app.api.settings import Settings
    from app.cli import main

    assert main(["eval", "--index", str(zero_shot[name]), "--relevance", "none", "--no-progress"]) == 0
    assert json.loads((zero_shot[name] / "report.json").read_text())["rsum"] > 0
    settings = Settings(models={name: str(zero_shot[name])}, ui=False, load_in_background=False, torch_threads=0,
                        faiss_threads=0)
    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(1).random((40, 60, 3)) * 255).astype(np.uint8)).save(buf, "JPEG")
    with TestClient(create_app(settings)) as client:
        r = client.post("/api/search/text", json={"query": "ein roter Kreis", "model": name, "k": 3})
        assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text
        r = client.post("/api/search/image", files={"file": ("q.jpg", buf.getvalue(), "image/jpeg")},
                        data={"model": name, "k": "3"})
        assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.parametrize("name", ["siglip", "paired"])
def test_ltd_fine_tunes_the_towers(name, folders, zero_shot, tmp_path):
    from app.cli import main
    from training.checkpoint import load_checkpoint, model_from_checkpoint

    image, text = LAYOUTS[name]
    sets = [*TINY_RUN, f"model.clip_path={folders[image]}"] + ([f"model.clip_text_path={folders[text]}"] if text else [])
    assert main(["train", "--config", "f30k_clip_ltd", "--out", str(tmp_path / "run"), "--no-progress",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    ckpt, zs = load_checkpoint(tmp_path / "run" / "best.pt"), load_checkpoint(zero_shot[name] / "zero_shot.pt")
    assert any(k.startswith("decoder.") for k in ckpt["model"])
    moved = [k for k in zs["model"] if k.startswith(("image.", "text.")) and not torch.equal(zs["model"][k], ckpt["model"][k])]
    assert any(k.startswith("image.") for k in moved) and any(k.startswith("text.") for k in moved)
    assert model_from_checkpoint(tmp_path / "run" / "best.pt")[0].embed_texts(["a red circle"]).shape == (1, 32 if name == "siglip" else 16)
