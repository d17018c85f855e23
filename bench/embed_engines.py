"""Image embedding speed per inference runtime, against the FLOP-bound ceiling measured in the same run.

    python bench/embed_engines.py [--images 256] [--runtime torch --runtime openvino …] [--compile]
                                  [--device cuda] [--write]

1. COCO-sized test JPEGs (640×480, quality 90, photo-like: smooth colour fields plus grain), written
   to a temp folder;
2. the ceiling: EfficientNet-Lite0 FLOPs per image against the best fp32 matmul rate, measured at the
   start and at the end of the run (the higher one is used: the ratio is then conservative);
3. per runtime: the CNN alone (batch 32, best of 3) and end to end from the JPEG files through the
   feature cache (decoding in the default pool of worker processes, overlapped with inference), plus
   draft-mode decoding and one decoding worker (the default before 2026-11-25) for the fastest runtime;
   cosine of every runtime's features to torch's;
4. caption encoding (bi-GRU at the presets' sizes), to say whether it can keep up with the images.
With ``--device cuda`` (a GPU machine) the torch runtime is measured on the GPU (fp16 autocast). On a
CPU with native bf16 every runtime row is pinned to fp32 (``LTD_FEATURE_DTYPE=float32``); two more rows
measure the bf16 paths against a bf16 matmul ceiling (OpenVINO's bf16 kernels, what ``auto`` runs
there, and torch's bf16 autocast). ``uptime``'s 1-minute load is recorded next to every number.

BENCHMARKS.md has one section for every machine: a table with one column per machine and precision
(a CPU without native bf16: fp32; one with it: fp32 and bf16; a GPU: fp16 autocast) and one block per
run (machine, date, command, ceilings, cosines, loads, decoding variants). ``--write`` replaces this
machine's columns and block, between their markers, and leaves the other machines' as they are.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import BENCHMARKS, marked, read_section, replace_marked, replace_section, set_columns  # noqa: E402
from bench._machine import best_of, cpu_model, effnet_gflops, load1, machine_line, matmul_gflops, today  # noqa: E402

SECTION = "## Image embedding engines (bench/embed_engines.py)"
TABLE = "embed_engines:table"
RUNTIMES = ("torch", "onnxruntime", "openvino", "compile")
ROWS = ["date", "ceiling (img/s)", *(f"{rt}: {what}" for rt in RUNTIMES for what in ("CNN alone", "end to end"))]
INTRO = """\
EfficientNet-Lite0 pooled features at 224 px from COCO-sized JPEGs (640×480, quality 90), in images/s: the CNN
alone (batch 32, best of 3) and end to end (JPEG decoding in worker processes, overlapped with the CNN, through
the feature cache, batch 32). In brackets: the share of the run's ceiling, EfficientNet-Lite0's 0.77 GFLOP per
image against the best matmul rate of the column's precision, measured at the start and the end of the run.
One column per machine and precision: fp32 everywhere (on a CPU with native bf16 the runtimes are pinned to fp32
with `LTD_FEATURE_DTYPE=float32`), bf16 where the CPU has it (what `auto` runs there: OpenVINO's bf16 kernels,
torch's bf16 autocast the fallback), fp16 autocast on a GPU (the CPU only decodes). Compare engines within a
column. Each machine's run is described below the table: machine, date, command, matmul rates, cosine to
torch's features, load, and the decoding variants of its fastest engine."""


def machine_name(res: dict) -> str:
    """The machine a run's columns belong to: CPUs with native bf16 differ a lot (AMX vs AVX512-BF16)."""
    if res["device"] != "cpu":
        return res["gpu"]
    return res["cpu"] + (" with native bf16" if res["bf16_native"] else "")


def _column_order(name: str) -> tuple:
    return ("fp16" in name, "native bf16" in name, name.rsplit(":", 1)[0], not name.endswith(": fp32"))


def openvino_one_request(batch: int = 32) -> float:
    """CNN-alone images/s of OpenVINO run as one synchronous request (how it ran before a batch was split
    across the THROUGHPUT streams): the A/B for that change, measured in the same run."""
    from training.models import runtimes
    from training.models.backbones import EfficientNetLite0
    from training.models.runtimes import Tap

    bb = EfficientNetLite0("pooled", 224)
    run = runtimes._openvino(runtimes.export_onnx(Tap(bb.fused(), bb.features), 224, ""), streams=False)
    x = (torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0)) * 2 - 1).numpy()
    return batch / best_of(lambda: run(x), 3)


