"""Shared by the benchmark scripts: a small trained checkpoint to embed with (the heads are tiny;
the image backbone is the real EfficientNet-Lite0 at ``image_size``, which dominates the cost)."""
from __future__ import annotations

import os
from pathlib import Path


def tiny_checkpoint(root: Path, *, image_size: int = 224, embed_dim: int = 256) -> Path:
    """Train one epoch of a small GRU model on 60 synthetic scenes; returns its best.pt."""
    os.environ.setdefault("LTD_CACHE_DIR", str(root / "cache"))
    from app.pipeline import train_run
    from training.config import load_config

    sets = ["data.synthetic_images=60", f"model.image_size={image_size}", f"model.embed_dim={embed_dim}",
            "model.text_hidden=64", "model.head_hidden=128", "train.epochs=1", "train.batch_size=32"]
    res = train_run(load_config("synthetic_baseline", sets), root / "run")
    return res.run_dir / "best.pt"


def captions_file(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` random captions, one per line."""
    import numpy as np

    words = "a dog runs on the grass while two children play with a red ball near the water man woman sits".split()
    rng = np.random.default_rng(seed)
    path.write_text("\n".join(" ".join(rng.choice(words, int(rng.integers(6, 14)))) + f" {i}" for i in range(n)))
    return path
