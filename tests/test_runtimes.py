"""Inference runtimes of the image encoder: every fp32 runtime gives the torch reference's features
(pooled, FNE and grid) within the stated cosine tolerance, ``auto`` picks by what is installed, a
runtime's export is cached by weights, and the feature cache is shared across fp32 runtimes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from training.features import ExtractionSpec, extract_features, lookup_features
from training.models import runtimes
from training.models.backbones import EfficientNetLite0, cpu_bf16_fast
from training.models.runtimes import COSINE_TOLERANCE, RuntimeUnavailable, resolve_runtime

FAST = [r for r in ("onnxruntime", "openvino") if runtimes.installed(r)]


@pytest.fixture
def fp32(monkeypatch):
    """Compare fp32 runtimes: on a CPU with native bf16 the torch path otherwise runs bf16 autocast."""
    monkeypatch.setenv("LTD_FEATURE_DTYPE", "float32")


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(0)
    return (torch.rand(3, 3, 96, 96, generator=g) * 2 - 1)


def _features(name: str, features: str, x: torch.Tensor) -> torch.Tensor:
    bb = EfficientNetLite0(features, image_size=96)
    bb.set_runtime(name)
    return bb.extract(x)


@pytest.mark.slow
@pytest.mark.skipif(not FAST, reason="neither onnxruntime nor openvino is installed (extra [fast])")
@pytest.mark.parametrize("features", ["pooled", "fne", "grid"])
def test_fast_runtimes_match_the_torch_reference(features, images, fp32):
    ref = _features("torch", features, images)
    for name in FAST:
        out = _features(name, features, images)
        assert out.shape == ref.shape and out.dtype == torch.float32
        cos = torch.nn.functional.cosine_similarity(out, ref, dim=1)
        assert cos.min().item() >= COSINE_TOLERANCE, (name, cos.min().item())
        # far below the float16 rounding of the feature cache (relative step 2**-11 ≈ 4.9e-4)
        assert (out - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item()), name


@pytest.mark.slow
@pytest.mark.skipif("openvino" not in FAST, reason="openvino is not installed (extra [fast])")
def test_openvino_splits_a_batch_across_its_streams_in_order(images, fp32):
    """OpenVINO runs a batch as one slice per stream: rows come back in order, for every batch size
    (a batch smaller than the number of streams included)."""
    bb = EfficientNetLite0("pooled", image_size=96)
    bb.set_runtime("openvino")
    x = torch.cat([images, images.flip(0), images[:1]])   # 7 images: uneven slices
    whole = bb.extract(x)
    one_by_one = torch.cat([bb.extract(x[i:i + 1]) for i in range(len(x))])
    assert whole.shape == (7, one_by_one.shape[1])
    assert torch.allclose(whole, one_by_one, atol=1e-5), (whole - one_by_one).abs().max()
    assert not torch.allclose(whole[0], whole[1])        # distinct rows: an order mix-up would show


def test_auto_picks_the_fastest_installed_runtime(monkeypatch):
    monkeypatch.setattr(runtimes, "installed", lambda n: n in ("torch", "onnxruntime", "openvino"))
    assert resolve_runtime("auto", False) == "openvino"
    monkeypatch.setattr(runtimes, "installed", lambda n: n in ("torch", "onnxruntime"))
    assert resolve_runtime("auto", False) == "onnxruntime"
    monkeypatch.setattr(runtimes, "installed", lambda n: n == "torch")
    assert resolve_runtime("auto", False) == "torch"
    with pytest.raises(RuntimeUnavailable, match="not installed"):
        resolve_runtime("openvino", False)
    # GPUs keep torch's fp16 path; bf16 CPUs run OpenVINO's bf16 kernels when installed, else torch's
    monkeypatch.setattr(runtimes, "installed", lambda n: True)
    assert resolve_runtime("auto", True) == "openvino"
    assert resolve_runtime("auto", False, on_cpu=False) == "torch"
    with pytest.raises(RuntimeUnavailable, match="CPU only"):
        resolve_runtime("openvino", False, on_cpu=False)
    monkeypatch.setattr(runtimes, "installed", lambda n: n in ("torch", "onnxruntime"))
    assert resolve_runtime("auto", True) == "torch"  # ONNX Runtime has no bf16 path here


def test_feature_dtype_keys_each_precision_path_apart():
    from training.models.runtimes import feature_dtype

    assert {feature_dtype(r, False) for r in ("torch", "compile", "onnxruntime", "openvino")} == {"float32"}
    assert feature_dtype("torch", True) == feature_dtype("compile", True) == "bfloat16"  # the keys cached before
    assert feature_dtype("openvino", True) == "bfloat16-openvino" and feature_dtype("onnxruntime", True) == "float32"


@pytest.mark.skipif(not cpu_bf16_fast(), reason="this CPU has no native bf16 (AVX512-BF16 / AMX)")
@pytest.mark.parametrize("name", ["torch", *(["openvino"] if "openvino" in FAST else [])])
def test_bf16_paths_are_close_to_fp32_under_their_own_cache_keys(name, images, monkeypatch):
    """On a CPU with native bf16 both reduced-precision paths (torch autocast, OpenVINO's bf16 kernels)
    stay close to fp32 (bf16 keeps 8 bits of mantissa) and are never mistaken for it in the cache."""
    bb = EfficientNetLite0("pooled", image_size=96)
    bb.set_runtime(name)
    low, low_key = bb.extract(images), bb.cache_key()
    assert bb.image_runtime().name == name
    assert low_key["dtype"] == ("bfloat16-openvino" if name == "openvino" else "bfloat16")
    monkeypatch.setenv("LTD_FEATURE_DTYPE", "float32")
    ref_bb = EfficientNetLite0("pooled", image_size=96)
    ref_bb.set_runtime("torch")
    ref = ref_bb.extract(images)
    assert ref_bb.cache_key()["dtype"] == "float32"
    cos = torch.nn.functional.cosine_similarity(low.float(), ref, dim=1)
    assert cos.min().item() >= 0.99, cos.min().item()


def test_unknown_runtime_is_refused_by_name():
    bb = EfficientNetLite0("pooled", image_size=64)
    with pytest.raises(RuntimeUnavailable, match="unknown image runtime 'tensorrt'"):
        bb.set_runtime("tensorrt")


def test_env_variable_chooses_the_runtime(monkeypatch):
    monkeypatch.setenv("LTD_IMAGE_RUNTIME", "torch")
    bb = EfficientNetLite0("pooled", image_size=64)
    assert bb.runtime == "torch" and bb.image_runtime().name == "torch"


@pytest.mark.slow
@pytest.mark.skipif(not FAST, reason="needs onnxruntime or openvino (extra [fast])")
def test_export_is_cached_and_keyed_by_the_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("LTD_CACHE_DIR", str(tmp_path))
    bb = EfficientNetLite0("pooled", image_size=64)
    tap = runtimes.Tap(bb.fused(), "pooled")
    p1 = runtimes.export_onnx(tap, 64)
    stamp = p1.stat().st_mtime_ns
    assert runtimes.export_onnx(runtimes.Tap(bb.fused(), "pooled"), 64) == p1 and p1.stat().st_mtime_ns == stamp
    with torch.no_grad():
        bb.fused().head.bias.add_(1.0)  # a fine-tuned backbone must not reuse the pretrained export
    assert runtimes.export_onnx(runtimes.Tap(bb.fused(), "pooled"), 64) != p1
    assert runtimes.export_onnx(runtimes.Tap(bb.fused(), "fne"), 64) not in (p1,)
    assert not [p for p in (tmp_path / "engines").iterdir() if p.name.startswith(".")]  # no temporaries left


@pytest.mark.slow
@pytest.mark.skipif(not FAST, reason="needs onnxruntime or openvino (extra [fast])")
def test_feature_cache_is_shared_across_fp32_runtimes(tmp_path, fp32):
    paths = []
    rng = np.random.default_rng(0)
    for i in range(3):
        p = tmp_path / f"im{i}.jpg"
        Image.fromarray((rng.random((80, 100, 3)) * 255).astype(np.uint8)).save(p)
        paths.append(p)
    ref_bb = EfficientNetLite0("pooled", image_size=64)
    ref_bb.set_runtime("torch")
    fast_bb = EfficientNetLite0("pooled", image_size=64)
    fast_bb.set_runtime(FAST[0])
    assert ref_bb.cache_key() == fast_bb.cache_key()
    store = extract_features(fast_bb, paths, cache_dir=tmp_path / "c", spec=ExtractionSpec(workers=0))
    again = lookup_features(ref_bb, paths, cache_dir=tmp_path / "c")
    assert again is not None and again.key == store.key
    fresh = extract_features(ref_bb, paths, cache_dir=tmp_path / "other", spec=ExtractionSpec(workers=0))
    np.testing.assert_allclose(store.tensor().numpy(), fresh.tensor().numpy(), atol=2e-3, rtol=2e-3)


@pytest.mark.slow
@pytest.mark.skipif(not FAST, reason="needs onnxruntime or openvino (extra [fast])")
def test_fast_runtimes_serve_concurrent_callers(images):
    """The server encodes uploads from several threads at once: every caller gets its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    for name in FAST:
        bb = EfficientNetLite0("pooled", image_size=96)
        bb.set_runtime(name)
        want = [bb.extract(images[i : i + 1]) for i in range(3)]
        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(lambda i, bb=bb: bb.extract(images[i % 3 : i % 3 + 1]), range(12)))
        for i, g in enumerate(got):
            torch.testing.assert_close(g, want[i % 3], atol=1e-5, rtol=1e-5)


