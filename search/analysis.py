"""What the served models tell about each other and about their training.

- ``Explorer``: every test query of two models on the same split, sorted by how much they disagree
  on the rank of the first ground truth (``indexer.disagreement``), computed once per pair.
- ``training_rows`` / ``training_figure``: the ``metrics.jsonl`` of each model's training run
  (when it sits next to the checkpoint), and the λ, L_rec, L_con and val rsum curves drawn from them.
"""
from __future__ import annotations

import json
import threading

from indexer.disagreement import compare_indexes
from search.errors import BadRequest
from search.registry import ModelEntry
from training.plots import figure_from_rows, label_for, plt

_PYPLOT_LOCK = threading.Lock()  # pyplot's figure registry is not thread-safe; servers draw from threads


class Explorer:
    def __init__(self):
        self._rows: dict[tuple[str, str], list[dict]] = {}
        self._lock = threading.Lock()

    def rows(self, a: ModelEntry, b: ModelEntry, *, direction: str = "both", winner: str = "any",
             limit: int = 200) -> list[dict]:
        if a.name == b.name:
            raise BadRequest("the explorer needs two different models")
        key = (a.name, b.name)
        with self._lock:
            if key not in self._rows:
                self._rows[key] = compare_indexes(a.index, b.index, relevance=a.relevance() is not None)
            rows = self._rows[key]
        if direction in ("t2i", "i2t"):
            rows = [r for r in rows if r["direction"] == direction]
        if winner in ("a", "b", "tie"):
            rows = [r for r in rows if r["winner"] == winner]
        return rows[:limit]


def training_rows(entry: ModelEntry) -> list[dict]:
    """The rows of the model's metrics.jsonl ([] when its run folder is not next to the checkpoint)."""
    if entry.run_dir is None:
        return []
    path = entry.run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def training_figure(entries: list[ModelEntry], smooth: int = 5, figsize: tuple[float, float] = (11, 6.2)):
    """(matplotlib figure or None, names without a metrics file): λ (log), L_rec with η, L_con, val rsum,
    one line per model."""
    series, missing = [], []
    for e in entries:
        rows = training_rows(e)
        if not rows:
            missing.append(e.name)
            continue
        label, eta = label_for(e.name, (e.index.manifest.get("model") or {}).get("loss"))
        series.append((label, eta, rows))
    if not series:
        return None, missing
    with _PYPLOT_LOCK:
        fig = figure_from_rows(series, smooth=max(1, int(smooth)), figsize=figsize)
        plt.close(fig)  # the caller renders the Figure object itself; keep pyplot's registry from growing
    return fig, missing
