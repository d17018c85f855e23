"""Write tests/fixtures/open_clip_tiny: a tiny random open_clip model in its hub layout and what open_clip
itself computes for it. Run it where open_clip imports (a torch/torchvision pair that match), e.g.

    python3.11 -m venv /work/venv-oc
    /work/venv-oc/bin/pip install torch==2.14.1 torchvision==0.29.1 open_clip_torch safetensors pillow==12.3.0
    /work/venv-oc/bin/python tests/make_open_clip_fixture.py

tests/test_open_clip.py then checks this project's own rebuild of the model (which never imports
open_clip) against ``expected.npz``: open_clip's tokens, preprocessed pixels, ``encode_text`` and
``encode_image`` outputs. Pillow must be the project's pin (12.3.0): resampling differs between
Pillow versions by one intensity level on some pixels."""
from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "fixtures" / "open_clip_tiny"
TEXTS = ["a red circle on the left", "The BIG dog is striped!", "two   green squares, 3 cats", "un cœur rouge à gauche",
         "a " + "very long caption " * 8]
IMAGE_SIZES = [(50, 37), (40, 64), (32, 32), (45, 45), (33, 70)]


def tiny_merges() -> list[str]:
    """Merges that turn each test word into one word-final token, left to right (as tests/tiny_clip.py)."""
    sys.path.insert(0, str(HERE))
    from tiny_clip import WORDS

    merges: list[str] = []
    for w in WORDS:
        parts = list(w[:-1]) + [w[-1] + "</w>"]
        while len(parts) > 1:
            if f"{parts[0]} {parts[1]}" not in merges:
                merges.append(f"{parts[0]} {parts[1]}")
            parts = [parts[0] + parts[1]] + parts[2:]
    return merges


def main() -> None:
    import open_clip
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    OUT.mkdir(parents=True, exist_ok=True)
    merges = tiny_merges()
    with gzip.open(OUT / "bpe_simple_vocab_16e6.txt.gz", "wt", encoding="utf-8") as f:
        f.write("#version: tiny\n" + "\n".join(merges))
    vocab_size = 512 + len(merges) + 2
    cfg = {"embed_dim": 16, "quick_gelu": True,
           "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16,
                          "ls_init_value": 0.5},
           "text_cfg": {"context_length": 16, "vocab_size": vocab_size, "width": 32, "heads": 2, "layers": 2}}
    pre = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
           "interpolation": "bicubic", "resize_mode": "shortest"}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "tiny-oc.json").write_text(json.dumps(cfg))
        open_clip.add_model_config(d)
        torch.manual_seed(0)
        model = open_clip.create_model("tiny-oc").eval()
    with torch.no_grad():  # away from the initial values, so that every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        model.logit_scale.fill_(2.5)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, OUT / "open_clip_model.safetensors")
    (OUT / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": pre}, indent=2))
    rng = np.random.default_rng(0)
    images = []
    for i, (w, h) in enumerate(IMAGE_SIZES):
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(OUT / f"image{i}.png")
        images.append(Image.open(OUT / f"image{i}.png").convert("RGB"))
    tok = open_clip.tokenizer.SimpleTokenizer(bpe_path=str(OUT / "bpe_simple_vocab_16e6.txt.gz"), context_length=16)
    transform = open_clip.image_transform(32, is_train=False, mean=pre["mean"], std=pre["std"], resize_mode="shortest",
                                          interpolation="bicubic")
    tokens = tok(TEXTS)
    pixels = torch.stack([transform(im) for im in images])
    with torch.no_grad():
        text = model.encode_text(tokens, normalize=True)
        image = model.encode_image(pixels, normalize=True)
    np.savez(OUT / "expected.npz", tokens=tokens.numpy(), pixels=pixels.numpy(), text=text.numpy(), image=image.numpy())
    (OUT / "texts.json").write_text(json.dumps({"texts": TEXTS, "open_clip": open_clip.__version__,
                                                "torch": torch.__version__, "pillow": Image.__version__}, ensure_ascii=False, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