def make_jpegs(folder: Path, n: int, size=(640, 480), seed: int = 0) -> list[Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        low = Image.fromarray((rng.random((12, 16, 3)) * 255).astype(np.uint8)).resize(size, Image.BICUBIC)
        arr = np.asarray(low, dtype=np.float32) + rng.normal(0, 10, (size[1], size[0], 3))
        p = folder / f"img{i:06d}.jpg"
        Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(p, quality=90)
        out.append(p)
    return out


def cnn_only(runtime: str, device: str, batch: int = 32) -> tuple[float, torch.Tensor]:
    from training.models.backbones import EfficientNetLite0

    bb = EfficientNetLite0("pooled", 224).to(device)  # extract runs where the backbone is
    bb.set_runtime(runtime)
    x = (torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0)) * 2 - 1).to(device)

    def run():
        bb.extract(x)
        if device != "cpu":
            torch.cuda.synchronize()
    rate = batch / best_of(run, 3)
    return rate, bb.extract(x).cpu()


def end_to_end(runtime: str, paths: list[Path], device: str, *, workers: int | None = None,
               draft: bool = False) -> tuple[float, np.ndarray]:
    from training.device import using_device
    from training.features import ExtractionSpec, extract_features
    from training.models.backbones import EfficientNetLite0

    bb = EfficientNetLite0("pooled", 224).to(device)
    bb.set_runtime(runtime)
    bb.image_runtime()  # export / compile before the clock starts
    with tempfile.TemporaryDirectory() as cache, using_device(device):
        t = time.perf_counter()
        spec = ExtractionSpec(batch_size=32, workers=workers, draft=draft)
        store = extract_features(bb, paths, cache_dir=cache, spec=spec)
        dt = time.perf_counter() - t
        feats = store.tensor()[:, 0].numpy()
    return len(paths) / dt, feats


def cosine_min(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)
    return float(torch.nn.functional.cosine_similarity(a, b, dim=1).min())


def captions_per_s(hidden: int, n: int = 5000) -> float:
    from training.config import ModelConfig
    from training.data.vocab import SPECIALS, Vocab
    from training.models.text_encoder import GRUTextEncoder

    words = [f"w{i}" for i in range(8000)]
    enc = GRUTextEncoder(Vocab(list(SPECIALS) + words),
                         ModelConfig(word_dim=50, text_hidden=hidden, embed_dim=1024, head_hidden=2048)).eval()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, int(rng.integers(8, 16)))) for _ in range(n)]

    def run():
        with torch.no_grad():
            for i in range(0, n, 512):
                enc(enc.prepare(texts[i : i + 512]))
    return n / best_of(run, 2)


