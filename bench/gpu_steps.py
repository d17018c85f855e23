"""What only a GPU shows: CUDA training steps (fp32 and fp16 AMP) checked against the same steps on
the CPU, a whole CUDA run served from the CPU, and GPU embedding and search throughput (not a test).

    python bench/gpu_steps.py --json OUT.json [--steps 20] [--minilm-arch DIR] [--mpnet-arch DIR]
    python bench/gpu_steps.py --render OUT.json [--write]     # any machine: the BENCHMARKS.md section

1. **Training steps** of the presets' recipes (``flickr8k_ltd``: cached pooled features + bi-GRU +
   LTD constraint; ``flickr8k_vsrn_ltd``: VSRN over cached 7×7 grids; ``flickr8k_clean``: FNE + max-
   pooled bi-GRU, batch 256; end to end: ``flickr8k_ltd`` with the EfficientNet-Lite0 backbone trained,
   one fixed preprocessed image batch per step so the step, not JPEG decoding, is timed) on the
   embedded synthetic scenes (Flickr8k cannot travel to a GPU machine; the step's cost depends on
   the batch, the model and the captions' lengths, and the synthetic captions are shorter than
   Flickr's). Each of CPU fp32, CUDA fp32 and CUDA fp16 AMP (``train.amp``, GradScaler) builds a fresh
   model from the same seed and runs the same first batches after an untimed pass. Reported: ms per
   step (the loop's own ``train_step``, which reads the gradient norm back every step), the speed-up,
   and the loss gaps to the CPU's fp32 steps (first step, and mean over the timed steps): the check
   that the CUDA path computes the same objective.
2. **A whole CUDA run**: ``ltd train``'s loop (``training.loop.train``) on ``synthetic_ltd`` under AMP
   for 2 epochs, resumed to 3, its ``best.pt`` rebuilt on the CPU (``model_from_checkpoint``) and its
   caption embeddings compared with the CUDA model's (cosine).
3. **Embedding throughput**: EfficientNet-Lite0 (the packaged weights) images/s on the GPU in fp32
   and fp16, against the machine's CPU; sentence encoders (all-MiniLM-L6-v2 and all-mpnet-base-v2
   *architectures*, random weights: their packages are too large to travel, and the speed does not
   depend on the weights' values) captions/s in fp32 and fp16 against the CPU.
4. **Exact search**: 5,000 queries against 100,000 × 1,024 normalised vectors, top-10 inner
   product: faiss-cpu's IndexFlatIP on the machine's cores against a matrix product + top-k on the
   GPU (torch, fp32 and fp16), with the fp16 top-10's overlap with the exact one. (faiss-gpu needs
   CUDA 12 libraries the GPU image does not carry; this is what a flat GPU index computes.)

Flags: ``--minilm-arch`` / ``--mpnet-arch``: folders of a sentence-transformers model *without* its
weights (config, tokenizer, modules); random weights are written beside them. Default: the packaged
MiniLM and the reassembled mpnet, weights included, when installed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.hf_env import set_hf_environment  # noqa: E402

set_hf_environment()  # before torch and transformers load

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._gpu_report import SECTION, render  # noqa: E402,F401  (render: --render, and the tests)
from bench._machine import best_of, machine_line, today  # noqa: E402

GPU = "cuda"  # --dry-run sets "cpu": the script's own check on a machine without a GPU (numbers meaningless)
RECIPES = {  # name: (preset, extra overrides)
    "flickr8k_ltd": ("flickr8k_ltd", []),
    "flickr8k_vsrn_ltd": ("flickr8k_vsrn_ltd", []),
    "flickr8k_clean": ("flickr8k_clean", []),
    "end-to-end flickr8k_ltd": ("flickr8k_ltd", ["model.freeze_backbone=false"]),
    "flickr8k_ltd batch 1024": ("flickr8k_ltd", ["train.batch_size=1024"]),
}
COLUMNS = [("cpu_fp32", "cpu", []), ("cuda_fp32", "gpu", ["train.amp=false"]),
           ("cuda_fp16", "gpu", ["train.amp=true", "train.amp_dtype=fp16"]),
           ("cuda_bf16", "gpu", ["train.amp=true", "train.amp_dtype=bf16"])]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    # (the CPU runs synchronously)


def random_weights_folder(arch: Path, out: Path) -> Path:
    """A sentence-transformers folder of ``arch``'s architecture with fresh random weights."""
    from transformers import AutoConfig, AutoModel

    if (out / "model.safetensors").is_file():
        return out
    shutil.copytree(arch, out, dirs_exist_ok=True)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(str(arch))).save_pretrained(str(out))
    return out


