"""open_clip's CLIP (ViT image tower, transformer text tower) rebuilt from its config and state dict,
without importing open_clip (which imports torchvision; torchvision does not import beside the torch
pinned here). Checked against open_clip's own ``encode_image``/``encode_text`` and preprocessing
(``tests/fixtures/open_clip_tiny``, made with open_clip 3.3 by ``tests/make_open_clip_fixture.py``).

Where the model comes from (``model.clip_path`` / ``ltd index --checkpoint``):

- a folder in open_clip's Hugging Face hub layout: ``open_clip_config.json`` (``model_cfg``,
  ``preprocess_cfg``) and ``open_clip_model.safetensors`` (or ``open_clip_pytorch_model.bin``);
- ``open_clip:MODEL_NAME:CHECKPOINT``: a model name whose config JSON is read from an installed
  ``open_clip_torch`` package (read as a file, never imported; ``pip install --no-deps
  open_clip_torch`` suffices) and a training checkpoint (``epoch_N.pt``) or ``.safetensors``.

Pickled checkpoints load with ``torch.load(weights_only=True)`` (tensors and plain containers only,
as open_clip itself loads them). The tokenizer is open_clip's BPE (:mod:`.open_clip_text`); the
preprocessing its evaluation transform (:class:`OpenClipPreprocess`). Refused: timm and Hugging Face
towers, ModifiedResNet, attentional pooling, custom attention blocks (they need open_clip's code).
"""
from __future__ import annotations

import importlib.util
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file
from torch import nn

from training.data.images import Preprocess
from training.fsio import sha256_file
from training.models.clip_files import read_json
from training.models.open_clip_text import OpenClipTokenizer, read_bpe
from training.models.tower_files import TowerError
from training.models.tower_modules import TowerImageBackbone, TowerTextEncoder

OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
VISION_KEYS = {"layers", "width", "head_width", "mlp_ratio", "patch_size", "image_size", "ls_init_value",
               "patch_dropout", "no_ln_pre", "final_ln_after_pool", "pool_type", "output_tokens", "norm_kwargs",
               "pos_embed_type", "attentional_pool", "block_type"}
TEXT_KEYS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "ls_init_value", "pad_id",
             "eos_id", "no_causal_mask", "final_ln_after_pool", "pool_type", "proj_bias", "proj_type", "output_tokens",
             "norm_kwargs", "embed_cls", "tokenizer_kwargs"}


def _check_cfg(cfg: dict, where: str) -> None:
    v, t = cfg.get("vision_cfg") or {}, cfg.get("text_cfg") or {}
    bad = [f"vision_cfg.{k}" for k in v if k not in VISION_KEYS] + [f"text_cfg.{k}" for k in t if k not in TEXT_KEYS]
    bad += [f"vision_cfg.{k}" for k in ("attentional_pool", "output_tokens") if v.get(k)]
    bad += [f"text_cfg.{k}" for k in ("embed_cls", "output_tokens") if t.get(k)]
    if isinstance(v.get("layers"), (list, tuple)):
        bad.append("vision_cfg.layers (ModifiedResNet)")
    if v.get("pos_embed_type", "learnable") != "learnable" or v.get("block_type") not in (None, "default"):
        bad.append("vision_cfg.pos_embed_type/block_type")
    if v.get("pool_type", "tok") not in ("tok", "avg") or t.get("pool_type", "argmax") not in ("argmax", "first", "last", "eos"):
        bad.append("pool_type")
    if t.get("proj_type", "linear") not in ("linear", "none") or (t.get("tokenizer_kwargs") or {}).get("clean", "lower") != "lower":
        bad.append("text_cfg.proj_type/tokenizer_kwargs")
    if bad:
        raise TowerError(f"{where}: this open_clip architecture needs open_clip's own code ({', '.join(bad[:4])}); only "
                         "ViT image towers with transformer text towers are rebuilt here (docs/guides/models.md)")


