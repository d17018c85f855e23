"""A user's CLIP folder (the Hugging Face layout) read as plain data, without ever unpickling anything.

``CLIPModel.save_pretrained`` and the processor's ``save_pretrained`` write::

    config.json                 model_type "clip": text_config, vision_config, projection_dim
    model.safetensors           the weights (or model.safetensors.index.json + shards)
    vocab.json, merges.txt      the byte-level BPE tokenizer (and/or tokenizer.json)
    tokenizer_config.json       special tokens, model_max_length (optional: CLIP's defaults)
    special_tokens_map.json     (optional)
    preprocessor_config.json    resize, centre crop, mean/std

Only JSON, text and safetensors files are read. A folder whose weights exist only as a pickle
(``pytorch_model.bin``, as older hub snapshots ship them) is refused: unpickling a file someone sent
can run code, and ``from_pretrained(use_safetensors=True)`` is not a guarantee (a ``config.json``
naming ``transformers_weights: adapter_model.bin`` makes it ``torch.load`` that file), so this module
reads the folder itself and never calls ``from_pretrained``.

:func:`read_clip_spec` turns the folder into a dict of plain types (the model config, the tokenizer's
vocabulary and merges, the preprocessing) that checkpoints carry, so a CLIP checkpoint rebuilds its
model, tokenizer and preprocessing without the folder. :class:`ClipPreprocess` reproduces
``CLIPImageProcessor``'s PIL path exactly (same resize arithmetic, rescale in float64, normalise in
float32), so a zero-shot index scores what ``CLIPModel.get_image_features`` computes.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from training.data.images import Preprocess
from training.errors import UserValueError
from training.fsio import sha256_file

SAFE_WEIGHTS, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
JSON_LIMIT = 16 << 20  # bytes; config files are kilobytes, a real tokenizer.json ~2 MB
SPECIALS = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>"}


class ClipError(UserValueError):
    """A CLIP folder that cannot be used (missing or unsafe files, an unsupported model)."""


def uses_clip(m: Any) -> bool:
    """Whether a model config takes either tower from ``model.clip_path``."""
    return m.backbone == "clip" or m.text_encoder == "clip"


def is_clip_folder(path: str | Path) -> bool:
    """A folder that says it holds a CLIP (its config.json has model_type "clip")."""
    p = Path(path) / "config.json"
    try:
        return p.is_file() and p.stat().st_size < JSON_LIMIT and json.loads(p.read_text()).get("model_type") == "clip"
    except (OSError, ValueError, AttributeError):
        return False


def check_clip_config(m: Any) -> None:
    """The CLIP settings of a model config that need no file (``ModelConfig``'s validator calls it)."""
    if uses_clip(m) and not m.clip_path:
        raise ValueError("model.backbone=clip / model.text_encoder=clip need model.clip_path=DIR (a CLIP folder "
                         "in the Hugging Face layout: config.json, model.safetensors, tokenizer and preprocessor files)")
    if m.clip_text_path and m.text_encoder != "clip":
        raise ValueError(f"model.clip_text_path={m.clip_text_path!r} needs model.text_encoder=clip")
    if m.clip_path and not uses_clip(m):
        raise ValueError(f"model.clip_path={m.clip_path!r} is set but neither model.backbone nor model.text_encoder "
                         "is clip")
    if m.backbone == "clip" and (m.image_features != "pooled" or m.image_encoder != "head"):
        raise ValueError("model.backbone=clip gives CLIP's projected image embedding: it needs "
                         "model.image_features=pooled and model.image_encoder=head")


def read_json(path: Path, limit: int = JSON_LIMIT) -> Any:
    if path.stat().st_size > limit:
        raise ClipError(f"{path}: {path.stat().st_size:,} bytes is more than a CLIP folder's JSON files hold")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ClipError(f"{path}: not valid JSON ({e})") from None


def weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a CLIP folder (one, or the shards its index names); refuses a folder
    whose weights exist only in a pickle-based format."""
    folder = Path(folder)
    if (folder / SAFE_WEIGHTS).is_file():
        return [folder / SAFE_WEIGHTS]
    if (folder / SAFE_INDEX).is_file():
        names = sorted(set((read_json(folder / SAFE_INDEX).get("weight_map") or {}).values()))
        if not names or any(Path(n).name != n or not n.endswith(".safetensors") for n in names):
            raise ClipError(f"{folder / SAFE_INDEX}: its weight_map must name .safetensors files in the same folder")
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ClipError(f"{folder}: shard {missing[0]} named by {SAFE_INDEX} is missing")
        return [folder / n for n in names]
    pickled = [n for n in PICKLED_WEIGHTS if (folder / n).is_file()]
    if pickled:
        raise ClipError(f"{folder} has its weights only as {pickled[0]}, which is never loaded (unpickling a file can "
                        "run code); convert it once where you trust the file: CLIPModel.from_pretrained(DIR)"
                        ".save_pretrained(DIR) writes model.safetensors")
    raise ClipError(f"{folder}: no {SAFE_WEIGHTS} (or {SAFE_INDEX}); a CLIP folder is what CLIPModel.save_pretrained "
                    "and CLIPProcessor.save_pretrained write")


def weights_digest(files: list[Path]) -> str:
    """sha256 over the weight files (the feature cache and checkpoints name the weights by it)."""
    return hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()


def read_clip_spec(folder: str | Path) -> dict:
    """The folder's model config, tokenizer and preprocessing as plain data (see the module docstring)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ClipError(f"model.clip_path: {folder} is not a folder")
    if not (folder / "config.json").is_file():
        raise ClipError(f"{folder}: no config.json (a CLIP folder is what CLIPModel.save_pretrained writes)")
    config = read_json(folder / "config.json")
    if not isinstance(config, dict) or config.get("model_type") != "clip":
        raise ClipError(f"{folder}/config.json: model_type {config.get('model_type') if isinstance(config, dict) else None!r}"
                        " is not 'clip' (CLIPModel); other image-text models are not supported")
    files = weight_files(folder)
    text_positions = int((config.get("text_config") or {}).get("max_position_embeddings", 77))
    return {"config": config, "tokenizer": read_tokenizer(folder, text_positions),
            "preprocess": read_preprocess(folder), "source": str(folder.resolve()),
            "weights_sha256": weights_digest(files)}


def read_tokenizer(folder: Path, max_positions: int) -> dict:
    """CLIP's byte-level BPE as plain data: ``vocab`` (token → id), ``merges`` ("a b" strings), the
    special tokens and the length captions are truncated to (≤ the text tower's positions)."""
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        vocab = read_json(folder / "vocab.json")
        if (folder / "merges.txt").stat().st_size > JSON_LIMIT:
            raise ClipError(f"{folder / 'merges.txt'}: larger than a CLIP tokenizer's merges")
        lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
        merges = [ln for ln in lines if ln.strip() and not ln.startswith("#version")]
    elif (folder / "tokenizer.json").is_file():
        model = read_json(folder / "tokenizer.json").get("model") or {}
        if model.get("type") != "BPE":
            raise ClipError(f"{folder}/tokenizer.json: a {model.get('type')!r} tokenizer, not CLIP's byte-level BPE")
        vocab, merges = model.get("vocab"), [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    else:
        raise ClipError(f"{folder}: no tokenizer (vocab.json + merges.txt, or tokenizer.json); save it with "
                        "CLIPTokenizer.save_pretrained into the same folder")
    if not isinstance(vocab, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in vocab.items()):
        raise ClipError(f"{folder}: the tokenizer's vocabulary must map tokens to integer ids")
    settings = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            settings.update(read_json(folder / name))
    specials = {k: _token_text(settings.get(k, d)) for k, d in SPECIALS.items()}
    missing = [t for t in specials.values() if t not in vocab]
    if missing:
        raise ClipError(f"{folder}: special token {missing[0]!r} is not in the tokenizer's vocabulary")
    length = settings.get("model_max_length", max_positions)
    length = max_positions if not isinstance(length, int) or length > max_positions else length
    return {"vocab": vocab, "merges": merges, "specials": specials, "max_length": int(length)}


def _token_text(token: Any) -> str:
    return str(token.get("content", "")) if isinstance(token, dict) else str(token)


def read_processor_config(folder: Path) -> tuple[dict, Path]:
    """The image processor's settings: ``preprocessor_config.json``, or the ``image_processor`` entry of
    the ``processor_config.json`` that newer processors (and sentence-transformers) save."""
    path = folder / "preprocessor_config.json"
    if path.is_file():
        p = read_json(path)
    elif (folder / "processor_config.json").is_file():
        path = folder / "processor_config.json"
        p = (read_json(path) or {}).get("image_processor")
    else:
        p = None
    if not isinstance(p, dict):
        raise ClipError(f"{folder}: no preprocessor_config.json; save the image processor into the folder "
                        "(its save_pretrained) so that images are prepared as the model was trained")
    return p, path


def read_preprocess(folder: Path) -> dict:
    """``preprocessor_config.json`` → resize (short side), square centre crop, mean/std, resampling."""
    p, path = read_processor_config(folder)
    size, crop = p.get("size", 224), p.get("crop_size", 224)
    short = size.get("shortest_edge") if isinstance(size, dict) else size
    crop_hw = (crop.get("height"), crop.get("width")) if isinstance(crop, dict) else (crop, crop)
    if not isinstance(short, int) or crop_hw[0] != crop_hw[1] or not isinstance(crop_hw[0], int):
        raise ClipError(f"{path}: only a shortest-edge resize and a square centre crop are supported (got size "
                        f"{size!r}, crop_size {crop!r})")
    if crop_hw[0] > short:
        raise ClipError(f"{path}: a crop ({crop_hw[0]}) larger than the resized short side ({short}) is not supported")
    flags = {k: p.get(k, True) for k in ("do_resize", "do_center_crop", "do_rescale", "do_normalize")}
    if not all(flags.values()) or abs(float(p.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-12:
        raise ClipError(f"{path}: resize, centre crop, rescale by 1/255 and normalise are all required (got {flags})")
    mean, std = p.get("image_mean"), p.get("image_std")
    if not (isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == 3):
        raise ClipError(f"{path}: image_mean and image_std must be three numbers each")
    return {"resize": short, "size": crop_hw[0], "mean": [float(x) for x in mean], "std": [float(x) for x in std],
            "resample": int(p.get("resample", 3))}


@dataclass(frozen=True)
class ClipPreprocess(Preprocess):
    """:class:`Preprocess` with ``CLIPImageProcessor``'s PIL arithmetic: the long side becomes
    ``int(resize · long / short)`` (truncated, not rounded), the resampling filter is the processor's
    (bicubic) without Pillow's reducing gap, pixels are scaled by 1/255 in float64 and then normalised
    in float32. The crop is the same centre crop (top-left at ``(side − size) // 2``)."""

    resample: int = 3

    @classmethod
    def from_spec(cls, p: dict) -> ClipPreprocess:
        return cls(size=p["size"], resize=p["resize"], mean=tuple(p["mean"]), std=tuple(p["std"]), resample=p["resample"])

    def resize_image(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(self.resize * long / short)
        nw, nh = (self.resize, new_long) if w <= h else (new_long, self.resize)
        return img.resize((nw, nh), resample=self.resample) if (nw, nh) != (w, h) else img

    def to_tensor(self, img: Image.Image) -> torch.Tensor:
        arr = (np.asarray(img).astype(np.float64) * (1 / 255)).astype(np.float32)
        arr = (arr - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))
