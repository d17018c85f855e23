"""API caption latency: POST /api/caption and /api/caption/check against a live `ltd serve`.

    python bench/caption_latency.py --model NAME=INDEX_DIR [--model …] --captioner NAME=CHECKPOINT
                                    [--captioner …] [--requests 60] [--beam 5] [--write]
    python bench/caption_latency.py --synthetic [--write]

``--synthetic`` first builds what to serve, in a temporary folder: a small retrieval model on the
embedded scenes indexed on their test split, and an XE captioner with the Flickr8k presets' sizes
(word/hidden/attention 256, 224 px input: the 7 × 7 grid) trained for 240 steps. Latency depends on
the model's sizes and on how many words it generates, not on how good it is; a barely trained
captioner says nothing (its latency would time nothing), so the words per caption are reported and a
captioner without words is refused.

Three kinds of request, each answered in full (the response is parsed and checked):
- ``image_id``: JSON, a dataset image: every captioner's beam search on the image's grid features,
  CIDEr-D against its references, the image's self-retrieval rank under every retrieval model;
- ``upload``: multipart, the same image's bytes (fetched from ``/api/images/{id}`` before timing):
  adds decoding and the CNN (grid features and, per retrieval model, the image embedding);
- ``check``: JSON, a person's caption (one of the image's references) → the image's rank per model.

Each kind runs sequentially (the wait a person sees), then all kinds mixed at ``--concurrency``.
``--write`` replaces the "API caption latency" section of BENCHMARKS.md. Loopback only.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import _machine, _server  # noqa: E402
from bench._common import replace_section  # noqa: E402

SECTION = "## API caption latency (bench/caption_latency.py)"
KINDS = ("image_id", "upload", "check")


def build_synthetic(root: Path, *, images: int = 600, epochs: int = 5) -> tuple[list[str], list[str]]:
    """(--model specs, --captioner specs) for a retrieval index and a captioner built under ``root``."""
    from app.cli import main as ltd
    from bench._models import tiny_checkpoint
    from indexer.build import IndexRequest, build_dataset_index
    from training.prepare import resolve_dataset_path

    ckpt = tiny_checkpoint(root, image_size=224, embed_dim=256)
    ds = resolve_dataset_path("", synthetic_images=images)
    ix = build_dataset_index(ckpt, ds, "test", IndexRequest(root / "index"))
    run = root / "captioner"
    # 480 training images in steps of 10 images x 5 captions: 240 steps, enough for captions of the
    # scenes' usual length
    sets = [f"data.synthetic_images={images}", "data.image_size=224", f"xe.epochs={epochs}", "xe.batch_size=10",
            "model.word_dim=256", "model.hidden=256", "model.att_dim=256"]
    if ltd(["caption", "train", "--config", "caption_synthetic_xe", "--out", str(run), "--no-progress",
            *[a for s in sets for a in ("--set", s)]]) != 0:
        raise RuntimeError("training the benchmark's captioner failed")
    return [f"bl={ix.path}"], [f"xe={run / 'best.pt'}"]


def make_requests(client, ids: list[int], refs: dict[int, str], beam: int) -> dict[str, list[dict]]:
    """Per kind, one httpx request (kwargs) per image id; uploads carry the image's served bytes."""
    out: dict[str, list[dict]] = {k: [] for k in KINDS}
    for i in ids:
        img = client.get(f"/api/images/{i}")
        img.raise_for_status()
        out["image_id"].append({"method": "POST", "url": "/api/caption", "json": {"image_id": i, "beam": beam}})
        out["upload"].append({"method": "POST", "url": "/api/caption", "data": {"beam": str(beam)},
                              "files": {"file": ("image.jpg", img.content, img.headers.get("content-type"))}})
        out["check"].append({"method": "POST", "url": "/api/caption/check",
                             "json": {"image_id": i, "caption": refs[i]}})
    return out


