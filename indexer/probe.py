"""Linear decodability probes: how much of each caption's sentence embedding can still be read from a
model's embeddings, on the caption side and on the image side.

LTD's claim is that a contrastive loss lets the *caption* embedding drop what the batch never needs,
and that reconstructing a frozen sentence encoder's embedding keeps it. A probe measures where content
was lost: a ridge regression from a model's embeddings to the sentence-encoder targets, fitted on one
index (val) and scored on another (test) as the mean cosine between predicted and true targets.

- captions: caption embedding → that caption's target;
- images: image embedding → the mean target of the image's captions.

The floor is the intercept-only probe (every prediction = the fit split's mean target): the share of the
cosine a model's embedding adds above it is what it holds of the captions' content. The ridge strength is
chosen on a held-out fifth of the fit index, then the probe is refitted on all of it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from indexer.index import load_index_dir
from training.errors import UserFileNotFound, UserValueError
from training.targets import compute_targets

ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0)


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """Weights (d + 1, k) of ``y ≈ [x, 1] @ W`` with an L2 penalty ``alpha`` on the non-bias rows."""
    xb = np.hstack([x, np.ones((len(x), 1), x.dtype)]).astype(np.float64)
    reg = alpha * np.eye(xb.shape[1])
    reg[-1, -1] = 0.0  # the bias is not shrunk
    return np.linalg.solve(xb.T @ xb + reg, xb.T @ y.astype(np.float64))


def ridge_predict(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1), x.dtype)]).astype(np.float64) @ w


def mean_cosine(pred: np.ndarray, true: np.ndarray) -> float:
    pn = pred / np.maximum(np.linalg.norm(pred, axis=1, keepdims=True), 1e-12)
    tn = true / np.maximum(np.linalg.norm(true, axis=1, keepdims=True), 1e-12)
    return float((pn * tn).sum(axis=1).mean())


def probe(x_fit: np.ndarray, y_fit: np.ndarray, x_eval: np.ndarray, y_eval: np.ndarray) -> dict:
    """Ridge probe fitted on (x_fit, y_fit), scored on (x_eval, y_eval); alpha chosen on the fit rows' last fifth."""
    if len(x_fit) < 5:
        raise UserValueError(f"a probe needs at least 5 fitting rows, got {len(x_fit)}")
    cut = len(x_fit) - max(2, len(x_fit) // 5)
    held = {a: mean_cosine(ridge_predict(x_fit[cut:], ridge_fit(x_fit[:cut], y_fit[:cut], a)), y_fit[cut:])
            for a in ALPHAS}
    alpha = max(held, key=held.get)
    w = ridge_fit(x_fit, y_fit, alpha)
    floor = mean_cosine(np.broadcast_to(y_fit.mean(axis=0), y_eval.shape), y_eval)
    return {"cosine": mean_cosine(ridge_predict(x_eval, w), y_eval), "floor": floor, "alpha": alpha,
            "n_fit": int(len(x_fit)), "n_eval": int(len(x_eval))}


def index_targets(ix, target_model: str = "", cache_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(caption targets, image targets) of an index built from a dataset split: the sentence encoder's
    embedding of every caption as indexed, and per image the mean of its captions' targets."""
    if not ix.has_ground_truth:
        raise UserValueError(f"{ix.path}: a probe needs an index of a dataset split (captions linked to their images)")
    texts = ix.captions.meta["texts"]
    cap_t = compute_targets(texts, target_model, cache_dir=cache_dir)
    img_t = np.stack([cap_t[list(links)].mean(axis=0) for links in ix.images.meta["captions"]])
    return cap_t, img_t


def probe_indexes(fit_dir: str | Path, eval_dir: str | Path, target_model: str = "", cache_dir: str = "") -> dict:
    """Caption-side and image-side probes fitted on ``fit_dir``'s embeddings, scored on ``eval_dir``'s."""
    fit, ev = load_index_dir(fit_dir), load_index_dir(eval_dir)
    if fit.manifest.get("checkpoint_sha256") != ev.manifest.get("checkpoint_sha256"):
        raise UserValueError(f"{fit_dir} and {eval_dir} were built by different checkpoints: a probe reads one model")
    (fc, fi), (ec, ei) = (index_targets(i, target_model, cache_dir)
 for i in (fit, ev))
    out = {"captions": probe(np.asarray(fit.captions.vectors), fc, np.asarray(ev.captions.vectors), ec),
           "images": probe(np.asarray(fit.images.vectors), fi, np.asarray(ev.images.vectors), ei)}
    out["fit"], out["eval"] = str(fit.path), str(ev.path)
    out["shortcuts"] = {"fit": fit.manifest.get("shortcuts", "none"), "eval": ev.manifest.get("shortcuts", "none")}
    return out


def probe_grid(grid_dir: str | Path, fit_split: str = "val", eval_split: str = "test", target_model: str = "",
               cache_dir: str = "") -> list[dict]:
    """Probe every run of an `ltd experiment` output folder (``indexes/<cell>/seed<N>/{fit,eval}``, clean
    splits): one row per cell with the seeds' mean and sample std of the caption- and image-side cosines."""
    root = Path(grid_dir) / "indexes"
    if not root.is_dir():
        raise UserFileNotFound(f"{root}: not an `ltd experiment` output folder (no indexes/)")
    rows = []
    for cell in sorted(p for p in root.iterdir() if p.is_dir()):
        seeds = sorted(d for d in cell.glob("seed*") if (d / fit_split).is_dir() and (d / eval_split).is_dir())
        res = [probe_indexes(d / fit_split, d / eval_split, target_model, cache_dir) for d in seeds]
        if not res:
            continue
        row = {"cell": cell.name, "seeds": [d.name for d in seeds]}
        for side in ("captions", "images"):
            v = np.array([r[side]["cosine"] for r in res])
            row[side] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                         "values": v.tolist(), "floor": res[0][side]["floor"]}
        rows.append(row)
    return rows


def grid_markdown(rows: list[dict]) -> str:
    """The table of :func:`probe_grid`: mean ± std over seeds, and the floor (the mean target)."""
    out = ["| cell | seeds | caption side | image side |", "|---|---:|---:|---:|"]
    for r in rows:
        c, i = r["captions"], r["images"]
        out.append(f"| {r['cell']} | {len(r['seeds'])} | {c['mean']:.4f} ± {c['std']:.4f} | {i['mean']:.4f} ± {i['std']:.4f} |")
    if rows:
        out.append(f"| floor (the mean target) | – | {rows[0]['captions']['floor']:.4f} | {rows[0]['images']['floor']:.4f} |")
    return "\n".join(out)
