"""CLIP's towers as this project's encoders (``model.backbone=clip``, ``model.text_encoder=clip``).

One ``transformers.CLIPModel`` is built per model, from a folder (:meth:`ClipSource.from_dir`: the
config, tokenizer and preprocessing of :mod:`.clip_files`, weights from safetensors) or from a
checkpoint's plain-data copy of the same (:class:`ClipSource` with the spec only; the checkpoint's
state then fills the weights). Its image tower becomes an image backbone, its text tower a caption
encoder, and with both towers its pretrained logit scale becomes the training temperature
(``DualEncoder.logit_scale``: InfoNCE/IFM read ``1/τ = exp(logit_scale)``, clamped at 100 as CLIP
does, and fine-tune it end to end, as the shortcuts paper's CLIP recipe does).

Embeddings are exactly CLIP's: ``normalize(visual_projection(vision_model(x).pooler_output))`` and
``normalize(text_projection(text_model(ids).pooler_output))`` — what ``get_image_features`` /
``get_text_features`` return, normalised — so the joint space is CLIP's ``projection_dim`` and
``model.embed_dim`` is not used (a GRU or sbert tower beside one CLIP tower projects into it).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from training.models.backbones import Backbone
from training.models.clip_files import ClipError, ClipPreprocess, read_clip_spec, weight_files

log = logging.getLogger(__name__)


def resolve_clip_path(path: str) -> Path:
    """``model.clip_path`` with ``$VARS`` and ``~`` expanded (presets use ``${LTD_CLIP_DIR}``)."""
    expanded = os.path.expandvars(os.path.expanduser(path))
    if "$" in expanded:
        raise ClipError(f"model.clip_path={path!r}: environment variable not set (e.g. export "
                        "LTD_CLIP_DIR=/path/to/clip-vit-base-patch32, a CLIP folder in the Hugging Face layout)")
    return Path(expanded)


def load_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """Tensors of safetensors files (a format that holds tensors only: nothing in it can run)."""
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f), device="cpu"))
        except Exception as e:
            raise ClipError(f"{f}: not a readable safetensors file ({type(e).__name__}: {str(e)[:160]})") from None
    return state


class ClipSource:
    """One CLIP: its plain-data spec (checkpoints carry it) and the ``CLIPModel`` built from it once,
    with the folder's weights when it came from a folder; both towers share that model."""

    def __init__(self, spec: dict, weight_paths: list[Path] | None = None):
        self.spec, self._weights, self._model = spec, weight_paths, None

    @classmethod
    def from_dir(cls, path: str | Path) -> ClipSource:
        folder = resolve_clip_path(str(path))
        return cls(read_clip_spec(folder), weight_files(folder))

    @property
    def embed_dim(self) -> int:
        return int(self.spec["config"].get("projection_dim", 512))

    def model(self):
        if self._model is None:
            # lazy: transformers' CLIP classes take ~3 s to import; only CLIP models need them
            from transformers import CLIPModel

            try:
                model = CLIPModel(clip_config(self.spec["config"])).eval()
            except Exception as e:
                raise ClipError(f"CLIP config of {self.spec.get('source')}: {type(e).__name__}: {str(e)[:200]}") from None
            if self._weights is not None:
                load_clip_weights(model, load_safetensors(self._weights), self.spec.get("source", ""))
            self._model = model
        return self._model

    def image_backbone(self) -> ClipImageBackbone:
        m = self.model()
        return ClipImageBackbone(m.vision_model, m.visual_projection, ClipPreprocess.from_spec(self.spec["preprocess"]),
                                 self.spec["weights_sha256"][:16])

    def text_encoder(self, train_layers: int = -1) -> ClipTextEncoder:
        m = self.model()
        return ClipTextEncoder(m.text_model, m.text_projection, self.spec["tokenizer"], train_layers)

    @property
    def logit_scale(self) -> nn.Parameter:
        return self.model().logit_scale


