"""CLIP fine-tuning steps per second: a randomly initialised CLIP of ViT-B/32 size, fp32 vs autocast.

    python bench/clip_steps.py --device cuda [--batch 256] [--steps 20] [--precisions fp32,bf16,fp16]
        [--loss infonce,ltd] [--out clip_steps.json] [--write]
    python bench/clip_steps.py --device cpu --tiny          # a seconds-long check of the script itself

No weights are needed: ``transformers.CLIPConfig()``'s defaults are ViT-B/32's shapes (vision 768 × 12
layers on 7 × 7 patches of 224 px, text 512 × 12 layers over 77 tokens, joint space 512), built with
random weights and wrapped exactly as ``model.clip_path`` would be (``training.models.clip``). Each
step is ``training.loop.train_step`` itself — autocast, both towers, the objective with CLIP's logit
scale (InfoNCE, or + LTD as the constraint with a 384-d decoder), backward, gradient clipping at 2,
AdamW, loss scaling for fp16 — on one batch of random pixels (already decoded: the steps are timed,
not JPEG decoding) and captions of ~12 words. Every precision starts from the same initial weights
and sees the same batch; ``warmup`` untimed steps come first. Reported (JSON on stdout, ``--out``
also to a file): ms and steps per second, images per second, peak GPU memory, the mean loss of the
timed steps (AMP should stay close to fp32), and each precision's speed as a ratio of fp32's, all
from the same run. ``--write`` puts the table in BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.hf_env import set_hf_environment  # noqa: E402

set_hf_environment()  # before torch and transformers load

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import replace_section  # noqa: E402
from bench._machine import machine_line, today  # noqa: E402

SECTION = "## CLIP fine-tuning steps (bench/clip_steps.py)"
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
TINY = dict(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=32, patch_size=8), projection_dim=16)
WORDS = "a dog man woman child runs sits on in the grass street red blue two with ball water".split()


def clip_spec(tiny: bool) -> dict:
    """A CLIP spec (as :func:`training.models.clip_files.read_clip_spec` returns) with random weights:
    the default config (ViT-B/32) or a tiny one, and a byte-level tokenizer without merges."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPConfig

    symbols = sorted(ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols)} | {s + "</w>": len(symbols) + i for i, s in enumerate(symbols)}
    vocab |= {"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1}
    cfg = CLIPConfig(**TINY) if tiny else CLIPConfig()
    cfg.text_config.eos_token_id = cfg.text_config.pad_token_id = vocab["<|endoftext|>"]
    cfg.text_config.bos_token_id = vocab["<|startoftext|>"]
    size = cfg.vision_config.image_size
    return {"config": cfg.to_dict(), "weights_sha256": "random",
            "tokenizer": {"vocab": vocab, "merges": [], "max_length": 77,
                          "specials": {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
                                       "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}},
            "preprocess": {"resize": size, "size": size, "mean": [0.5] * 3, "std": [0.5] * 3, "resample": 3}}


def make_run(spec: dict, loss: str, precision: str, device: torch.device, batch: int):
    """A ``training.loop.Run`` around a fresh CLIP (seed 0) and the preset's objective and optimiser."""
    from training.config import load_config
    from training.data.vocab import Vocab
    from training.loop import Run, build_optimizer
    from training.losses.objective import TrainingObjective
    from training.models.clip import ClipSource
    from training.models.dual_encoder import ModelDims, PretrainedParts, build_model

    sets = ["model.clip_path=random", "loss.mode=none"] if loss == "infonce" else ["model.clip_path=random"]
    cfg = load_config("f30k_clip_ltd", sets)
    torch.manual_seed(0)
    dims, parts = ModelDims(target_dim=384), PretrainedParts(clip=ClipSource(spec))
    model = build_model(cfg, Vocab.build([]), dims=dims, parts=parts).to(device).train()
    optimizer, backbone_params = build_optimizer(model, cfg)
    objective = TrainingObjective(cfg.loss, total_steps=10_000, logit_scale=model.logit_scale)
    g = torch.Generator().manual_seed(1)
    texts = [" ".join(WORDS[i] for i in torch.randint(len(WORDS), (12,), generator=g)) for _ in range(batch)]
    data = SimpleNamespace(train_texts=texts, targets=torch.randn(batch, 384, generator=g), image_feats=None)
    return Run(cfg=cfg, data=data, run_dir=Path("."), device=device, model=model, objective=objective,
               optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
               scaler=torch.amp.GradScaler(device.type, enabled=precision == "fp16" and device.type == "cuda"),
               autocast_dtype=DTYPES[precision], backbone_params=backbone_params, train_img=torch.arange(batch).numpy())


def measure(spec: dict, loss: str, precision: str, device: torch.device, batch: int, steps: int, warmup: int) -> dict:
    from training.loop import train_step

    r = make_run(spec, loss, precision, device, batch)
    size = spec["config"]["vision_config"]["image_size"]
    pixels = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(2))
    idx = torch.arange(batch).numpy()

    def step():
        out, _ = train_step(r, idx, torch.Generator().manual_seed(3), iter([pixels]))
        return float(out["loss"].detach())  # a host sync: the step is finished when this returns

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t, losses = time.perf_counter(), [step() for _ in range(steps)]
    secs = (time.perf_counter() - t) / steps
    return {"loss_fn": loss, "precision": precision, "ms_per_step": round(1000 * secs, 2),
            "steps_per_s": round(1 / secs, 3), "images_per_s": round(batch / secs, 1),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
            "mean_loss": round(sum(losses) / len(losses), 5)}


def render(res: dict) -> str:
    lines = [SECTION, "", f"{res['date']}, {res['machine']}; `{res['command']}`: a randomly initialised CLIP "
             f"({res['model']}), batch {res['batch']}, {res['steps']} timed steps after {res['warmup']} untimed, "
             "each precision from the same initial weights on the same batch (pixels already decoded).", "",
             "| loss | precision | ms / step | steps / s | images / s | × fp32 | peak GPU GiB | mean loss |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["results"]:
        mem = "–" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.2f}"
        lines.append(f"| {r['loss_fn']} | {r['precision']} | {r['ms_per_step']:.1f} | {r['steps_per_s']:.2f} | "
                     f"{r['images_per_s']:.0f} | {r['speedup_vs_fp32']:.2f}× | {mem} | {r['mean_loss']:.4f} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    spec = clip_spec(args.tiny)
    results = []
    for loss in args.loss.split(","):
        rows = [measure(spec, loss, p, device, args.batch, args.steps, args.warmup) for p in args.precisions.split(",")]
        base = next((r["ms_per_step"] for r in rows if r["precision"] == "fp32"), None)
        for r in rows:
            r["speedup_vs_fp32"] = round(base / r["ms_per_step"], 3) if base else None
        results += rows
    return {"date": today(), "machine": machine_line(), "command": "python bench/clip_steps.py " + " ".join(sys.argv[1:]),
            "model": "tiny" if args.tiny else "ViT-B/32 shapes", "device": str(device), "batch": args.batch,
            "steps": args.steps, "warmup": args.warmup, "results": results}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny CLIP, batch 8, 2 steps: checks the script, measures nothing")
    p.add_argument("--batch", type=int, default=None, help="default 256 (the recipe's), 8 with --tiny")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; 2 with --tiny)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precisions", default="fp32,bf16,fp16")
    p.add_argument("--loss", default="infonce,ltd", help="infonce and/or ltd (the constraint, with its decoder)")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--write", action="store_true", help="replace the section in BENCHMARKS.md")
    args = p.parse_args(argv)
    args.batch = args.batch or (8 if args.tiny else 256)
    args.steps = args.steps or (2 if args.tiny else 20)
    if args.tiny:
        args.warmup = min(args.warmup, 1)
    res = run(args)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.write:
        replace_section(SECTION, render(res))
    return res


if __name__ == "__main__":
    main()