def _named_config(name: str) -> dict:
    """``model_configs/NAME.json`` of an installed open_clip_torch, read as a file (not imported)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise TowerError(f"open_clip:{name}: the model's config comes from the open_clip_torch package's files; install "
                         "it (pip install --no-deps open_clip_torch) or use a folder with open_clip_config.json")
    path = Path(list(spec.submodule_search_locations)[0]) / "model_configs" / f"{name}.json"
    if not path.is_file() or "/" in name:
        raise TowerError(f"open_clip:{name}: no such model config in {path.parent}")
    return read_json(path)


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        state = load_file(str(path), device="cpu")
    else:  # tensors and plain containers only: nothing in the file can run
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise TowerError(f"{path}: not a checkpoint that loads as plain tensors ({type(e).__name__}: "
                             f"{str(e)[:160]})") from None
        state = state.get("state_dict", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TowerError(f"{path}: not an open_clip state dict")
    if next(iter(state), "").startswith("module."):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


@dataclass(frozen=True)
class OpenClipPreprocess(Preprocess):
    """open_clip's evaluation transform: Resize(size) of the short side (torchvision's arithmetic:
    ``int(size · long / short)``, PIL's filter without a reducing gap) and CenterCrop (offset
    ``round((side − size) / 2)``), or ``squash`` (resize to size × size); then ToTensor and Normalize."""

    resample: int = 3
    squash: bool = False

    @classmethod
    def from_spec(cls, p: dict) -> OpenClipPreprocess:
        return cls(size=p["size"], resize=p["size"], mean=tuple(p["mean"]), std=tuple(p["std"]),
                   resample=p["resample"], squash=p["squash"])

    def resize_image(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        if self.squash:
            nw = nh = self.size
        else:
            short, long = (w, h) if w <= h else (h, w)
            nw, nh = (self.size, int(self.size * long / short)) if w <= h else (int(self.size * long / short), self.size)
        return img.resize((nw, nh), resample=self.resample) if (nw, nh) != (w, h) else img

    def crops(self, img: Image.Image, n_crops: int = 1) -> list[Image.Image]:
        if n_crops not in (1, 2):
            raise ValueError("open_clip towers take 1 or 2 views")
        img = self.resize_image(img)
        w, h, s = *img.size, self.size
        left, top = int(round((w - s) / 2.0)), int(round((h - s) / 2.0))
        out = [img.crop((left, top, left + s, top + s))]
        return out + [out[0].transpose(Image.FLIP_LEFT_RIGHT)] if n_crops == 2 else out


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class Block(nn.Module):
    """Pre-norm residual attention block (names as open_clip's ResidualAttentionBlock)."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, layer_scale: bool, quick_gelu: bool, eps: float):
        super().__init__()
        hidden = int(width * mlp_ratio)
        self.ln_1, self.ln_2 = nn.LayerNorm(width, eps=eps), nn.LayerNorm(width, eps=eps)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ls_1 = LayerScale(width) if layer_scale else nn.Identity()
        self.ls_2 = LayerScale(width) if layer_scale else nn.Identity()
        self.mlp = nn.Sequential(OrderedDict([("c_fc", nn.Linear(width, hidden)),
                                              ("gelu", QuickGELU() if quick_gelu else nn.GELU()),
                                              ("c_proj", nn.Linear(hidden, width))]))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.ls_1(self.attn(h, h, h, need_weights=False, attn_mask=attn_mask)[0])
        return x + self.ls_2(self.mlp(self.ln_2(x)))


class Stack(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, mlp_ratio: float, layer_scale: bool, quick_gelu: bool,
                 eps: float):
        super().__init__()
        self.resblocks = nn.ModuleList(Block(width, heads, mlp_ratio, layer_scale, quick_gelu, eps) for _ in range(layers))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.resblocks:
            x = block(x, attn_mask)
        return x


class Visual(nn.Module):
    """open_clip's VisionTransformer: patches + class token + positions → blocks → pooled → proj."""

    def __init__(self, v: dict, embed_dim: int, quick_gelu: bool):
        super().__init__()
        width, patch, size = v.get("width", 768), v.get("patch_size", 16), v.get("image_size", 224)
        grid, eps = size // patch, (v.get("norm_kwargs") or {}).get("eps", 1e-5)
        self.pool, self.ln_after_pool = v.get("pool_type", "tok"), bool(v.get("final_ln_after_pool"))
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.zeros(width))
        self.positional_embedding = nn.Parameter(torch.zeros(grid * grid + 1, width))
        self.ln_pre = nn.Identity() if v.get("no_ln_pre") else nn.LayerNorm(width, eps=eps)
        self.transformer = Stack(width, v.get("layers", 12), width // v.get("head_width", 64), v.get("mlp_ratio", 4.0),
                                 v.get("ls_init_value") is not None, quick_gelu, eps)
        self.ln_post = nn.LayerNorm(width, eps=eps)
        self.proj = nn.Parameter(torch.zeros(width, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1).to(x.dtype), x], dim=1)
        x = self.ln_pre(x + self.positional_embedding.to(x.dtype))
        x = self.transformer(x)
        if not self.ln_after_pool:
            x = self.ln_post(x)
        pooled = x[:, 0] if self.pool == "tok" else x[:, 1:].mean(dim=1)
        if self.ln_after_pool:
            pooled = self.ln_post(pooled)
        return pooled @ self.proj