# ---- 1. training steps ---------------------------------------------------------------------------
def time_steps(r, batches, n: int, images) -> tuple[float, list[float]]:
    from training.loop import train_step

    losses = []
    sync(r.device.type)
    t = time.perf_counter()
    for s in range(n):
        out, _ = train_step(r, batches[s % len(batches)], torch.Generator().manual_seed(s), images)
        losses.append(float(out["loss"].detach()))
    sync(r.device.type)
    return (time.perf_counter() - t) / n, losses


def bench_recipe(name: str, overrides: list[str], steps: int, cpu_steps: int, base: list[str]) -> dict:
    from training.config import load_config
    from training.device import using_device
    from training.loop import epoch_batches, set_up, unfreeze_backbone_if_due
    from training.prepare import prepare

    preset, extra = RECIPES[name]
    res: dict = {"recipe": name, "preset": preset}
    data = None
    with tempfile.TemporaryDirectory() as tmp:
        for label, where, sets in COLUMNS:
            dev = GPU if where == "gpu" else "cpu"
            cfg = load_config(preset, [*base, *extra, *overrides, *sets])
            if data is None:
                t = time.perf_counter()
                with using_device(GPU):
                    data = prepare(cfg)
                res["prepare_s"] = time.perf_counter() - t
                # the model shares the loaded backbone; end to end trains it: each run starts from these
                bb_state = {k: v.detach().cpu().clone() for k, v in data.backbone.state_dict().items()} \
                    if data.backbone is not None else None
            batches = epoch_batches(cfg.train.seed, 0, len(data.train_texts), cfg.train.batch_size)
            n = cpu_steps if dev == "cpu" else steps
            images = None
            if not cfg.model.freeze_backbone:
                g = torch.Generator().manual_seed(0)
                x = torch.rand(cfg.train.batch_size, 3, cfg.model.image_size, cfg.model.image_size, generator=g)
                images = itertools.repeat(x)
            runs = []
            for _ in range(2):  # untimed pass (kernels, allocator, cuDNN autotuning), then the timed one
                torch.manual_seed(0)
                if bb_state is not None:
                    data.backbone.load_state_dict(bb_state)
                with using_device(dev):
                    r = set_up(cfg, data, Path(tmp))
                unfreeze_backbone_if_due(r, 0)
                runs.append(time_steps(r, batches, n, images))
                del r
            dt, losses = runs[1]
            res[label] = {"ms_per_step": dt * 1000, "steps": n, "losses": losses}
            print(f"  {name} {label}: {dt * 1000:.1f} ms/step over {n} steps, first loss {losses[0]:.5f}", flush=True)
            res["batch_size"] = cfg.train.batch_size
    return res


