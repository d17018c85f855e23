"""Query encoder runtimes of a served model with a frozen sentence-transformers tower (run on demand).

    python bench/text_runtimes.py --index INDEX_DIR [--batches 1,8,16] [--rounds 3] [--threads 1,2] [--write]

For each way of encoding queries (training/models/text_runtimes.py: torch fp32, torch's bf16 autocast
where the CPU has native bf16, ONNX Runtime, OpenVINO, and the int8 ``--quantize-text`` copy) it times
the whole query path of the server's encoder call — tokenise, tower, the model's trained head — at the
given batch sizes (the micro-batcher's batches), in ``--rounds`` alternating rounds (median kept: on a
shared machine the load drifts), and checks quality on the index's own captions: cosine to the fp32
reference and text→image recall against the index's images. Beside the wall time per call it reports the
process CPU time per query at the largest batch: an engine that spins uses more CPU than it saves wall
time, which a server sharing its cores with the request path pays for. ``--threads 1,2`` runs ONNX Runtime
and OpenVINO once per engine thread count (default: torch's thread count, as the library uses them;
``ltd serve`` gives its engine one thread fewer than the cores). ``--write`` replaces this section of
BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `ltd serve` runs (app/cli/__init__.py)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.api.settings import Settings  # noqa: E402
from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402
from search.encoding import FrozenTowerQueries, query_encoder  # noqa: E402
from training.models.backbones import cpu_bf16_fast  # noqa: E402
from training.models.runtimes import installed  # noqa: E402
from training.models.text_runtimes import SentenceRuntime  # noqa: E402

SECTION = "## Query encoder runtimes (bench/text_runtimes.py)"


def variants(text, threads: list[int]) -> dict:
    """name → query encoder (prepare + call), the first being the fp32 reference; ONNX Runtime and OpenVINO
    once per engine thread count in ``threads`` (``[0]``: torch's count)."""
    out = {"torch fp32": FrozenTowerQueries(text, SentenceRuntime(text.st, "torch", bf16=False))}
    if cpu_bf16_fast():
        out["torch bf16 autocast"] = FrozenTowerQueries(text, SentenceRuntime(text.st, "torch"))
    for name in ("onnxruntime", "openvino"):
        if installed(name):
            for t in threads:
                rt = SentenceRuntime(text.st, name, threads=t)
                label = f"{name} {rt.precision}" + (f", {rt.threads} thread{'s' * (rt.threads > 1)}" if t else "")
                out[label] = FrozenTowerQueries(text, rt)
    out["torch int8 (--quantize-text)"] = query_encoder(text, "auto", quantize=True)[0]
    return out


@torch.inference_mode()
def embed(enc, texts: list[str]) -> np.ndarray:
    return enc(enc.prepare(texts)).float().numpy()


def ms_per_batch(enc, texts: list[str], bs: int, n: int) -> tuple[float, float]:
    """(wall ms per batch, process CPU ms per query) over ``n`` batches of ``bs`` texts."""
    batches = [texts[i:i + bs] for i in range(0, n * bs, bs)]
    embed(enc, batches[0])
    c0, t0 = time.process_time(), time.perf_counter()
    for b in batches:
        embed(enc, b)
    return (time.perf_counter() - t0) / len(batches) * 1000, (time.process_time() - c0) / (len(batches) * bs) * 1000


def t2i_rsum(q: np.ndarray, images: np.ndarray, gt: np.ndarray) -> float:
    s = q @ images.T
    rank = (s > s[np.arange(len(q)), gt][:, None]).sum(1)
    return float(sum(100 * (rank < k).mean() for k in (1, 5, 10)))


def load_text_encoder(index: Path):
    svc = Settings(models={"m": str(index)}, ui=False).search_service()
    svc.registry.load()
    return svc.registry.entries["m"]


def measure(args) -> dict:
    entry = load_text_encoder(args.index)
    text = entry.model.text
    if not getattr(text, "frozen", False):
        raise SystemExit("this index's model has no frozen sentence-transformers tower: nothing to compare")
    caps = json.loads((args.index / json.loads((args.index / "manifest.json").read_text())["files"]["captions.json"]["file"])
                      .read_text())
    texts, gt = caps["texts"], np.asarray(caps["image"])
    images = entry.index.images.vectors.astype(np.float32)
    encs = variants(text, args.threads)
    timing = {name: {bs: [] for bs in args.batches} for name in encs}
    cpu = {name: [] for name in encs}  # CPU ms per query at the largest batch
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for bs in args.batches:
            for name, enc in encs.items():
                wall, cpu_q = ms_per_batch(enc, texts, bs, max(4, args.queries // bs))
                timing[name][bs].append(wall)
                if bs == args.batches[-1]:
                    cpu[name].append(cpu_q)
    quality, ref = {}, None
    for name, enc in tqdm(encs.items(), desc="quality"):
        q = np.concatenate([embed(enc, texts[i:i + 64]) for i in range(0, len(texts), 64)])
        ref = q if ref is None else ref
        cos = (q * ref).sum(1) / np.linalg.norm(q, axis=1) / np.linalg.norm(ref, axis=1)
        quality[name] = {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "rsum": t2i_rsum(q, images, gt)}
    return {"timing": {n: {bs: float(np.median(v)) for bs, v in t.items()} for n, t in timing.items()},
            "cpu": {n: float(np.median(v)) for n, v in cpu.items()}, "quality": quality, "n_texts": len(texts), "n_images": len(images)}


def render(r: dict, args, command: str, load: float) -> str:
    names, bss = list(r["timing"]), args.batches
    base = "torch bf16 autocast" if "torch bf16 autocast" in names else "torch fp32"
    head = "| query encoder | " + " | ".join(f"ms / batch of {b}" for b in bss) + \
        f" | × {base} at {bss[-1]} | CPU ms / query at {bss[-1]} | cosine to fp32: min / mean | t2i R-sum |"
    rows = [head, "|---|" + "---:|" * (len(bss) + 4)]
    for n in names:
        t, q = r["timing"][n], r["quality"][n]
        speed = r["timing"][base][bss[-1]] / t[bss[-1]]
        rows.append(f"| {n} | " + " | ".join(f"{t[b]:.2f}" for b in bss)
                    + f" | {speed:.2f}× | {r['cpu'][n]:.2f} | {q['cos_min']:.5f} / {q['cos_mean']:.5f} | {q['rsum']:.2f} |")
    return "\n".join([
        SECTION, "",
        f"Measured {today()} with `{command}` (1-min load average at start {load:.1f}). Machine: {machine_line()}.", "",
        f"The query path of one encoder call (tokenise, the frozen tower, the model's trained head) on `{args.index}`, "
        f"median of {args.rounds} alternating rounds; quality over the index's {r['n_texts']:,} captions against its "
        f"{r['n_images']:,} images (text→image R@1 + R@5 + R@10); OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}. "
        "What `ltd serve --text-runtime auto` picks: "
        "training/models/text_runtimes.py.", "", *rows, ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=Path, required=True, help="an index folder whose model has a frozen SBERT tower")
    p.add_argument("--batches", default="1,8,16", help="batch sizes (comma-separated)")
    p.add_argument("--queries", type=int, default=160, help="queries timed per batch size, runtime and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="0",
                   help="engine threads of ONNX Runtime and OpenVINO, comma-separated (0: torch's thread count)")
    p.add_argument("--write", action="store_true", help="replace this section of BENCHMARKS.md")
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.threads = [int(t) for t in args.threads.split(",")]
    load, command = load1(), "python bench/text_runtimes.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = render(measure(args), args, command, load)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