OPENVINO_TWO_CORES = """
import gc, signal, subprocess, sys
import numpy as np
from training.models.runtimes import compile_openvino, import_openvino
ov = import_openvino()
import openvino.opset13 as ops

def tiny():
    x = ops.parameter([1, 4], np.float32, name="x")
    return ov.Model([ops.relu(x)], [x], "tiny")

first, second = compile_openvino(ov.Core(), tiny(), {}), compile_openvino(ov.Core(), tiny(), {})
del first; gc.collect()   # freed in creation order: the second Core reinstates the first's signal stack
del second; gc.collect()
signal.signal(signal.SIGCHLD, lambda *_: None)  # what a DataLoader with workers installs
for _ in range(3):
    subprocess.run([sys.executable, "-c", "pass"])  # each exit delivers SIGCHLD to this thread
print("alive")
"""


@pytest.mark.slow
@pytest.mark.skipif("openvino" not in FAST, reason="openvino is not installed (extra [fast])")
def test_two_openvino_models_freed_in_order_leave_a_usable_signal_stack():
    """OpenVINO's CPU plugin swaps the thread's alternate signal stack per Core and, freed in creation
    order, reinstates a freed one: the next handled signal was a SIGSEGV that killed the whole test
    run (CI, at the first end-to-end training after a served OpenVINO model). Run for real, in a child."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", OPENVINO_TWO_CORES], cwd=root, capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert res.returncode == 0 and res.stdout.strip() == "alive", (res.returncode, res.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.skipif("openvino" not in FAST, reason="openvino is not installed (extra [fast])")
def test_openvino_is_imported_without_its_telemetry(tmp_path):
    """``import openvino`` sends an "import" event to Google Analytics (its converter's telemetry, on by
    default without a consent file); the library's import does not: in a process under the tests'
    network guard nothing is attempted, and the converter holds OpenVINO's no-op stub."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import netguard

    log = tmp_path / "attempts.log"
    code = ("from training.models.runtimes import import_openvino\nimport_openvino()\n"
            "import openvino.tools.ovc as ovc\nprint(type(ovc.telemetry).__module__)\n")
    env = {**os.environ, **netguard.subprocess_env(log)}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(Path(__file__).resolve().parents[1])])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "openvino.tools.ovc.telemetry_stub" and netguard.attempts(log) == []