# ---- 2. a whole CUDA run, served from the CPU ----------------------------------------------------
def whole_run(base: list[str], work: Path) -> dict:
    from indexer.embed import embed_captions
    from training.checkpoint import model_from_checkpoint
    from training.config import load_config
    from training.device import using_device
    from training.loop import train

    res = {}
    run = work / "whole_run"
    cfg = load_config("synthetic_ltd", [*base, f"train.device={GPU}", "train.amp=true", "train.epochs=2"])
    t = time.perf_counter()
    r1 = train(cfg, run)
    res["two_epochs_s"] = time.perf_counter() - t
    cfg3 = load_config("synthetic_ltd", [*base, f"train.device={GPU}", "train.amp=true", "train.epochs=3"])
    t = time.perf_counter()
    r2 = train(cfg3, run, resume=True)
    res["resume_to_3_s"] = time.perf_counter() - t
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    res["epochs_logged"] = [r["epoch"] for r in rows if r.get("type") == "epoch"]
    res["finite_losses"] = all(np.isfinite(r["loss"]) for r in rows if r.get("type") == "step")
    res["last_lambda"] = next((r["lambda"] for r in reversed(rows) if "lambda" in r), None)
    with using_device(GPU):
        m_gpu, _, _ = model_from_checkpoint(run / "checkpoint.pt")
    m_cpu, _, _ = model_from_checkpoint(run / "checkpoint.pt")  # the CPU: the process's default
    texts = ["a red circle left of a blue square", "two green triangles", "a small yellow star above a cross"]
    a, b = embed_captions(m_gpu, texts), embed_captions(m_cpu, texts)
    res["cpu_vs_cuda_caption_cosine_min"] = float((a * b).sum(1).min())
    res["best_pt_loads_on_cpu"] = bool(model_from_checkpoint(run / "best.pt")[0] is not None)
    res["epochs"] = [r1.epochs, r2.epochs]
    res["judge"] = str(run / "best.pt")
    return res


def profile_step(base: list[str], steps: int = 10) -> str:
    """torch.profiler's table of one cached-feature recipe's CUDA fp32 steps: CPU overhead or GPU work?"""
    from torch.profiler import ProfilerActivity, profile

    from training.config import load_config
    from training.device import using_device
    from training.loop import epoch_batches, set_up, train_step
    from training.prepare import prepare

    cfg = load_config("flickr8k_ltd", [*base, "train.amp=false"])
    with using_device(GPU):
        data = prepare(cfg)
    batches = epoch_batches(cfg.train.seed, 0, len(data.train_texts), cfg.train.batch_size)
    with tempfile.TemporaryDirectory() as tmp, using_device(GPU):
        r = set_up(cfg, data, Path(tmp))
        for s in range(3):
            train_step(r, batches[s % len(batches)], torch.Generator().manual_seed(s), None)
        sync(GPU)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if GPU == "cuda" else [])
        t = time.perf_counter()
        with profile(activities=acts) as prof:
            for s in range(steps):
                train_step(r, batches[(3 + s) % len(batches)], torch.Generator().manual_seed(s), None)
            sync(GPU)
        wall = (time.perf_counter() - t) / steps
    ka = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in ka) / steps if GPU == "cuda" else 0.0
    head = f"{steps} steps under the profiler: {wall * 1000:.1f} ms/step wall, {gpu_us / 1000:.1f} ms/step of GPU kernels\n"
    return head + ka.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=48)


