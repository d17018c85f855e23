"""metrics.jsonl: one JSON object per logged step, epoch and validation (losses, λ, L_rec, lr, val
metrics), appended as training goes. Readers (plots, ``ltd experiment``) rely on the keys' names."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from training.fsio import atomic_write_text


class MetricsLog:
    """Appends rows to ``path``; on resume, the lines past the checkpoint's step are dropped first (the
    file is rewritten whole, through a rename). ``path=None``: a log that writes nothing (every process
    of a data-parallel run but rank 0)."""

    def __init__(self, path: Path | None, resume_step: int | None):
        self.path = path
        if path is None:
            return
        if resume_step is None:
            atomic_write_text(path, "")
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
            # a val line at the checkpoint step belongs to the finished epoch and is kept
            atomic_write_text(path, "".join(ln + "\n" for ln in keep))

    def write(self, **row) -> None:
        if self.path is None:
            return
        clean = {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in row.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