class OpenClipModel(nn.Module):
    """open_clip's ``CLIP`` with the same state-dict names (``visual.*``, the text tower at the top)."""

    def __init__(self, cfg: dict):
        super().__init__()
        t, embed_dim, quick = cfg.get("text_cfg") or {}, int(cfg["embed_dim"]), bool(cfg.get("quick_gelu"))
        width, ctx, eps = t.get("width", 512), t.get("context_length", 77), (t.get("norm_kwargs") or {}).get("eps", 1e-5)
        self.visual = Visual(cfg.get("vision_cfg") or {}, embed_dim, quick)
        self.token_embedding = nn.Embedding(t.get("vocab_size", 49408), width)
        self.positional_embedding = nn.Parameter(torch.zeros(ctx, width))
        self.transformer = Stack(width, t.get("layers", 12), t.get("heads", 8), t.get("mlp_ratio", 4.0),
                                 t.get("ls_init_value") is not None, quick, eps)
        self.ln_final = nn.LayerNorm(width, eps=eps)
        if t.get("proj_type", "linear") == "none":
            self.text_projection = None
        elif t.get("proj_bias"):
            self.text_projection = nn.Linear(width, embed_dim)
        else:
            self.text_projection = nn.Parameter(torch.zeros(width, embed_dim))
        self.logit_scale = nn.Parameter(torch.ones([]))
        self.pool, self.eos_id, self.ln_after_pool = t.get("pool_type", "argmax"), t.get("eos_id", 2), t.get("final_ln_after_pool")
        mask = None if t.get("no_causal_mask") else torch.full((ctx, ctx), float("-inf")).triu_(1)
        self.register_buffer("attn_mask", mask, persistent=False)


class OpenClipText(nn.Module):
    """The text half of an :class:`OpenClipModel` as a tower, sharing its modules (``encode_text``)."""

    def __init__(self, model: OpenClipModel):
        super().__init__()
        self.token_embedding, self.positional_embedding = model.token_embedding, model.positional_embedding
        self.transformer, self.ln_final, self.text_projection = model.transformer, model.ln_final, model.text_projection
        self.pool, self.eos_id, self.ln_after_pool = model.pool, model.eos_id, model.ln_after_pool
        self.register_buffer("attn_mask", model.attn_mask, persistent=False)

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(text) + self.positional_embedding
        x = self.transformer(x, self.attn_mask)
        if not self.ln_after_pool:
            x = self.ln_final(x)
        rows = torch.arange(x.shape[0], device=x.device)
        at = {"argmax": lambda: text.argmax(dim=-1), "first": lambda: torch.zeros_like(rows),
              "last": lambda: torch.full_like(rows, x.shape[1] - 1),
              "eos": lambda: (text == self.eos_id).int().argmax(dim=-1)}[self.pool]()
        x = x[rows, at]
        if self.ln_after_pool:
            x = self.ln_final(x)
        if isinstance(self.text_projection, nn.Linear):
            return self.text_projection(x)
        return x if self.text_projection is None else x @ self.text_projection


