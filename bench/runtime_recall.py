"""R@k on the Flickr8k test split with each image runtime: the fast runtimes must not change results.

    LTD_DATA_DIR=… python bench/runtime_recall.py --checkpoint runs/x/best.pt [--write]

For every installed runtime, the test split is indexed from scratch (a fresh feature cache per
runtime, so each extracts its own features) and evaluated without nDCG; the report's R@k, medr and
rsum are compared with the torch runtime's, and the image embeddings by cosine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import publish  # noqa: E402
from bench._machine import load1, machine_line, today  # noqa: E402

SECTION = "## Image runtimes and Flickr8k test recall (bench/runtime_recall.py)"
KEYS = ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10", "rsum")


def run(args) -> dict:
    from indexer.build import EmbedEngine, IndexRequest, build_dataset_index
    from indexer.evaluate import EvalOptions, evaluate_index
    from training.models.runtimes import installed

    data = Path(os.environ["LTD_DATA_DIR"]) / "dataset_flickr8k.json"
    res = {"machine": machine_line(), "date": today(), "checkpoint": args.checkpoint, "rows": [],
           "command": "python bench/runtime_recall.py " + " ".join(args.argv)}
    ref = None
    for rt in [r for r in ("torch", "openvino", "onnxruntime") if installed(r)]:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["LTD_CACHE_DIR"] = str(Path(tmp) / "cache")
            load, t = load1(), time.perf_counter()
            request = IndexRequest(Path(tmp) / "ix", engine=EmbedEngine(runtime=rt))
            ix = build_dataset_index(args.checkpoint, data, "test", request)
            wall = time.perf_counter() - t
            rep = evaluate_index(ix, EvalOptions(relevance=None))
            vecs = np.asarray(ix.images.vectors).copy()
        ref = vecs if ref is None else ref
        row = {"runtime": rt, "wall_s": wall, "load1": load, **{k: rep[k] for k in KEYS},
               "cos_min": float(np.sum(vecs * ref, axis=1).min())}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    return res


def render(res: dict) -> str:
    ref = res["rows"][0]
    lines = [SECTION, "", f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}`. Each row indexes the 1,000 "
             "test images and 5,000 captions from scratch (its own empty feature cache) with that runtime; wall time "
             "includes model load, feature extraction and the index, under the load shown (2 cores).", "",
             "| runtime | " + " | ".join(KEYS) + " | same as torch | min cosine of image embeddings to torch | wall (s) | load |",
             "|---|" + "---:|" * (len(KEYS) + 4)]
    for r in res["rows"]:
        same = all(r[k] == ref[k] for k in KEYS)
        lines.append(f"| {r['runtime']} | " + " | ".join(f"{r[k]:.2f}" for k in KEYS) +
                     f" | {'yes' if same else '**no**'} | {r['cos_min']:.6f} | {r['wall_s']:.0f} | {r['load1']:.1f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    res = run(args)
    text = render(res)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
