"""Training-side throughput on this machine (run on demand, not a test).

    python bench/train_throughput.py [--images 512] [--captions 4000] [--epoch-config flickr8k_ltd] [--write]

Measures:
1. backbone feature extraction (EfficientNet-Lite0): images/s for the package model (fp32) and for
   the fused frozen path the feature cache uses (BN folded, channels-last, bf16 where the CPU has
   native bf16), CNN only and end to end (JPEG decode + preprocessing + CNN through the cache);
   and the FLOP-bound ceiling: model FLOPs per image (torch's FlopCounterMode) against the best
   matrix-multiply rate this CPU reaches in fp32 and bf16;
2. LTD target encoding: captions/s for all-MiniLM-L6-v2 (fp32 and bf16 autocast);
3. seconds per training epoch on Flickr8k train with cached features (needs LTD_DATA_DIR).
With ``--write`` the markdown table replaces the section "## Training throughput" in BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

# OMP_WAIT_POLICY: the default, as `ltd train` runs (app/cli/__init__.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.hf_env import set_hf_environment  # noqa: E402

set_hf_environment()  # before torch and transformers load

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import replace_section  # noqa: E402

SECTION = "## Training throughput (bench/train_throughput.py)"


def best_of(fn, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def matmul_peak(dtype: torch.dtype, n: int = 2048) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    dt = best_of(lambda: a @ b, 5)
    return 2 * n**3 / dt / 1e9


def flops_per_image(model: torch.nn.Module, size: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(torch.randn(1, 3, size, size))
    return fc.get_total_flops()


def bench_backbone(n_images: int, data_dir: str | None) -> dict:
    from training.features import extract_features
    from training.models.backbones import EfficientNetLite0, cpu_bf16_fast

    bb = EfficientNetLite0("pooled", 224)
    x = torch.randn(64, 3, 224, 224)
    with torch.inference_mode():
        pkg = 64 / best_of(lambda: bb.net.extract_features(x).mean((2, 3)), 2)
        fused = 64 / best_of(lambda: bb.extract(x), 3)
    gflops = flops_per_image(lambda t: bb.net.extract_features(t), 224) / 1e9
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)
    out = {"package_fp32_img_s": pkg, "fused_img_s": fused, "fused_dtype": bb.extract_dtype_name(),
           "gflops_per_image": gflops, "matmul_gflops_fp32": peak32, "matmul_gflops_bf16": peak16,
           "ceiling_fp32_img_s": peak32 / gflops, "ceiling_bf16_img_s": peak16 / gflops, "bf16_native": cpu_bf16_fast()}
    if data_dir:
        paths = sorted((Path(data_dir) / "images").glob("*.jpg"))[:n_images]
        with tempfile.TemporaryDirectory() as cache:
            t = time.perf_counter()
            extract_features(bb, paths, cache_dir=cache)
            out["end_to_end_img_s"] = len(paths) / (time.perf_counter() - t)
            out["end_to_end_images"] = len(paths)
    return out


def bench_targets(n: int, data_dir: str | None) -> dict:
    from training.targets import load_sentence_model

    if data_dir:
        d = json.loads((Path(data_dir) / "dataset_flickr8k.json").read_text())
        texts = [s["raw"] for im in d["images"] for s in im["sentences"]][:n]
    else:
        rng = np.random.default_rng(0)
        words = "a dog runs on the grass while two children play with a red ball near the water".split()
        texts = [" ".join(rng.choice(words, rng.integers(6, 16))) for _ in range(n)]
    m = load_sentence_model("")
    res = {}
    for name, ctx in (("fp32", contextlib.nullcontext()), ("bf16", torch.autocast("cpu", dtype=torch.bfloat16))):
        with ctx:
            t = time.perf_counter()
            m.encode(texts, batch_size=64, show_progress_bar=False)
            res[f"captions_s_{name}"] = len(texts) / (time.perf_counter() - t)
    res["captions"] = len(texts)
    return res


def bench_epoch(config: str, data_dir: str, sets: list[str]) -> dict:
    """One epoch of ``config`` on Flickr8k train with cached features; validation timed separately."""
    from app.pipeline import train_run
    from training.config import load_config

    os.environ["LTD_DATA_DIR"] = data_dir
    cfg = load_config(config, ["train.epochs=1", *sets])
    with tempfile.TemporaryDirectory() as tmp:
        train_run(cfg, Path(tmp) / "run")  # warm caches (features, targets) and kernels
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        train_run(cfg, Path(tmp) / "run")
        total = time.perf_counter() - t
        rows = [json.loads(ln) for ln in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    epoch = next(r for r in rows if r["type"] == "epoch")
    steps = sum(1 for r in rows if r["type"] == "step")
    return {"config": config, "sets": sets, "epoch_s": epoch["seconds"], "run_s_incl_2_validations": total,
            "log_rows": steps, "batch_size": cfg.train.batch_size, "text_hidden": cfg.model.text_hidden}


def render(res: dict) -> str:
    b = res["backbone"]
    lines = [SECTION, "",
             f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}`.", "",
             "| measurement | value |", "|---|---:|",
             f"| EfficientNet-Lite0 FLOPs per 224 px image | {b['gflops_per_image']:.2f} GFLOP |",
             f"| best matmul rate fp32 / bf16 (2048², this CPU) | {b['matmul_gflops_fp32']:.0f} / {b['matmul_gflops_bf16']:.0f} GFLOP/s |",
             f"| FLOP-bound ceiling fp32 / bf16 | {b['ceiling_fp32_img_s']:.0f} / {b['ceiling_bf16_img_s']:.0f} img/s |",
             f"| package model, fp32 (CNN only, batch 64) | {b['package_fp32_img_s']:.1f} img/s |",
             f"| fused frozen path, {b['fused_dtype']} (CNN only, batch 64) | {b['fused_img_s']:.1f} img/s |"]
    if "end_to_end_img_s" in b:
        lines.append(f"| feature cache end to end (decode + preprocess + CNN, {b['end_to_end_images']} Flickr8k images) "
                     f"| {b['end_to_end_img_s']:.1f} img/s |")
    t = res["targets"]
    lines += [f"| LTD targets, all-MiniLM-L6-v2 fp32 / bf16 ({t['captions']} captions, batch 64) | "
              f"{t['captions_s_fp32']:.0f} / {t['captions_s_bf16']:.0f} captions/s |"]
    for e in res.get("epochs", []):
        label = e["config"] + (f" ({' '.join(e['sets'])})" if e["sets"] else "")
        lines.append(f"| one epoch, Flickr8k train (30,000 captions), cached features: {label} | {e['epoch_s']:.1f} s |")
    lines += ["", "The ceiling divides the best dense matmul rate by the model's FLOPs; depthwise convolutions "
              "cannot reach dense-GEMM efficiency, so a fraction of it is the realistic target.", ""]
    return "\n".join(lines)


def write_section(text: str, path: Path = ROOT / "BENCHMARKS.md") -> None:
    replace_section(SECTION, text, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--captions", type=int, default=4000)
    p.add_argument("--epoch-config", action="append", default=[], metavar="PRESET[:KEY=VAL,...]",
                   help="epoch timing for this preset (repeatable); default flickr8k_baseline and flickr8k_ltd")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    data_dir = os.environ.get("LTD_DATA_DIR")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    res = {"machine": f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}",
           "date": time.strftime("%Y-%m-%d"), "command": "python " + " ".join(["bench/train_throughput.py", *(argv or sys.argv[1:])])}
    print("backbone …", flush=True)
    res["backbone"] = bench_backbone(args.images, data_dir)
    print("targets …", flush=True)
    res["targets"] = bench_targets(args.captions, data_dir)
    if data_dir:
        res["epochs"] = []
        for spec in args.epoch_config or ["flickr8k_baseline", "flickr8k_ltd"]:
            name, _, sets = spec.partition(":")
            print(f"epoch {spec} …", flush=True)
            res["epochs"].append(bench_epoch(name, data_dir, [s for s in sets.split(",") if s]))
    print(json.dumps(res, indent=2, default=float))
    text = render(res)
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
