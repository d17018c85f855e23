"""Explanations: ``POST /api/explain`` latency on a live server, and the split-wide word usage.

    python bench/explain_speed.py --model bl=indexes/flickr8k_baseline --model ltd=indexes/flickr8k_ltd [--write]
    python bench/explain_speed.py --synthetic [--write]

1. A live `ltd serve` on loopback with the two models; ``--requests`` different dataset captions of
   exactly ``--words`` words (12: the issue's target) are explained, each for its own image, under
   both models (``{"caption_id": …, "models": [a, b]}``), one at a time after one warm-up request: the
   wait a person sees, HTTP included. Every answer is parsed and checked (one attribution per word
   per model).
2. In this process: the split-wide occlusion of both models (every caption of the split, each word
   removed in turn; ``search.word_usage.occlude_split``, the cache bypassed) and their per-word
   comparison, timed end to end; and the same call again through the cache.

``--synthetic`` builds two small models on the embedded scenes first (their sizes are the Flickr8k
presets': GRU 256, 1,024-d; a 600-image split). ``--write`` replaces this script's section of
BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `ltd compare` and `ltd serve` run (app/cli/__init__.py)
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import _machine, _server  # noqa: E402
from bench._common import replace_section  # noqa: E402

SECTION = "## Explanations: /api/explain and split-wide word usage (bench/explain_speed.py)"


def pick_captions(index_dir: str, words: int, n: int) -> list[int]:
    """Ids of ``n`` dataset captions with exactly ``words`` words (spread over the split)."""
    from indexer.index import load_index_dir
    from search.attribution import split_words

    ix = load_index_dir(index_dir, verify="counts")
    meta = ix.captions.meta
    rows = [r for r, (t, img) in enumerate(zip(meta["texts"], meta["image"])) if img >= 0 and len(split_words(t)) == words]
    if not rows:
        raise SystemExit(f"no caption of exactly {words} words in {index_dir}")
    picks = np.linspace(0, len(rows) - 1, min(n, len(rows))).round().astype(int)
    return [int(ix.captions.ids[rows[p]]) for p in picks]


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system, every thread): on a shared machine the wall clock
    measures the other jobs too, this does not."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def api_latency(models: list[str], ids: list[int], log: Path) -> dict:
    import httpx

    names = [m.split("=", 1)[0] for m in models]
    args = [a for m in models for a in ("--model", m)]
    with _server.serving(args, log, timeout=600) as (proc, base), httpx.Client(base_url=base, timeout=120) as client:
        def call(cid: int) -> tuple[float, dict]:
            t0 = time.perf_counter()
            r = client.post("/api/explain", json={"caption_id": cid, "models": names})
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"/api/explain answered {r.status_code}: {r.text[:300]}")
            return ms, r.json()

        call(ids[0])
        load0 = _machine.load1()
        cpu0 = _cpu_s(proc.pid)
        lat, service_ms = [], []
        for cid in ids:
            ms, body = call(cid)
            words = [len(m["words"]) for m in body["results"]]
            if len(set(words)) != 1 or words[0] < 2:
                raise RuntimeError(f"caption {cid}: attributions per model {words}")
            lat.append(ms)
            service_ms.append(sum(m["took_ms"] for m in body["results"]))
        cpu_ms = (_cpu_s(proc.pid) - cpu0) * 1000 / len(lat)
    return {"server_cpu_ms": cpu_ms, "n": len(lat), "p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
            "mean": float(np.mean(lat)), "service_p50": float(np.percentile(service_ms, 50)), "load_before": load0,
            "load_after": _machine.load1()}


def split_usage(models: list[str]) -> dict:
    """Both models' split-wide occlusion (no cache) and their comparison; then the cached path."""
    from search import SearchService
    from search.word_usage import UsageOptions, compare_usage, occlude_split

    svc = SearchService({m.split("=", 1)[0]: m.split("=", 1)[1] for m in models})
    svc.registry.load()
    try:
        a, b = svc.registry.names
        ea, eb = svc.registry.get(a), svc.registry.get(b)
        load0 = _machine.load1()
        t0, c0 = time.perf_counter(), time.process_time()
        ta = occlude_split(ea.index, svc.explainer.encode_variants(ea))
        tb = occlude_split(eb.index, svc.explainer.encode_variants(eb))
        u = compare_usage(ea.index, eb.index, ta, tb, UsageOptions(names=(a, b)))
        fresh, fresh_cpu = time.perf_counter() - t0, time.process_time() - c0
        load1 = _machine.load1()
        svc.explainer.word_usage(a, b)  # writes the caches
        svc.explainer.clear()
        t0 = time.perf_counter()
        svc.explainer.word_usage(a, b)  # reads them, as a restarted server would
        cached = time.perf_counter() - t0
    finally:
        svc.close()
    return {"seconds": fresh, "cpu_seconds": fresh_cpu, "cached_seconds": cached, "occurrences": u.occurrences, "captions": u.captions,
            "words": len(u.words), "images": len(ea.index.images.ids), "load_before": load0, "load_after": load1}


