"""Fingerprint tiny synthetic training runs over every path of the loop, bitwise (a tool, not a test).

    LTD_CACHE_DIR=/tmp/fp/cache python tests/train_fingerprint.py /tmp/fp/before.json   # old code
    LTD_CACHE_DIR=/tmp/fp/cache python tests/train_fingerprint.py /tmp/fp/after.json    # new code
    python tests/train_fingerprint.py --compare /tmp/fp/before.json /tmp/fp/after.json

Cases: none, dual, constraint, replay of that constraint run, ITD mean (dual) and sum (constraint),
triplet, IFM, order, sh_mh with a curriculum that switches (constant val) and with the real
validator, the sbert caption encoder frozen and partial (FNE, linear heads), multi-view with token
and feature dropout, SWA, unfreezing into end-to-end image batches, AdamW with a constant schedule
and no clipping, and three killed-then-resumed runs (mid-epoch, epoch boundary, across the
curriculum switch). ``FP_RUNS`` names the folder the runs are written to (default: beside OUT).
Run old and new code with the same warm cache: a frozen sentence encoder that computes its
embeddings (cold cache) leaves Python's ``random`` state elsewhere than one reading them.

A fingerprint holds, per case: the metrics.jsonl lines (text, with the wall-clock ``seconds`` key
removed), the lambda_trace.npz arrays, and a sha256 of every tensor and plain value in checkpoint.pt
and best.pt (versions excluded). Run it on the code before a refactor and after; equal fingerprints
mean every logged number, every weight, every optimiser moment and every RNG state is identical.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # conftest's tiny_config


def digest(obj) -> object:
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        return f"tensor{tuple(t.shape)}:{t.dtype}:" + hashlib.sha256(t.view(torch.uint8).numpy().tobytes()
                                                                    if t.numel() else b"").hexdigest()[:16]
    if isinstance(obj, np.ndarray):
        return f"array{obj.shape}:{obj.dtype}:" + hashlib.sha256(obj.tobytes()).hexdigest()[:16]
    if isinstance(obj, dict):
        return {str(k): digest(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [digest(v) for v in obj]
    if isinstance(obj, float):
        return repr(obj)
    return obj


def fingerprint_run(run: Path) -> dict:
    import numpy as np
    import torch

    out: dict = {"metrics": []}
    for ln in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(ln)
        row.pop("seconds", None)
        out["metrics"].append(json.dumps(row))
    for name in ("checkpoint.pt", "best.pt"):
        if (run / name).exists():
            ck = torch.load(run / name, weights_only=True)
            ck.pop("versions", None)
            out[name] = digest(ck)
    if (run / "lambda_trace.npz").exists():
        with np.load(run / "lambda_trace.npz") as z:
            out["lambda_trace"] = {k: z[k].tolist() for k in z.files}
    return out


class Killed(Exception):
    pass


def kill_after(when):
    """Patch the loop's save_checkpoint so the run stops right after a checkpoint where when(payload)."""
    from training import loop

    real = loop.save_checkpoint

    def save_then_die(path, payload):
        real(path, payload)
        if path.name == "checkpoint.pt" and when(payload):
            raise Killed

    loop.save_checkpoint = save_then_die
    return lambda: setattr(loop, "save_checkpoint", real)