def measure(args, paths: list[Path]) -> dict:
    import os

    from training.data.decode_pool import default_workers
    from training.models.backbones import cpu_bf16_fast
    from training.models.runtimes import installed

    dev = args.device
    res = {"machine": machine_line(), "date": today(), "images": len(paths), "device": dev, "cpu": cpu_model(),
           "gpu": torch.cuda.get_device_name(0) if dev != "cpu" else None,
           "bf16_native": cpu_bf16_fast(), "command": "python bench/embed_engines.py " + " ".join(args.argv),
           "decoders": default_workers(len(paths), 32), "cores": os.cpu_count()}
    if dev == "cpu":
        os.environ["LTD_FEATURE_DTYPE"] = "float32"  # every runtime row in fp32; the bf16 rows come after
    res["gflops_per_image"] = effnet_gflops(224)
    # on a GPU the torch runtime runs fp16 autocast, so its ceiling is the fp16 matmul rate
    mm_dtype = torch.float16 if dev != "cpu" else torch.float32
    res["precision"] = "fp16 autocast" if dev != "cpu" else "fp32"
    peaks = [matmul_gflops(device=dev, dtype=mm_dtype)]
    runtimes = args.runtime or (["torch"] if dev != "cpu" else
                                [r for r in ("torch", "onnxruntime", "openvino") if installed(r)])
    if args.compile and dev == "cpu":
        runtimes.append("compile")
    rows, ref = [], None
    for rt in runtimes:
        t0 = time.perf_counter()
        load = load1()
        cnn, out = cnn_only(rt, dev)
        ref = out if ref is None else ref
        e2e, feats = end_to_end(rt, paths, dev)
        rows.append({"runtime": rt, "cnn_img_s": cnn, "e2e_img_s": e2e, "load1": load, "cos_to_torch": cosine_min(out, ref),
                     "setup_and_run_s": time.perf_counter() - t0, "feats": feats})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "feats"}), flush=True)
    if "openvino" in runtimes and dev == "cpu":
        res["openvino_one_request"] = {"cnn_img_s": openvino_one_request(), "load1": load1()}
        print(json.dumps(res["openvino_one_request"]), flush=True)
    best = max(rows, key=lambda r: r["e2e_img_s"])
    extra = []
    for label, kw in (("draft decoding", {"draft": True}), ("1 decoding worker", {"workers": 1}),
                      ("decoding in the main process", {"workers": 0})):
        load = load1()
        rate, feats = end_to_end(best["runtime"], paths, dev, **kw)
        extra.append({"runtime": best["runtime"], "variant": label, "e2e_img_s": rate, "load1": load,
                      "cos_to_full_decode": cosine_min(feats, best["feats"])})
        print(json.dumps(extra[-1]), flush=True)
    peaks.append(matmul_gflops(device=dev, dtype=mm_dtype))
    if dev == "cpu" and res["bf16_native"]:
        del os.environ["LTD_FEATURE_DTYPE"]
        bf16_peak = matmul_gflops(dtype=torch.bfloat16)
        res["bf16"] = []
        for rt in [r for r in ("openvino", "torch") if installed(r)]:  # auto's choice first
            load = load1()
            cnn, out = cnn_only(rt, dev)
            e2e, _ = end_to_end(rt, paths, dev)
            res["bf16"].append({"runtime": f"{rt}, bf16", "cnn_img_s": cnn, "e2e_img_s": e2e, "load1": load,
                                "cos_to_torch": cosine_min(out, ref), "matmul_gflops": bf16_peak,
                                "ceiling_img_s": bf16_peak / res["gflops_per_image"]})
            if rt == "openvino":  # the engine fast enough for one decoder to starve it
                res["bf16"][-1]["e2e_one_decoder"] = end_to_end(rt, paths, dev, workers=1)[0]
            print(json.dumps(res["bf16"][-1]), flush=True)
    res.update(matmul_gflops=peaks, ceiling_img_s=max(peaks) / res["gflops_per_image"],
               rows=[{k: v for k, v in r.items() if k != "feats"} for r in rows], variants=extra)
    if dev == "cpu":
        res["captions"] = {h: {"captions_s": captions_per_s(h), "load1": load1()} for h in (256, 512)}
    res["load1_end"] = load1()
    return res


def _rate(img_s: float, ceiling: float) -> str:
    return f"{img_s:.1f} ({100 * img_s / ceiling:.0f} %)"


def columns(res: dict) -> dict[str, dict[str, str]]:
    """This run's table columns: its precision (fp32, or fp16 autocast on a GPU), and bf16 where measured."""
    ceil, name = res["ceiling_img_s"], machine_name(res)
    main = {"date": res["date"], "ceiling (img/s)": f"{ceil:.0f}"}
    for r in res["rows"]:
        main |= {f"{r['runtime']}: CNN alone": _rate(r["cnn_img_s"], ceil),
                 f"{r['runtime']}: end to end": _rate(r["e2e_img_s"], ceil)}
    out = {f"{name}: {res['precision']}": main}
    if res.get("bf16"):
        bf = {"date": res["date"], "ceiling (img/s)": f"{res['bf16'][0]['ceiling_img_s']:.0f}"}
        for b in res["bf16"]:
            rt = b["runtime"].split(",")[0]
            bf |= {f"{rt}: CNN alone": _rate(b["cnn_img_s"], b["ceiling_img_s"]),
                   f"{rt}: end to end": _rate(b["e2e_img_s"], b["ceiling_img_s"])}
        out[f"{name}: bf16"] = bf
    return out