def write(res: dict, command: str, note: str) -> None:
    api, sp = res["api"], res["split"]
    ok = "within" if api["p50"] <= 200 else "over"
    ok5 = "within" if sp["seconds"] <= 300 else "over"
    text = "\n".join([
        SECTION, "",
        f"Machine: {_machine.machine_line()}. Date: {_machine.today()}. Command: `{command}`." + (f" {note}" if note else ""),
        "",
        f"**`POST /api/explain`**, a live `ltd serve` on loopback with {res['models']} models ({sp['images']:,} index "
        f"images each): {api['n']} different {res['words']}-word dataset captions, each explained for its own image "
        f"under both models, one at a time after a warm-up request. Load (1-minute average; 2 cores = ~2 is full) "
        f"{api['load_before']:.1f} before, {api['load_after']:.1f} after.", "",
        "| requests | p50 ms | p95 ms | mean ms | service p50 ms (both models) | server CPU ms / request |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {api['n']} | {api['p50']:.0f} | {api['p95']:.0f} | {api['mean']:.0f} | {api['service_p50']:.0f} | "
        f"{api['server_cpu_ms']:.0f} |", "",
        f"p50 {api['p50']:.0f} ms: {ok} the 200 ms target (issue 40). The wall clock follows the machine's load (other "
        "jobs' share of the 2 cores); the server's CPU time per request (every thread, HTTP included) does not, and "
        "is the number to compare across runs.", "",
        f"**Split-wide word usage**: every caption of the split with its own image, each word removed in turn, "
        f"under both models ({sp['occurrences']:,} word occurrences in {sp['captions']:,} captions, {sp['words']} "
        f"words seen ≥ 5×), the cache bypassed: **{sp['seconds']:.0f} s** ({ok5} the 5-minute target; "
        f"{sp['cpu_seconds']:.0f} s of CPU); through the cache next to each index afterwards: "
        f"{sp['cached_seconds']:.1f} s. Load {sp['load_before']:.1f} before, {sp['load_after']:.1f} after.", "",
        f"Both parts run with `OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}` (as `ltd serve` and `ltd compare` "
        f"do) and torch's default threads ({res['torch_threads']}). On this shared machine two thread pools cost "
        "more than the work: with the OpenMP default (spinning) policy the split-wide occlusion ran at 55 variants/s "
        "against 214 with PASSIVE (2 threads, load ~13); and numpy's OpenBLAS pool beside torch's made a "
        "13 × 1,024 by 1,024 × 1,000 score product take 120 ms instead of ~1 ms, so the scores go through torch "
        "(`search.attribution.inner`). The GRU shortcut (search/occlusion_gru.py) halves the recurrent steps: "
        "3,435 variants in 6.6 s against 9.0 s encoding each as text, 1 thread, same process."])
    replace_section(SECTION, text)


def build_synthetic(root: Path) -> list[str]:
    from app.pipeline import train_run
    from indexer.build import IndexRequest, build_dataset_index
    from training.config import load_config
    from training.prepare import resolve_dataset_path

    out = []
    for name, preset in (("bl", "synthetic_baseline"), ("ltd", "synthetic_ltd")):
        cfg = load_config(preset, ["data.synthetic_images=600", "model.embed_dim=1024", "model.text_hidden=256",
                                   "train.epochs=2"])
        res = train_run(cfg, root / "runs" / name)
        ds = resolve_dataset_path("", synthetic_images=600)
        ix = build_dataset_index(res.run_dir / "best.pt", ds, "test", IndexRequest(root / name))
        out.append(f"{name}={ix.path}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="NAME=INDEX_DIR", help="exactly two")
    p.add_argument("--synthetic", action="store_true", help="train and index two small models first")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--words", type=int, default=12)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    if not args.synthetic and len(args.model) != 2:
        p.error("give --model twice, or --synthetic")
    with tempfile.TemporaryDirectory(prefix="ltd_explain_bench_") as tmp:
        models = build_synthetic(Path(tmp)) if args.synthetic else args.model
        ids = pick_captions(models[0].split("=", 1)[1], args.words, args.requests)
        import torch

        res = {"api": api_latency(models, ids, Path(tmp) / "serve.log"), "split": split_usage(models),
               "models": len(models), "words": args.words, "torch_threads": torch.get_num_threads()}
    print(json.dumps(res, indent=1))
    if args.write:
        command = "python bench/explain_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write(res, command.strip(), "Models built by `--synthetic` (the embedded scenes, 2 epochs)." if args.synthetic
              else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
