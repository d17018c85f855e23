"""Inference runtimes for the frozen EfficientNet-Lite0 feature extractor (pooled, FNE and grid taps).

The fused torch module (``effnet_fused.py``) is the reference. Other runtimes run the same graph:

- ``torch``: the fused module, channels-last (bf16 autocast on CPUs with native bf16, fp16 on CUDA);
- ``compile``: the fused module through ``torch.compile`` (Inductor; needs a C++ compiler);
- ``onnxruntime`` / ``openvino``: the fused module exported once to ONNX (cached under
  ``CACHE/engines/``, a private folder, keyed by a hash of the fused weights, the tap and the image size,
  and loaded only when its sha256 matches the one recorded at export) and run by
  ONNX Runtime (fp32) or OpenVINO (fp32; bf16 on a CPU with native bf16, as torch's path there — its
  precision hint is always set explicitly). Both are optional extras (``pip install '.[fast]'``).

``auto`` picks, by measurement (BENCHMARKS.md, "Image embedding engines"): on CUDA, ``torch``
(fp16 autocast); on a CPU with native bf16, ``openvino`` in bf16 when installed (1.9× torch's bf16
path on a 2-core Xeon with AMX, at the same bf16-level cosine ≈ 0.996 to fp32), else ``torch``;
otherwise the first of ``openvino``, ``onnxruntime``, ``torch`` that is installed. All fp32 runtimes
agree with the torch reference to cosine ≥ 0.99999 (tests/test_runtimes.py), far below the float16
rounding of the feature cache, so they share its entries: the cache key carries the dtype
(``feature_dtype``), and the two bf16 paths, which differ from each other at bf16 level, each have
their own.
"""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import importlib.util
import logging
import os
import stat
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from training.env import default_cache_dir, environment
from training.errors import UserError
from training.fsio import atomic_path, atomic_write_text, private_folder, sha256_file

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "compile", "onnxruntime", "openvino")
# cosine between any fp32 runtime's features and the torch reference (measured ≥ 0.9999998)
COSINE_TOLERANCE = 0.99999


class RuntimeUnavailable(UserError, RuntimeError):
    """A runtime that was asked for by name but is not installed or cannot run here."""


def installed(name: str) -> bool:
    module = {"onnxruntime": "onnxruntime", "openvino": "openvino"}.get(name)
    if module is None:
        return name in ("torch", "compile")
    return importlib.util.find_spec(module) is not None and importlib.util.find_spec("onnx") is not None


def resolve_runtime(name: str, reduced_precision: bool, *, on_cpu: bool = True) -> str:
    """The runtime ``name`` stands for on the CPU (``on_cpu``) or on a GPU; ``auto`` → the fastest
    installed (module doc)."""
    if name not in RUNTIMES:
        raise RuntimeUnavailable(f"unknown image runtime {name!r}; choose one of: {', '.join(RUNTIMES)}")
    if name == "auto":
        if not on_cpu:
            return "torch"
        if reduced_precision:
            return "openvino" if installed("openvino") else "torch"
        return next(r for r in ("openvino", "onnxruntime", "torch") if installed(r))
    if name in ("onnxruntime", "openvino"):
        if not on_cpu:
            raise RuntimeUnavailable(f"runtime {name} runs on the CPU only; use --runtime torch on a GPU")
        if not installed(name):
            raise RuntimeUnavailable(f"runtime {name} is not installed: pip install 'ltd-retrieval[fast]'")
    return name


class Tap(nn.Module):
    """The fused network with one output: ``pooled``, ``fne`` (all taps) or ``grid``."""

    def __init__(self, fused: nn.Module, features: str):
        super().__init__()
        self.fused, self.features = fused, features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.fused
        return {"fne": f.forward_all, "grid": f.forward_grid}.get(self.features, f.forward)(x)


def weights_digest(module: nn.Module) -> str:
    """sha256 over the module's tensors: a fine-tuned backbone never reuses another's export."""
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def export_onnx(tap: Tap, image_size: int, cache_dir: str | Path = "") -> Path:
    """The tap exported to ONNX (batch dimension dynamic), written once, atomically, into the cache."""
    x = torch.zeros(1, 3, image_size, image_size)
    return onnx_once(f"effnet_{tap.features}_{image_size}_{weights_digest(tap)}", tap.eval(), (x,), ["x"],
                     {"x": {0: "batch"}, "y": {0: "batch"}}, cache_dir, "the image encoder")


def onnx_once(key: str, module: nn.Module, args: tuple, input_names: list[str], dynamic_axes: dict,
              cache_dir: str | Path, what: str) -> Path:
    """``module`` exported to ``CACHE/engines/KEY_torchVERSION.onnx`` (output "y") unless a verified export
    is there. The folder is private (0700, this user's); each export's sha256 is recorded beside it
    (``.onnx.sha256``) once the file is whole, and a file that is not a regular file of this user or does
    not match its record (planted, swapped, torn) is exported again rather than loaded. Both files are
    written atomically, so a killed export leaves nothing a later run would load."""
    folder = private_folder(default_cache_dir(str(cache_dir)) / "engines")
    path = folder / f"{key}_torch{torch.__version__.split('+')[0]}.onnx"
    record = path.with_name(path.name + ".sha256")
    if _verified(path, record):
        return path
    if path.exists() or record.exists():
        log.warning("engine file %s does not match its recorded digest: exporting %s again", path.name, what)
    log.info("exporting %s to ONNX (%s), once", what, path.name)
    with atomic_path(path) as tmp, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about python ints (fixed paddings, attention masks)
        torch.onnx.export(module, args, str(tmp), input_names=input_names, output_names=["y"],
                          dynamic_axes=dynamic_axes, opset_version=17, dynamo=False)
    atomic_write_text(record, sha256_file(path) + "\n")
    return path


