"""Towers in the Hugging Face ecosystems: SigLIP (``SiglipModel``) and sentence-transformers text towers.

**SigLIP / SigLIP 2** (fixed resolution; config.json model_type ``siglip``): embeddings are
``normalize(get_image_features(px).pooler_output)`` and ``normalize(get_text_features(ids).pooler_output)``,
with the processor's preprocessing (an exact resize to the model's square, rescale, normalise:
:class:`SquarePreprocess`) and the tokenizer padded to its ``max_length`` as SigLIP was trained (the
text tower pools the last position). Its ``logit_scale`` becomes the fine-tuning temperature (LTD
fine-tunes with the contrastive losses of ``training/losses``, not SigLIP's sigmoid loss).

**sentence-transformers text towers** (modules.json: Transformer → Pooling → Dense… → Normalize;
e.g. clip-ViT-B-32-multilingual-v1, a multilingual encoder distilled into CLIP ViT-B/32's space):
what ``SentenceTransformer.encode`` computes — the transformer's token embeddings pooled (mean, cls or
max over the attention mask), each Dense layer with its activation — normalised. Paired with an
image tower through ``model.clip_text_path`` (``towers.PairedSource``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from training.models.clip import load_clip_weights, load_safetensors
from training.models.clip_files import ClipPreprocess, read_json, read_processor_config, weight_files, weights_digest
from training.models.tower_files import (
    TowerError,
    build_tokenizer_from_files,
    own_fields,
    read_config,
    read_tokenizer_files,
)
from training.models.tower_modules import TowerImageBackbone, TowerTextEncoder

TEXT_MODEL_TYPES = ("bert", "distilbert", "xlm-roberta", "roberta", "mpnet", "camembert", "electra")
ST_TYPES = {"transformer": ("sentence_transformers.models.Transformer", "sentence_transformers.base.modules.transformer.Transformer"),
            "pooling": ("sentence_transformers.models.Pooling",
                        "sentence_transformers.sentence_transformer.modules.pooling.Pooling"),
            "dense": ("sentence_transformers.models.Dense", "sentence_transformers.base.modules.dense.Dense"),
            "normalize": ("sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize.Normalize")}
ACTIVATIONS = {"torch.nn.modules.linear.Identity": nn.Identity, "torch.nn.modules.activation.Tanh": nn.Tanh,
               "torch.nn.modules.activation.ReLU": nn.ReLU, "torch.nn.modules.activation.GELU": nn.GELU}


@dataclass(frozen=True)
class SquarePreprocess(ClipPreprocess):
    """The SigLIP processor's PIL path: resize straight to ``size`` × ``size`` (no crop), then CLIP's
    rescale and normalisation arithmetic."""

    square: bool = True

    def resize_image(self, img: Image.Image) -> Image.Image:
        return img.resize((self.size, self.size), resample=self.resample) if img.size != (self.size, self.size) else img


def read_square_preprocess(folder: Path) -> dict:
    p, _ = read_processor_config(folder)
    size = p.get("size", {})
    h, w = (size.get("height"), size.get("width")) if isinstance(size, dict) else (size, size)
    if not isinstance(h, int) or h != w or p.get("do_center_crop"):
        raise TowerError(f"{folder}/preprocessor_config.json: only a resize to a square (size height = width, no crop) "
                         f"is supported for SigLIP (got {size!r})")
    flags = {k: p.get(k, True) for k in ("do_resize", "do_rescale", "do_normalize")}
    if not all(flags.values()) or abs(float(p.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-12:
        raise TowerError(f"{folder}/preprocessor_config.json: resize, rescale by 1/255 and normalise are required ({flags})")
    mean, std = p.get("image_mean", [0.5] * 3), p.get("image_std", [0.5] * 3)
    return {"resize": h, "size": h, "mean": [float(x) for x in mean], "std": [float(x) for x in std],
            "resample": int(p.get("resample", 2))}


def _tokenize_fn(tokenizer, max_length: int, padding):
    names = [n for n in tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")]

    def tokenize(texts: list[str]) -> dict:
        enc = tokenizer(texts, padding=padding, truncation=True, max_length=max_length, return_tensors="pt")
        return {k: enc[k] for k in names if k in enc}
    return tokenize


class SiglipSource:
    """One SiglipModel built from a folder (or a checkpoint's spec), shared by both towers."""

    def __init__(self, spec: dict, weight_paths: list[Path] | None = None):
        self.spec, self._weights, self._model = spec, weight_paths, None

    @classmethod
    def from_dir(cls, folder: Path) -> SiglipSource:
        config = read_config(folder)
        files = weight_files(folder)
        tok = read_tokenizer_files(folder)
        positions = int((config.get("text_config") or {}).get("max_position_embeddings", 64))
        spec = {"kind": "siglip", "config": config, "tokenizer_files": tok, "preprocess": read_square_preprocess(folder),
                "max_length": positions, "source": str(folder.resolve()), "weights_sha256": weights_digest(files)}
        return cls(spec, files)

    @property
    def embed_dim(self) -> int:
        return int((self.spec["config"].get("text_config") or {}).get("projection_size")
                   or (self.spec["config"].get("text_config") or {}).get("hidden_size", 768))

    def model(self):
        if self._model is None:
            from transformers import SiglipConfig, SiglipModel, SiglipTextConfig, SiglipVisionConfig

            d = self.spec["config"]
            top = {k: v for k, v in own_fields(SiglipConfig, d).items() if k not in ("text_config", "vision_config")}
            try:
                cfg = SiglipConfig(text_config=own_fields(SiglipTextConfig, d.get("text_config")),
                                   vision_config=own_fields(SiglipVisionConfig, d.get("vision_config")), **top)
                model = SiglipModel(cfg).eval()
            except Exception as e:
                raise TowerError(f"SigLIP config of {self.spec.get('source')}: {type(e).__name__}: {str(e)[:200]}") from None
            if self._weights is not None:
                load_clip_weights(model, load_safetensors(self._weights), self.spec.get("source", ""))
            self._model = model
        return self._model

    def image_backbone(self) -> TowerImageBackbone:
        vision = SiglipImage(self.model().vision_model)
        pre = SquarePreprocess.from_spec(self.spec["preprocess"])
        return TowerImageBackbone(vision, pre, self.spec["weights_sha256"][:16], self.embed_dim, "siglip")

    def text_encoder(self, train_layers: int = -1) -> TowerTextEncoder:
        tok = build_tokenizer_from_files(self.spec["tokenizer_files"])
        return TowerTextEncoder(SiglipText(self.model().text_model),
                                _tokenize_fn(tok, int(self.spec["max_length"]), "max_length"), self.embed_dim,
                                train_layers)

    @property
    def logit_scale(self) -> nn.Parameter:
        return self.model().logit_scale


class SiglipImage(nn.Module):
    def __init__(self, vision_model: nn.Module):
        super().__init__()
        self.vision_model = vision_model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision_model(pixel_values=pixel_values).pooler_output


class SiglipText(nn.Module):
    def __init__(self, text_model: nn.Module):
        super().__init__()
        self.text_model = text_model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output


# ---- sentence-transformers text towers ------------------------------------------------------------------
def _st_modules(folder: Path) -> list[tuple[str, Path]]:
    """(role, folder) of each module of a sentence-transformers text model, checked for order and type."""
    mods = read_json(folder / "modules.json")
    roles = []
    for m in mods if isinstance(mods, list) else []:
        role = next((r for r, names in ST_TYPES.items() if m.get("type") in names), None)
        sub = str(m.get("path", ""))
        if role is None:
            raise TowerError(f"{folder}/modules.json: module type {m.get('type')!r} is not one this project rebuilds "
                             "(Transformer, Pooling, Dense, Normalize); no module code from the folder is run")
        if Path(sub).is_absolute() or ".." in Path(sub).parts:
            raise TowerError(f"{folder}/modules.json: module path {sub!r} must lie inside the folder")
        roles.append((role, folder / sub))
    order = [r for r, _ in roles]
    if order[:2] != ["transformer", "pooling"] or any(r not in ("dense", "normalize") for r in order[2:]):
        raise TowerError(f"{folder}/modules.json: expected Transformer, Pooling, then Dense/Normalize modules, got {order}")
    return roles


def _pooling_mode(folder: Path) -> str:
    cfg = read_config(folder)
    modes = [m for m in ("cls", "max", "mean") if cfg.get(f"pooling_mode_{m}_token" if m == "cls" else
                                                      f"pooling_mode_{m}_tokens") or cfg.get("pooling_mode") == m]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and
              k not in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_tokens")]
    if len(modes) != 1 or others:
        raise TowerError(f"{folder}/config.json: one of mean, cls or max pooling is supported (got {cfg})")
    return modes[0]


def _dense(folder: Path) -> tuple[dict, list[Path]]:
    cfg = read_config(folder)
    act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if act not in ACTIVATIONS:
        raise TowerError(f"{folder}/config.json: activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
    spec = {"in": int(cfg["in_features"]), "out": int(cfg["out_features"]), "bias": bool(cfg.get("bias", True)),
            "activation": act}
    return spec, weight_files(folder)


def _max_length(st: dict, tok_files: dict, positions: int) -> int:
    """What SentenceTransformer truncates at: max_seq_length, else the tokenizer's model_max_length,
    never more than the model's positions."""
    cfg = json.loads(tok_files.get("tokenizer_config.json", b"{}") or b"{}")
    n = st.get("max_seq_length") or cfg.get("model_max_length") or positions
    return int(min(n, positions)) if isinstance(n, (int, float)) else positions


class StTextSource:
    """A sentence-transformers text model rebuilt from its modules' configs and safetensors weights."""

    def __init__(self, spec: dict, weights: dict[str, list[Path]] | None = None):
        self.spec, self._weights = spec, weights

    @classmethod
    def from_dir(cls, folder: Path) -> StTextSource:
        mods = _st_modules(folder)
        tf_dir = mods[0][1]
        config = read_config(tf_dir)
        if config.get("model_type") not in TEXT_MODEL_TYPES:
            raise TowerError(f"{tf_dir}/config.json: model_type {config.get('model_type')!r} is not one of "
                             f"{', '.join(TEXT_MODEL_TYPES)}")
        st = read_json(tf_dir / "sentence_bert_config.json") if (tf_dir / "sentence_bert_config.json").is_file() else {}
        dense = [_dense(d) for r, d in mods if r == "dense"]
        weights = {"transformer": weight_files(tf_dir), **{f"dense.{i}": w for i, (_, w) in enumerate(dense)}}
        tok_files = read_tokenizer_files(tf_dir)
        spec = {"kind": "st_text", "config": config, "tokenizer_files": tok_files,
                "max_length": _max_length(st, tok_files, int(config.get("max_position_embeddings", 512))),
                "lower_case": bool(st.get("do_lower_case", False)), "pooling": _pooling_mode(mods[1][1]),
                "dense": [d for d, _ in dense], "normalize": any(r == "normalize" for r, _ in mods),
                "source": str(folder.resolve()), "weights_sha256": weights_digest([f for fs in weights.values() for f in fs])}
        return cls(spec, weights)

    @property
    def embed_dim(self) -> int:
        return int(self.spec["dense"][-1]["out"]) if self.spec["dense"] else int(self.spec["config"]["hidden_size"])

    def text_encoder(self, train_layers: int = -1) -> TowerTextEncoder:
        tower = StTextTower(self.spec)
        if self._weights is not None:
            tower.load_folder_weights(self._weights, self.spec["source"])
        tok = build_tokenizer_from_files(self.spec["tokenizer_files"])
        tokenize = _tokenize_fn(tok, int(self.spec["max_length"]), True)
        if self.spec["lower_case"]:
            plain = tokenize

            def tokenize(texts):
                return plain([t.lower() for t in texts])
        return TowerTextEncoder(tower, tokenize, self.embed_dim, train_layers)


class StTextTower(nn.Module):
    """Transformer → pooling over the attention mask → Dense layers (what SentenceTransformer.encode runs)."""

    def __init__(self, spec: dict):
        super().__init__()
        from transformers import AutoModel
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        cfg_cls = CONFIG_MAPPING[spec["config"]["model_type"]]
        try:
            self.transformer = AutoModel.from_config(cfg_cls(**own_fields(cfg_cls, spec["config"])))
        except Exception as e:
            raise TowerError(f"text tower config of {spec.get('source')}: {type(e).__name__}: {str(e)[:200]}") from None
        self.pooling = spec["pooling"]
        self.dense = nn.ModuleList(nn.Sequential(nn.Linear(d["in"], d["out"], bias=d["bias"]), ACTIVATIONS[d["activation"]]())
                                   for d in spec["dense"])

    def load_folder_weights(self, weights: dict[str, list[Path]], source: str) -> None:
        state = load_safetensors(weights["transformer"])
        prefix = getattr(self.transformer, "base_model_prefix", "") + "."
        if prefix != "." and state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
        own = self.transformer.state_dict()
        state.update({k: v for k, v in own.items() if k.startswith("pooler.") and k not in state})  # unused by pooling
        load_clip_weights(self.transformer, state, source)
        for i, layer in enumerate(self.dense):
            d = load_safetensors(weights[f"dense.{i}"])
            layer[0].load_state_dict({k.removeprefix("linear."): v for k, v in d.items()}, strict=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        kw = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        tokens = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **kw)[0]
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        if self.pooling == "cls":
            x = tokens[:, 0]
        elif self.pooling == "max":
            x = tokens.masked_fill(mask == 0, float("-inf")).max(dim=1).values
        else:
            x = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        for layer in self.dense:
            x = layer(x)
        return x


def text_source_from_dir(folder: Path):
    """The text tower of ``model.clip_text_path``: a sentence-transformers text model."""
    if (folder / "modules.json").is_file():
        return StTextSource.from_dir(folder)
    cfg = read_config(folder)
    raise TowerError(f"{folder}: a {cfg.get('model_type')!r} folder is not a text tower this project reads (a "
                     "sentence-transformers text model: modules.json with Transformer, Pooling, Dense); see "
                     "docs/guides/models.md")


def text_source_from_spec(spec: dict):
    if spec.get("kind") == "st_text":
        return StTextSource(spec)
    raise TowerError(f"a checkpoint names a text tower kind {spec.get('kind')!r} that this version does not know")
