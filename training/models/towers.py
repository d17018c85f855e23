"""Pretrained image–text towers from every ecosystem, behind the interface ``ClipSource`` defined.

``model.backbone=clip`` / ``model.text_encoder=clip`` take their towers from ``model.clip_path``,
which may be any of these local folders (:func:`tower_kind` tells them apart; nothing in a folder
is run, see ``tower_files.py``):

| kind | folder | module |
|---|---|---|
| ``clip`` | Hugging Face ``CLIPModel`` (config.json model_type clip) | ``clip.py`` |
| ``clip`` | sentence-transformers CLIP (modules.json → one CLIP module) | ``clip.py`` |
| ``siglip`` | Hugging Face ``SiglipModel`` (SigLIP, SigLIP 2 fixed resolution) | ``hf_towers.py`` |
| ``open_clip`` | open_clip_config.json + open_clip_model.safetensors / .bin, or ``open_clip:NAME:CKPT`` | ``open_clip_tower.py`` |
| text only | sentence-transformers text model (Transformer, Pooling, Dense) or M-CLIP | ``hf_towers.py`` |

``model.clip_text_path`` replaces the text tower of ``model.clip_path`` with one of another folder
(a multilingual text tower distilled into that CLIP's space, M-CLIP style); the two must share the
joint space's dimension. A source's ``spec`` is plain data that checkpoints carry (``kind`` names
the loader; CLIP's spec has none), so :func:`source_from_spec` rebuilds it without its folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from training.models.backbones import Backbone
from training.models.clip import ClipSource, resolve_clip_path
from training.models.clip_files import JSON_LIMIT, ClipError
from training.models.hf_towers import SiglipSource, text_source_from_dir, text_source_from_spec
from training.models.open_clip_tower import OpenClipSource
from training.models.tower_files import TowerError

ST_CLIP_MODULES = {"sentence_transformers.models.CLIPModel",
                   "sentence_transformers.sentence_transformer.modules.clip_model.CLIPModel",
                   "sentence_transformers.base.modules.transformer.Transformer",
                   "sentence_transformers.models.Transformer"}
ST_NORMALIZE = {"sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize.Normalize"}


def _json(path: Path) -> object:
    try:
        if path.stat().st_size > JSON_LIMIT:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def tower_kind(path: str | Path) -> str | None:
    """Which loader a folder (or ``open_clip:NAME:CKPT``) needs: clip | st_clip | siglip | open_clip |
    st_text | mclip, or None for a folder none of them reads."""
    if str(path).startswith("open_clip:"):
        return "open_clip"
    p = Path(path)
    if not p.is_dir():
        return None
    if (p / "open_clip_config.json").is_file():
        return "open_clip"
    modules = _json(p / "modules.json")
    if isinstance(modules, list) and modules:
        types = [m.get("type") for m in modules if isinstance(m, dict)]
        first = modules[0] if isinstance(modules[0], dict) else {}
        cfg = _json(p / str(first.get("path", "")) / "config.json")
        if types[0] in ST_CLIP_MODULES and isinstance(cfg, dict) and cfg.get("model_type") == "clip" \
                and all(t in ST_NORMALIZE for t in types[1:]):
            return "st_clip"
        return "st_text"
    cfg = _json(p / "config.json")
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    return {"clip": "clip", "siglip": "siglip", "M-CLIP": "mclip"}.get(kind)


def is_tower_folder(path: str | Path) -> bool:
    """A folder (or open_clip reference) whose towers :func:`source_from_dir` can load."""
    return tower_kind(path) in ("clip", "st_clip", "siglip", "open_clip")


def st_clip_folder(folder: Path) -> Path:
    """The CLIP folder inside a sentence-transformers CLIP folder (its module 0's path)."""
    modules = _json(folder / "modules.json")
    sub = str(modules[0].get("path", ""))
    if Path(sub).is_absolute() or ".." in Path(sub).parts:
        raise TowerError(f"{folder}/modules.json: module path {sub!r} must lie inside the folder")
    return folder / sub


def source_from_dir(path: str | Path, text_path: str | Path | None = None):
    """The tower source of a folder, with its text tower replaced by ``text_path``'s when given."""
    folder = resolve_clip_path(str(path)) if not str(path).startswith("open_clip:") else Path(str(path))
    kind = tower_kind(folder)
    if kind == "clip":
        src = ClipSource.from_dir(folder)
    elif kind == "st_clip":
        src = ClipSource.from_dir(st_clip_folder(folder))
    elif kind == "siglip":
        src = SiglipSource.from_dir(folder)
    elif kind == "open_clip":
        src = OpenClipSource.from_dir(str(path))
    elif kind in ("st_text", "mclip"):
        raise TowerError(f"{folder} holds a text tower only; pair it with an image tower: model.clip_path=IMAGE_TOWER "
                         f"and model.clip_text_path={folder} (ltd index --checkpoint IMAGE_TOWER --text-tower {folder})")
    else:
        raise ClipError(f"{folder}: not a tower folder this project reads (a Hugging Face CLIP or SigLIP folder, a "
                        "sentence-transformers CLIP folder, or an open_clip folder with open_clip_config.json); "
                        "see docs/guides/models.md")
    if text_path:
        src = PairedSource(src, text_source_from_dir(resolve_clip_path(str(text_path))))
    return src


def source_from_spec(spec: dict):
    """The source a checkpoint's plain-data spec describes (no folder is read)."""
    kind = spec.get("kind", "clip")
    if kind == "clip":
        return ClipSource(spec)
    if kind == "paired":
        return PairedSource(source_from_spec(spec["image"]), text_source_from_spec(spec["text"]))
    if kind == "siglip":
        return SiglipSource(spec)
    if kind == "open_clip":
        return OpenClipSource(spec)
    raise ClipError(f"a checkpoint names a tower kind {kind!r} that this version does not know")


class PairedSource:
    """The image tower of one source and the text tower of another (a multilingual text tower trained
    into that image tower's space); the image source's temperature is the pair's."""

    def __init__(self, image, text):
        if image.embed_dim != text.embed_dim:
            raise TowerError(f"the text tower embeds into {text.embed_dim} dimensions, the image tower into "
                             f"{image.embed_dim}: they are not one joint space")
        self.image, self.text = image, text
        self.spec = {"kind": "paired", "image": image.spec, "text": text.spec}

    @property
    def embed_dim(self) -> int:
        return self.image.embed_dim

    def image_backbone(self) -> Backbone:
        return self.image.image_backbone()

    def text_encoder(self, train_layers: int = -1) -> nn.Module:
        return self.text.text_encoder(train_layers)

    @property
    def logit_scale(self) -> nn.Parameter:
        return self.image.logit_scale