def _verified(path: Path, record: Path) -> bool:
    """``path`` is a regular file (not a link) of this user whose sha256 is the one recorded for it."""
    try:
        st = os.lstat(path)
        expected = record.read_text().strip()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    return hmac.compare_digest(sha256_file(path), expected)


def _threads() -> int:
    return max(1, torch.get_num_threads())


def ort_session(path: Path, *, spinning: bool = True, threads: int = 0):
    """An ONNX Runtime CPU session with ``threads`` (0: torch's thread count); ``spinning=False``: no
    busy-waiting between calls."""
    import onnxruntime as ort  # lazy: optional extra (.[fast])

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads or _threads(), 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _onnxruntime(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    sess = ort_session(path)
    return lambda x: sess.run(None, {"x": x})[0]


def feature_dtype(runtime: str, bf16_cpu: bool) -> str:
    """What the CPU features of ``runtime`` are computed in, for the feature cache's key: "float32" for
    every fp32 runtime (they agree far below the cache's rounding), "bfloat16" for torch's (and
    torch.compile's) bf16 autocast, "bfloat16-openvino" for OpenVINO's bf16 kernels."""
    if not bf16_cpu or runtime == "onnxruntime":
        return "float32"
    return "bfloat16-openvino" if runtime == "openvino" else "bfloat16"


class _SignalStack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def import_openvino():
    """The ``openvino`` module, imported without its telemetry.

    ``import openvino`` imports its model converter, whose telemetry sends an "import" event to Google
    Analytics at once unless a consent file in ~/intel says no (or ``CI=true``): the project's runs would
    reach an outside host without asking (tests/netguard.py caught a server doing it). With the
    ``openvino_telemetry`` module made unimportable first, OpenVINO uses its own no-op stub; nothing
    else changes. Every import of openvino in the library goes through here."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # None: `import openvino_telemetry` raises ImportError
    import openvino  # lazy: optional extra (.[fast])

    return openvino


def compile_openvino(core, model, config: dict):
    """``core.compile_model(model, "CPU", config)``, with the calling thread's alternate signal stack
    put back afterwards.

    OpenVINO's CPU plugin installs an alternate signal stack of its own when a Core first compiles, and
    when that Core's plugin goes away it frees that stack and reinstates the one it found. With two Cores
    freed in creation order, the second reinstates the first's freed stack; the next signal delivered to
    the thread with a Python handler (a DataLoader worker's SIGCHLD) then kills the process with SIGSEGV
    (tests/test_runtimes.py reproduces it). Putting the caller's stack back at once makes every
    reinstatement point at a stack that is still there."""
    libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None
    before = _SignalStack()
    saved = libc is not None and libc.sigaltstack(None, ctypes.byref(before)) == 0
    try:
        return core.compile_model(model, "CPU", config)
    finally:
        if saved:
            libc.sigaltstack(ctypes.byref(before), None)  # fails (ENOMEM) only if it is now too small: kept then


def _openvino(path: Path, bf16: bool = False, streams: bool = True) -> Callable[[np.ndarray], np.ndarray]:
    ov = import_openvino()
    core = ov.Core()
    compiled = compile_openvino(core, core.read_model(str(path)), {
        "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32", "INFERENCE_NUM_THREADS": _threads(), "PERFORMANCE_HINT": "THROUGHPUT"})
    out = compiled.output(0)
    # THROUGHPUT splits the threads into streams (2 on 2 cores, 1 thread each); one synchronous request
    # uses only one of them. A batch is therefore cut into one slice per stream, run as parallel requests.
    # (``streams=False``: one request, as before; bench/embed_engines.py measures the difference.)
    n_streams = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))) if streams else 1
    local = threading.local()  # infer requests serve one call at a time: a set per thread (the server's pool)

    def run(x: np.ndarray) -> np.ndarray:
        requests = getattr(local, "requests", None)
        if requests is None:
            requests = local.requests = [compiled.create_infer_request() for _ in range(n_streams)]
        parts = np.array_split(x, min(len(requests), max(1, len(x))))
        for request, part in zip(requests, parts):
            request.start_async({0: np.ascontiguousarray(part)})
        results = []
        for request in requests[:len(parts)]:
            request.wait()
            results.append(np.array(request.get_tensor(out).data, copy=True))
        return np.concatenate(results) if len(results) > 1 else results[0]
    return run


class ImageRuntime:
    """Runs one tap of the fused network with one runtime: ``(B, 3, S, S)`` float32 → ``(B, D)`` float32."""

    def __init__(self, name: str, tap: Tap, image_size: int, autocast, cache_dir: str | Path = "",
                 bf16_cpu: bool = False):
        """``tap`` is where it runs for torch (the ONNX runtimes export it and run on the CPU)."""
        self.name, self._autocast = name, autocast
        self._tap = tap
        self._np: Callable[[np.ndarray], np.ndarray] | None = None
        self._compiled = None
        if name in ("onnxruntime", "openvino"):
            path = export_onnx(tap, image_size, cache_dir)
            self._np = _onnxruntime(path) if name == "onnxruntime" else _openvino(path, bf16=bf16_cpu)
        elif name == "compile":
            self._compiled = torch.compile(self._tap, dynamic=False)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self._np is not None:
            x = np.ascontiguousarray(images.detach().cpu().numpy(), dtype=np.float32)
            return torch.from_numpy(self._np(x))
        x = images.contiguous(memory_format=torch.channels_last)
        with self._autocast:
            out = (self._tap if self._compiled is None else self._compiled)(x)
        return out.float()


def requested_runtime(explicit: str | None = None) -> str:
    """``explicit`` if given, else ``LTD_IMAGE_RUNTIME``, else ``auto``."""
    return explicit or environment().image_runtime or "auto"