class OpenClipSource:
    """An open_clip model from a folder or ``open_clip:NAME:CKPT`` (see the module docstring)."""

    def __init__(self, spec: dict, weights: Path | None = None):
        self.spec, self._weights, self._model = spec, weights, None

    @classmethod
    def from_dir(cls, ref: str) -> OpenClipSource:
        if ref.startswith("open_clip:"):
            name, _, ckpt = ref[len("open_clip:"):].partition(":")
            cfg, pre, weights, folder = _named_config(name), {}, Path(ckpt).expanduser(), None
            if not weights.is_file():
                raise TowerError(f"{ref}: checkpoint {weights} not found")
        else:
            folder = Path(ref)
            full = read_json(folder / "open_clip_config.json")
            cfg, pre = full.get("model_cfg") or {}, full.get("preprocess_cfg") or {}
            weights = next((folder / n for n in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
                            if (folder / n).is_file()), None)
            if weights is None:
                raise TowerError(f"{folder}: no open_clip_model.safetensors (or open_clip_pytorch_model.bin)")
        _check_cfg(cfg, ref)
        v = cfg.get("vision_cfg") or {}
        size = pre.get("size", v.get("image_size", 224))
        size = size[0] if isinstance(size, (list, tuple)) else size
        if pre.get("resize_mode", "shortest") not in ("shortest", "squash"):
            raise TowerError(f"{ref}: preprocess resize_mode {pre.get('resize_mode')!r} is not supported")
        spec = {"kind": "open_clip", "model_cfg": cfg, "source": str(Path(ref).resolve()) if folder else ref,
                "preprocess": {"size": int(size), "mean": list(pre.get("mean", OPENAI_MEAN)),
                               "std": list(pre.get("std", OPENAI_STD)), "squash": pre.get("resize_mode") == "squash",
                               "resample": 2 if pre.get("interpolation") == "bilinear" else 3},
                "bpe": read_bpe(folder), "context_length": int((cfg.get("text_cfg") or {}).get("context_length", 77)),
                "weights_sha256": sha256_file(weights)}
        return cls(spec, weights)

    @property
    def embed_dim(self) -> int:
        return int(self.spec["model_cfg"]["embed_dim"])

    def model(self) -> OpenClipModel:
        if self._model is None:
            model = OpenClipModel(self.spec["model_cfg"]).eval()
            if self._weights is not None:
                state = _load_state(self._weights)
                if self.spec["model_cfg"].get("custom_text"):
                    state = {k.removeprefix("text."): v for k, v in state.items()}
                state = {k: v for k, v in state.items() if k not in ("attn_mask", "logit_bias")}
                if "logit_scale" in state:
                    state["logit_scale"] = state["logit_scale"].reshape(())
                own = model.state_dict()
                wrong = sorted(set(own) ^ set(state)) + [k for k in own if k in state and own[k].shape != state[k].shape]
                if wrong:
                    raise TowerError(f"{self._weights}: the weights do not match the model config ({wrong[:3]})")
                model.load_state_dict(state, strict=True)
            self._model = model
        return self._model

    def image_backbone(self) -> TowerImageBackbone:
        return TowerImageBackbone(self.model().visual, OpenClipPreprocess.from_spec(self.spec["preprocess"]),
                                  self.spec["weights_sha256"][:16], self.embed_dim, "open_clip")

    def text_encoder(self, train_layers: int = -1) -> TowerTextEncoder:
        tok = OpenClipTokenizer(self.spec["bpe"], self.spec["context_length"])
        return TowerTextEncoder(OpenClipText(self.model()), lambda texts: {"text": tok(texts)}, self.embed_dim,
                                train_layers)

    @property
    def logit_scale(self) -> nn.Parameter:
        return self.model().logit_scale

