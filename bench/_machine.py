"""Shared by the benchmark scripts: what machine, how loaded, and the FLOP-bound ceiling."""
from __future__ import annotations

import os
import platform
import time


def cpu_model() -> str:
    try:
        return next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    except OSError:
        return platform.processor() or "?"


def load1() -> float:
    """The 1-minute load average (what `uptime` prints first)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def machine_line() -> str:
    import torch

    gpu = ""
    if torch.cuda.is_available():
        gpu = f", GPU {torch.cuda.get_device_name(0)}"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu_model()}, {os.cpu_count()} cores, {mem:.0f} GiB RAM{gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def today() -> str:
    return time.strftime("%Y-%m-%d")


def best_of(fn, repeats: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def matmul_gflops(n: int = 2048, device: str = "cpu", dtype=None) -> float:
    """The best dense matmul rate (GFLOP/s; fp32 unless ``dtype``): the numerator of the FLOP-bound ceiling."""
    import torch

    a, b = (torch.randn(n, n, device=device, dtype=dtype or torch.float32) for _ in range(2))

    def run():
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
    return 2 * n**3 / best_of(run, 5) / 1e9


def effnet_gflops(image_size: int = 224) -> float:
    """EfficientNet-Lite0 GFLOPs per image (torch's FlopCounterMode on the package model)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from training.models.backbones import EfficientNetLite0

    bb = EfficientNetLite0("pooled", image_size)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        bb.net.extract_features(torch.randn(1, 3, image_size, image_size))
    return fc.get_total_flops() / 1e9
