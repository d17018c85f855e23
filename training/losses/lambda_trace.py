"""The per-step λ trace of a constraint run: written next to its checkpoint, read back for a replay.

A constraint (or replay) run writes ``lambda_trace.npz`` next to its checkpoint: ``lambda``
(float32, one entry per optimizer step: the λ that step applied) and ``eta`` (the bound it was
applied with). It is rewritten, whole, at every checkpoint (temp file + rename), and the same trace
is stored in the checkpoint's ``constraint`` state, so a resumed run rewrites a complete file.

``loss.mode=replay`` with ``loss.lambda_schedule=<run folder>`` reads that file and applies the
logged λ_t as a fixed schedule: the model's loss is L_con + λ_t·(L_rec/η − 1) with exactly the
weights the constraint run used, but without the ascent that chose them (the control that separates
"adaptive" from "large and growing").
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from training.errors import UserFileNotFound, UserValueError
from training.fsio import atomic_path

log = logging.getLogger(__name__)

TRACE_FILE = "lambda_trace.npz"


def write_lambda_trace(run_dir: str | Path, trace: np.ndarray, eta: float) -> Path:
    """Write ``run_dir/lambda_trace.npz`` atomically (whole or absent after a crash)."""
    out = Path(run_dir) / TRACE_FILE
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        np.savez(f, **{"lambda": np.asarray(trace, dtype=np.float32), "eta": np.float64(eta)})
    return out


def read_lambda_trace(source: str | Path) -> tuple[np.ndarray, float]:
    """(λ per step, η) from a run folder or a ``lambda_trace.npz`` file (no pickles are loaded)."""
    p = Path(source).expanduser()
    if p.is_dir():
        p = p / TRACE_FILE
    if not p.is_file():
        raise UserFileNotFound(f"no λ trace at {p}: loss.lambda_schedule must name a finished constraint run's "
                                f"folder (which holds {TRACE_FILE}) or the file itself")
    with np.load(p, allow_pickle=False) as z:
        if "lambda" not in z or "eta" not in z:
            raise UserValueError(f"{p} is not a λ trace (needs arrays 'lambda' and 'eta')")
        lam, eta = np.asarray(z["lambda"], dtype=np.float32), float(z["eta"])
    if lam.ndim != 1 or not np.isfinite(lam).all():
        raise UserValueError(f"{p}: 'lambda' must be a finite 1-D array, got shape {lam.shape}")
    return lam, eta