def clip_config(d: dict):
    """``CLIPConfig`` from a config.json's hyperparameters only (the fields CLIP's config classes
    declare), so that nothing else a crafted file sets reaches ``transformers``: no attention
    implementation to fetch from the hub, no remote code, no weights file to load, no dtype."""
    # lazy: transformers' CLIP classes take ~3 s to import; only CLIP models need them
    from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig

    def own(cls, sub: Any) -> dict:
        return {k: v for k, v in (sub if isinstance(sub, dict) else {}).items() if k in cls.__annotations__}

    top = {k: v for k, v in own(CLIPConfig, d).items() if k not in ("text_config", "vision_config")}
    return CLIPConfig(text_config=own(CLIPTextConfig, d.get("text_config")),
                      vision_config=own(CLIPVisionConfig, d.get("vision_config")), **top)


def load_clip_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy a folder's tensors into a freshly built ``CLIPModel``: every parameter must be there with
    its shape (no silently random tower); ``position_ids`` buffers that older exports saved are ignored."""
    own = model.state_dict()
    state = {k: v for k, v in state.items() if not k.endswith("position_ids")}
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    wrong = [k for k in state if k in own and own[k].shape != state[k].shape]
    if missing or extra or wrong:
        raise ClipError(f"{source}: the weights do not match config.json (missing {missing[:2]}, unexpected {extra[:2]}, "
                        f"other shapes {wrong[:2]})")
    model.load_state_dict(state, strict=True)


class ClipImageBackbone(Backbone):
    """CLIP's vision tower and projection as a backbone: ``out_dim`` = CLIP's joint space."""

    rebuildable = False  # its weights travel in checkpoints (there is no package to rebuild them from)
    cache_inference = False  # indexes embed from the files in float32: the feature cache stores float16
    train_augment = False  # fine-tuned on its own preprocessing (the shortcuts paper): no random crops

    def __init__(self, vision: nn.Module, projection: nn.Module, preprocess: ClipPreprocess, weights_id: str):
        super().__init__()
        self.vision, self.projection, self.preprocess = vision, projection, preprocess
        self.name, self.features, self.weights_id = "clip", "pooled", weights_id
        self.out_dim = int(projection.out_features)

    def _use_bf16_cpu(self) -> bool:
        return False  # CLIP's frozen features stay float32 on every CPU

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.projection(self.vision(pixel_values=images).pooler_output)

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> torch.Tensor:
        was = self.training
        self.eval()
        with self._autocast():
            out = self.forward(images)
        self.train(was)
        return out.float()


class NormalizedIdentity(nn.Module):
    """The image "head" of a CLIP tower: CLIP's own projection already maps into the joint space."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)


def build_tokenizer(spec: dict):
    """``CLIPTokenizer`` from the plain data of :func:`.clip_files.read_tokenizer` (no file is read)."""
    # lazy: transformers' CLIP classes take ~3 s to import; only CLIP models need them
    from transformers import CLIPTokenizer

    merges = [tuple(m.split(" ", 1)) for m in spec["merges"]]
    return CLIPTokenizer(vocab=dict(spec["vocab"]), merges=merges, model_max_length=spec["max_length"],
                         **spec["specials"])


class ClipTextEncoder(nn.Module):
    """CLIP's text tower and projection as a caption encoder (``prepare`` tokenises with CLIP's BPE,
    padding with its pad token and truncating at ``max_length`` tokens). ``train_layers`` as
    ``model.sbert_train_layers``: -1 all, 0 frozen, k the top k transformer layers (with the final
    layer norm and the projection)."""

    def __init__(self, text_model: nn.Module, projection: nn.Module, tokenizer_spec: dict, train_layers: int = -1):
        super().__init__()
        self.text_model, self.projection = text_model, projection
        self.tokenizer, self.max_length = build_tokenizer(tokenizer_spec), int(tokenizer_spec["max_length"])
        self.out_dim = int(projection.out_features)
        if train_layers >= 0:
            layers = list(text_model.encoder.layers)
            if train_layers > len(layers):
                raise ClipError(f"model.sbert_train_layers={train_layers} but CLIP's text tower has {len(layers)} layers")
            for p in self.parameters():
                p.requires_grad_(False)
            top = layers[len(layers) - train_layers:] + ([text_model.final_layer_norm, projection] if train_layers else [])
            for p in (p for mod in top for p in mod.parameters()):
                p.requires_grad_(True)

    def prepare(self, texts, train: bool = False, generator: torch.Generator | None = None) -> dict:
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def forward(self, batch: dict) -> torch.Tensor:
        out = self.text_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return F.normalize(self.projection(out.pooler_output), dim=-1)