def cases(root: Path):
    from conftest import tiny_config

    const = lambda m: {"rsum": 1.0}  # noqa: E731  never improves after epoch 1: the curriculum switches
    yield "none", tiny_config("none"), {}
    yield "dual", tiny_config("dual", ["loss.beta=0.7"]), {}
    yield "constraint", tiny_config("constraint", ["train.epochs=3"]), {}
    yield "replay", tiny_config("replay", [f"loss.lambda_schedule={root / 'constraint'}", "train.epochs=3"]), {}
    yield "itd_mean_dual", tiny_config("dual", ["loss.decoder=itd", "train.epochs=1"]), {}
    yield "itd_sum_constraint", tiny_config("constraint", ["loss.decoder=itd", "loss.itd_reduction=sum",
                                                            "loss.eta=20", "train.epochs=1"]), {}
    yield "triplet", tiny_config("none", ["loss.contrastive=triplet", "model.batchnorm=true", "train.epochs=1"]), {}
    yield "ifm", tiny_config("none", ["loss.contrastive=ifm", "train.epochs=1"]), {}
    yield "order", tiny_config("none", ["loss.contrastive=order", "train.epochs=1"]), {}
    yield "sh_mh", tiny_config("none", ["loss.contrastive=sh_mh", "loss.curriculum_patience=1",
                                        "train.epochs=3"]), {"validate": const}
    yield "sh_mh_real_val", tiny_config("none", ["loss.contrastive=sh_mh", "loss.curriculum_patience=1",
                                                 "train.epochs=3"]), {}
    for layers in (0, 1):
        yield f"sbert_{layers}", tiny_config("none", ["model.text_encoder=sbert", f"model.sbert_train_layers={layers}",
                                                      "model.image_features=fne", "model.image_head=linear",
                                                      "train.epochs=1"]), {}
    yield "multi_view", tiny_config("constraint", ["model.token_dropout=0.2", "model.crops=2",
                                                   "model.feature_dropout=0.3", "train.epochs=2"]), {}
    yield "swa", tiny_config("dual", ["train.swa=true", "train.epochs=2"]), {}
    yield "e2e_unfreeze", tiny_config("dual", ["model.freeze_backbone=true", "model.unfreeze_after_epoch=1",
                                               "train.epochs=2", "train.batch_size=64"]), {}
    yield "adamw_constant", tiny_config("dual", ["optim.optimizer=adamw", "optim.weight_decay=0.01",
                                                 "optim.schedule=constant", "optim.grad_clip=0",
                                                 "train.epochs=1"]), {}
    # resumes: killed then resumed runs; their fingerprint must also equal the uninterrupted ones'
    yield "resume_mid_epoch", tiny_config("none", ["train.checkpoint_every=2", "train.epochs=1"]), \
        {"kill": lambda p: p["step_in_epoch"] == 2}
    yield "resume_epoch_constraint", tiny_config("constraint", ["model.token_dropout=0.2", "model.crops=2",
                                                                "model.feature_dropout=0.3", "train.epochs=3"]), \
        {"kill": lambda p: p["epoch"] == 1}
    yield "resume_sh_mh", tiny_config("none", ["loss.contrastive=sh_mh", "loss.curriculum_patience=1",
                                               "train.epochs=3"]), \
        {"validate": const, "kill": lambda p: p["epoch"] == 2}


def run_all(out: Path) -> None:
    from app.pipeline import train_run
    from training.loop import train

    logging.basicConfig(level=logging.WARNING)
    root = Path(os.environ.get("FP_RUNS", out.parent / "runs"))
    shutil.rmtree(root, ignore_errors=True)
    result = {}
    for name, cfg, opts in cases(root):
        t = time.time()
        run = root / name

        def go(resume=False, cfg=cfg, run=run, opts=opts):
            if "validate" in opts:
                return train(cfg, run, validate=opts["validate"], resume=resume)
            return train_run(cfg, run, resume=resume)

        if "kill" in opts:
            restore = kill_after(opts["kill"])
            try:
                go()
                raise AssertionError(f"{name}: the kill never fired")
            except Killed:
                pass
            finally:
                restore()
            go(resume=True)
        else:
            go()
        result[name] = fingerprint_run(run)
        print(f"{name}: {time.time() - t:.1f}s, {len(result[name]['metrics'])} rows", flush=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True))


def compare(a: Path, b: Path) -> int:
    A, B = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in sorted(set(A) | set(B)):
        if A.get(name) == B.get(name):
            print(f"{name}: identical ({len(A[name]['metrics'])} metrics rows)")
            continue
        bad += 1
        x, y = A.get(name) or {}, B.get(name) or {}
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                print(f"{name}: {key} DIFFERS")
                if key == "metrics":
                    for i, (p, q) in enumerate(zip(x[key], y[key])):
                        if p != q:
                            print(f"   row {i}:\n   {p}\n   {q}")
                            break
                elif isinstance(x.get(key), dict):
                    for k in sorted(set(x[key]) | set(y.get(key, {}))):
                        if x[key].get(k) != y[key].get(k):
                            print(f"   {k}: {str(x[key].get(k))[:150]} != {str(y[key].get(k))[:150]}")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    run_all(Path(sys.argv[1]))