def run_block(res: dict) -> str:
    """What the table's cells do not say about this run: machine, command, matmul rates, cosines, loads, variants."""
    ceil, bf16 = res["ceiling_img_s"], res.get("bf16", [])
    rows = res["rows"] + bf16
    mm = f"{' / '.join(f'{p:.0f}' for p in res['matmul_gflops'])} GFLOP/s {res['precision'].split()[0]}"
    mm += f", {bf16[0]['matmul_gflops']:.0f} GFLOP/s bf16" if bf16 else ""
    lines = [f"**{machine_name(res)}**: {res['machine']}. Date: {res['date']}. Command: `{res['command']}`. "
             f"{res['images']} JPEGs; decoding worker processes: {res['decoders']}. Matmul rate at the start / end of "
             f"the run: {mm}. Min cosine to torch's features: "
             + ", ".join(f"{r['runtime'].replace(', ', ' ')} {r['cos_to_torch']:.7f}" for r in rows)
             + f". Load (`uptime`'s 1-minute average, {res.get('cores', '?')} cores) when each row started: "
             + ", ".join(f"{r['runtime'].replace(', ', ' ')} {r['load1']:.1f}" for r in rows) + f"; at the end {res['load1_end']:.1f}.",
             "", "| variant (fastest runtime) | end to end (img/s) | % of ceiling | min cosine to full decoding | load |",
             "|---|---:|---:|---:|---:|"]
    for v in res["variants"]:
        lines.append(f"| {v['runtime']}, {v['variant']} | {v['e2e_img_s']:.1f} | {100 * v['e2e_img_s'] / ceil:.0f} % | "
                     f"{v['cos_to_full_decode']:.5f} | {v['load1']:.1f} |")
    for b in bf16:
        if "e2e_one_decoder" in b:
            lines += ["", f"{b['runtime']} end to end with one decoding worker (the default before 2026-11-25): "
                      f"{b['e2e_one_decoder']:.1f} img/s; the default pool of {res['decoders']} is "
                      f"{b['e2e_img_s'] / b['e2e_one_decoder']:.2f}× faster."]
    if "openvino_one_request" in res:
        one, ov = res["openvino_one_request"], next(r for r in res["rows"] if r["runtime"] == "openvino")
        lines += ["", f"OpenVINO runs a batch as one slice per THROUGHPUT stream, in parallel requests; as one synchronous "
                  f"request (before) the CNN alone ran at {one['cnn_img_s']:.1f} img/s ({100 * one['cnn_img_s'] / ceil:.0f} % "
                  f"of the ceiling; load {one['load1']:.1f}): the split is {ov['cnn_img_s'] / one['cnn_img_s']:.2f}× faster."]
    if "captions" in res:
        caps = ", ".join(f"hidden {h}: {c['captions_s']:.0f} captions/s (load {c['load1']:.1f})" for h, c in res["captions"].items())
        lines += ["", f"Caption encoding (bi-GRU, batch 512, 50-d words, 1024-d embedding, random weights): {caps}."]
    return "\n".join(lines)


def write(res: dict, path: Path = BENCHMARKS) -> None:
    """Replace this machine's columns of the table and its run block; the other machines' stay as they are."""
    sec = read_section(SECTION, path) or f"{SECTION}\n\n{INTRO}\n\n<!-- {TABLE} -->\n<!-- /{TABLE} -->\n"
    sec = replace_marked(sec, TABLE, set_columns(marked(sec, TABLE) or "", columns(res), rows=ROWS,
                                                 order=_column_order), append=False)
    sec = replace_marked(sec, f"embed_engines:run {machine_name(res)}", run_block(res))
    replace_section(SECTION, sec, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--runtime", action="append", default=[], help="measure only these (default: every installed one)")
    p.add_argument("--compile", action="store_true", help="also torch.compile (slow to compile on 2 cores)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_jpegs(Path(tmp) / "jpegs", args.images)
        res = measure(args, paths)
    print(json.dumps(res, indent=2, default=float))
    for name, cells in columns(res).items():
        print(f"{name}: {cells}")
    print(run_block(res))
    if args.write:
        write(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