def caption_steps(judge: str, steps: int) -> dict:
    from bench.caption_epoch import main as caption_epoch

    out = {}
    gpu_key = "cuda" if GPU == "cuda" else "cpu standing in for the GPU (dry run)"
    for key, dev, n in [(gpu_key, GPU, steps), ("cpu", "cpu", max(2, steps // 5))]:
        out[key] = caption_epoch(["--config", "caption_synthetic_sr_pl", "--retrieval", judge, "--steps", str(n),
                                  "--set", f"train.device={dev}"])
    return out


# ---- 3. embedding throughput ---------------------------------------------------------------------
def best_time(fn, device: str, repeats: int = 3) -> float:
    """``bench._machine.best_of`` with the device's queue drained inside each timed call."""
    return best_of(lambda: (fn(), sync(device)), repeats)


def image_throughput(batch: int = 256) -> dict:
    from training.models.backbones import build_backbone

    res = {}
    net = build_backbone("efficientnet_lite0", features="pooled", image_size=224).net.eval()
    x = torch.rand(batch, 3, 224, 224)
    for label, dev, dtype in [("cpu_fp32", "cpu", None), ("cuda_fp32", GPU, None), ("cuda_fp16", GPU, torch.float16)]:
        m = net.to(dev).to(memory_format=torch.channels_last)
        xb = (x[:32] if dev == "cpu" else x).to(dev).contiguous(memory_format=torch.channels_last)

        @torch.no_grad()
        def run(m=m, xb=xb, dev=dev, dtype=dtype):
            with torch.autocast(dev, dtype=dtype or torch.float32, enabled=dtype is not None):
                m.extract_features(xb)
        res[label] = len(xb) / best_time(run, dev)
        print(f"  EfficientNet-Lite0 {label}: {res[label]:.0f} images/s", flush=True)
    net.to("cpu")
    return res


def caption_corpus(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    words = ("a man woman dog child girl boy two people red blue green white black is are running jumping "
             "sitting standing on in the of with near water grass street beach ball bike snow field wall").split()
    return [" ".join(rng.choice(words, size=int(rng.integers(8, 16)))) for _ in range(n)]


def text_throughput(folder: Path, n: int = 20000) -> dict:
    from sentence_transformers import SentenceTransformer

    res = {}
    texts = caption_corpus(n)
    for label, dev, half in [("cpu_fp32", "cpu", False), ("cuda_fp32", GPU, False), ("cuda_fp16", GPU, True)]:
        m = SentenceTransformer(str(folder), device=dev)
        if half:
            m.half()
        sub = texts[:1000] if dev == "cpu" else texts
        dt = best_time(lambda m=m, sub=sub: m.encode(sub, batch_size=256, convert_to_numpy=True), dev,
                       repeats=1 if dev == "cpu" else 2)
        res[label] = len(sub) / dt
        if half:
            full = SentenceTransformer(str(folder), device=GPU)
            e32 = full.encode(texts[:1000], batch_size=256, convert_to_numpy=True, normalize_embeddings=True)
            e16 = m.encode(texts[:1000], batch_size=256, convert_to_numpy=True, normalize_embeddings=True)
            res["fp16_cosine_min"] = float((e32 * e16.astype(np.float32)).sum(1).min())
        print(f"  {folder.name} {label}: {res[label]:.0f} captions/s", flush=True)
    return res


# ---- 4. exact search -----------------------------------------------------------------------------
def search_throughput(n: int = 100_000, d: int = 1024, q: int = 5000, k: int = 10) -> dict:
    import faiss

    rng = np.random.default_rng(0)
    q = min(q, n)
    xb = rng.standard_normal((n, d), dtype=np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = xb[rng.choice(n, q, replace=False)] + 0.5 * rng.standard_normal((q, d), dtype=np.float32) / np.sqrt(d)
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    res = {"n": n, "d": d, "queries": q, "k": k, "cpu_threads": faiss.omp_get_max_threads()}
    index = faiss.IndexFlatIP(d)
    index.add(xb)
    t = time.perf_counter()
    _, exact = index.search(xq, k)
    res["faiss_cpu_qps"] = q / (time.perf_counter() - t)
    for label, dtype in [("cuda_fp32", torch.float32), ("cuda_fp16", torch.float16)]:
        B, Q = torch.from_numpy(xb).to(GPU, dtype), torch.from_numpy(xq).to(GPU, dtype)
        got = []

        def run(B=B, Q=Q, got=got):
            got.clear()
            for i in range(0, len(Q), 1000):
                got.append(torch.topk(Q[i : i + 1000] @ B.T, k, dim=1).indices)
        dt = best_time(run, GPU)
        ids = torch.cat(got).cpu().numpy()
        res[f"{label}_qps"] = q / dt
        res[f"{label}_top{k}_overlap"] = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, exact)]))
        print(f"  search {label}: {res[f'{label}_qps']:.0f} queries/s, overlap {res[f'{label}_top{k}_overlap']:.4f}",
              flush=True)
    res["transfer_note"] = "GPU timings exclude copying the corpus to the GPU (done once per index)"
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write the results here (as each part finishes)")
    p.add_argument("--render", help="print the BENCHMARKS.md section of a results JSON")
    p.add_argument("--write", action="store_true", help="with --render: replace the section in BENCHMARKS.md")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cpu-steps", type=int, default=4)
    p.add_argument("--minilm-arch", default="")
    p.add_argument("--mpnet-arch", default="")
    p.add_argument("--dry-run", action="store_true", help="run every part with the CPU in the GPU's place (a check of the script)")
    p.add_argument("--synthetic-images", type=int, default=2000)
    p.add_argument("--search-n", type=int, default=100_000)
    p.add_argument("--text-n", type=int, default=20_000)
    p.add_argument("--recipe", action="append", choices=list(RECIPES), help="default: all")
    p.add_argument("--skip", action="append", default=[], choices=["train", "profile", "whole_run", "caption", "images", "text", "search"])
    args = p.parse_args(argv)
    if args.render:
        from bench._common import publish

        publish(SECTION, render(json.loads(Path(args.render).read_text())), args.write)
        return 0
    if args.dry_run:
        global GPU
        GPU = "cpu"
    elif not torch.cuda.is_available():
        p.error("no CUDA device: this benchmark needs a GPU (use --render to print a results file)")
    res: dict = {"machine": machine_line(), "date": today(), "errors": [],
                 "command": "python " + " ".join(["bench/gpu_steps.py", *(argv if argv is not None else sys.argv[1:])])}

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))

    work = Path(tempfile.mkdtemp(prefix="gpu_steps_"))
    minilm = random_weights_folder(Path(args.minilm_arch), work / "minilm") if args.minilm_arch else None
    mpnet = random_weights_folder(Path(args.mpnet_arch), work / "mpnet") if args.mpnet_arch else None
    base = ["data.path=", f"data.synthetic_images={args.synthetic_images}", "model.word_embeddings=random",
            *([f"loss.target_model={minilm}"] if minilm else [])]
    parts = []
    if "train" not in args.skip:
        parts += [(f"train:{name}", lambda name=name: bench_recipe(name, [], args.steps, args.cpu_steps, base))
                  for name in args.recipe or RECIPES]
    if "profile" not in args.skip:
        parts.append(("profile", lambda: profile_step(base)))
    if "whole_run" not in args.skip:
        parts.append(("whole_run", lambda: whole_run(base, work)))
        if "caption" not in args.skip:
            parts.append(("caption", lambda: caption_steps(res["whole_run"]["judge"], args.steps)))
    if "images" not in args.skip:
        parts.append(("images", image_throughput))
    if "text" not in args.skip:
        from training.targets import resolve_sentence_model
        parts.append(("minilm", lambda: text_throughput(minilm or resolve_sentence_model(""), args.text_n)))
        parts.append(("mpnet", lambda: text_throughput(mpnet or resolve_sentence_model("all-mpnet-base-v2"), args.text_n)))
    if "search" not in args.skip:
        parts.append(("search", lambda: search_throughput(n=args.search_n)))
    for key, fn in parts:
        t = time.perf_counter()
        print(f"{key} …", flush=True)
        try:
            out = fn()
        except Exception as e:  # one failing part must not lose the others' numbers
            traceback.print_exc()
            err = f"{type(e).__name__}: {e}"[:500]
            out = {"error": err}
            res["errors"].append(f"{key}: {err}")
        if key.startswith("train:"):
            res.setdefault("train", []).append({"recipe": key[6:], **out})
        else:
            res[key] = out
        print(f"{key} done in {time.perf_counter() - t:.0f} s", flush=True)
        save()
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