def timed(client, kw: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = client.request(**kw)
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{kw['url']} answered {r.status_code}: {r.text[:300]}")
    return ms, r.json()


def run_kind(client, reqs: list[dict]) -> dict:
    lat, words = [], []
    for kw in reqs:
        ms, body = timed(client, kw)
        lat.append(ms)
        for c in body.get("captions", []):
            words.append(len(c["caption"].split()))
    return summary(lat) | ({"words_mean": float(np.mean(words))} if words else {})


def summary(lat: list[float]) -> dict:
    return {"n": len(lat), "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "mean": float(np.mean(lat))}


def run_mixed(base: str, reqs: dict[str, list[dict]], concurrency: int) -> dict:
    import httpx

    mixed = [kw for trio in zip(*(reqs[k] for k in KINDS)) for kw in trio]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=base, timeout=300, limits=limits) as client:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            lat = [ms for ms, _ in pool.map(lambda kw: timed(client, kw), mixed)]
        wall = time.perf_counter() - t0
    return summary(lat) | {"wall_s": wall, "requests_per_s": len(lat) / wall}


def measure(models: list[str], captioners: list[str], n: int, beam: int, concurrency: int, log: Path) -> dict:
    import httpx

    from indexer.index import load_index_dir

    ix = load_index_dir(models[0].split("=", 1)[1])
    texts, caps = ix.captions.meta["texts"], ix.images.meta["captions"]
    rng = np.random.default_rng(0)
    picks = rng.choice(len(ix.images.ids), size=min(n, len(ix.images.ids)), replace=False)
    ids = [int(ix.images.ids[p]) for p in picks]
    refs = {int(ix.images.ids[p]): texts[caps[p][0]] for p in picks}  # each image's first reference
    args = [a for m in models for a in ("--model", m)] + [a for c in captioners for a in ("--captioner", c)]
    with _server.serving(args, log, timeout=600) as (proc, base):
        with httpx.Client(base_url=base, timeout=300) as client:
            reqs = make_requests(client, ids, refs, beam)
            for k in KINDS:  # first use of every code path (thread pools, runtimes, caches)
                timed(client, reqs[k][0])
            load0 = _machine.load1()
            seq = {k: run_kind(client, reqs[k]) for k in KINDS}
        if not seq["image_id"].get("words_mean"):
            raise RuntimeError("the captioner generated no words: its latency would be a lower bound; serve a "
                               "trained captioner (or raise build_synthetic's epochs)")
        mixed = run_mixed(base, reqs, concurrency)
        rss = _server.rss_mb(proc.pid)
    return {"sequential": seq, "mixed": mixed, "concurrency": concurrency, "rss_mb": rss, "load_before": load0,
            "load_after": _machine.load1(), "images": len(ids), "index_images": len(ix.images.ids),
            "models": len(models), "captioners": len(captioners), "beam": beam}


SYNTHETIC_NOTE = ("Built by `--synthetic`: a retrieval model on the embedded scenes indexed on their test split, "
                  "and an XE captioner with the Flickr8k presets' sizes (word/hidden/attention 256, 224 px input: "
                  "the 7 × 7 grid) trained for 240 steps on 480 scenes, so that its captions are of the usual length.")


def write(res: dict, command: str, note: str = "") -> None:
    names = {"image_id": "dataset image (JSON `image_id`)", "upload": "upload (multipart JPEG: + decode and CNN)",
             "check": "`/api/caption/check`, a person's caption"}
    rows = [f"| {names[k]} | {v['n']} | {v['p50']:.0f} | {v['p99']:.0f} | {v['mean']:.0f} | "
            f"{v.get('words_mean', float('nan')):.1f} |".replace("| nan |", "| – |") for k, v in res["sequential"].items()]
    m = res["mixed"]
    text = "\n".join([
        SECTION, "",
        f"Machine: {_machine.machine_line()}. Date: {_machine.today()}. Command: `{command}`. Load (1-minute "
        f"average, 2 cores means ~2 is full) {res['load_before']:.1f} before, {res['load_after']:.1f} after.", "",
        f"A live `ltd serve` on loopback with {res['models']} retrieval model(s) ({res['index_images']} index images) "
        f"and {res['captioners']} captioner(s); beam {res['beam']}, {res['images']} different images per kind, "
        "after one warm-up request of each kind. Latency as the client sees it (HTTP included)." + (" " + note if note else ""),
        "",
        "| request | n | p50 ms | p99 ms | mean ms | words per caption |", "|---|---:|---:|---:|---:|---:|", *rows, "",
        f"All three kinds mixed at concurrency {res['concurrency']}: p50 {m['p50']:.0f} ms, p99 {m['p99']:.0f} ms, "
        f"{m['requests_per_s']:.1f} requests/s; server resident memory afterwards {res['rss_mb']:.0f} MB."])
    replace_section(SECTION, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="NAME=INDEX_DIR")
    p.add_argument("--captioner", action="append", default=[], metavar="NAME=CHECKPOINT")
    p.add_argument("--synthetic", action="store_true", help="build a retrieval index and a captioner first")
    p.add_argument("--requests", type=int, default=60, help="different images per kind")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    if not args.synthetic and not (args.model and args.captioner):
        p.error("give --model and --captioner, or --synthetic")
    with tempfile.TemporaryDirectory(prefix="ltd_caption_latency_") as tmp:
        models, captioners = args.model, args.captioner
        if args.synthetic:
            models, captioners = build_synthetic(Path(tmp))
        res = measure(models, captioners, args.requests, args.beam, args.concurrency, Path(tmp) / "serve.log")
    print(json.dumps(res, indent=1))
    if args.write:
        command = "python bench/caption_latency.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write(res, command.strip(), SYNTHETIC_NOTE if args.synthetic else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
