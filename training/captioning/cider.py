"""CIDEr-D on token ids, batched in numpy: the self-critical reward.

Equal to ``pycocoevalcap``'s ``Cider`` (which is CIDEr-D: Gaussian length penalty σ = 6, clipped
hypothesis counts, ×10) when both see the same tokens and the same document frequencies, including
its quirk of measuring a sentence's length by its number of bigrams. Document frequencies come from
the references given to ``CiderD`` (for training: the training references, as in the
self-critical recipe); a hypothesis is scored against the references of its own image.

How it is fast: every n-gram (n ≤ 4) is one int64 key (tokens shifted by one, base ``V + 1``, so
n-grams of different orders never collide); references are turned into tf-idf vectors once; a batch
of hypotheses is matched against its images' references with one sort and one ``searchsorted``, and
the per-order sums are ``bincount``s. No Python loop runs per caption.

The end token: the self-critical reference implementation (ruotianluo/self-critical.pytorch,
``captioning/utils/rewards.py`` ``array_to_str`` and ``scripts/prepro_ngrams.py``) scores captions
with their end token as a word — every reference and its document frequencies get ``<eos>``
appended, a candidate keeps the ``<eos>`` it emitted (one cut off at the length limit has none) — so
n-grams such as "the dog <eos>" reward a caption for ending where references end, and a caption
stopped mid-phrase ("a dog runs on the") loses them. ``with_end`` builds such references;
``training/captioning/scst.py`` passes candidate lengths that include the emitted ``<eos>``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ORDERS = 4


def pad_ids(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists → (M, T) int64 array padded with -1, and lengths."""
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    out = np.full((len(seqs), max(1, int(lengths.max(initial=0)))), -1, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, lengths


def ngram_counts(tokens: np.ndarray, lengths: np.ndarray, base: int, n: int = ORDERS
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (row, n-gram) pairs of the first ``lengths[i]`` tokens of every row:
    (rows, keys, orders 0..n-1, counts), sorted by row then key."""
    tokens = np.asarray(tokens, dtype=np.int64)
    m, t = tokens.shape
    if t and (tokens[:, : lengths.max(initial=0)].max(initial=0) + 1 >= base):
        raise ValueError(f"token id >= {base - 1}: build CiderD with base > the largest id any hypothesis can hold + 1")
    rows, keys, orders = [], [], []
    shifted = tokens + 1
    for k in range(1, n + 1):
        if t < k:
            break
        key = np.zeros((m, t - k + 1), dtype=np.int64)
        for j in range(k):
            key = key * base + shifted[:, j : t - k + 1 + j]
        valid = np.arange(t - k + 1)[None, :] + k <= lengths[:, None]
        r, c = np.nonzero(valid)
        rows.append(r)
        keys.append(key[r, c])
        orders.append(np.full(len(r), k - 1, dtype=np.int64))
    if not rows:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e, e
    r, kk, o = np.concatenate(rows), np.concatenate(keys), np.concatenate(orders)
    idx = np.lexsort((kk, r))
    r, kk, o = r[idx], kk[idx], o[idx]
    new = np.ones(len(r), dtype=bool)
    new[1:] = (r[1:] != r[:-1]) | (kk[1:] != kk[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(r)))
    return r[starts], kk[starts], o[starts], counts


def with_end(refs: Sequence[Sequence[Sequence[int]]], end: int) -> list[list[list[int]]]:
    """Every reference sentence with the end token appended (the self-critical reward's references)."""
    return [[list(r) + [end] for r in image] for image in refs]


def lengths_with_end(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Token counts that include a candidate's end token: ``lengths`` (words before the first
    ``<eos>``) + 1 where the row holds that ``<eos>`` (a caption cut at the length limit has none)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return lengths + (lengths < np.asarray(ids).shape[1])


@dataclass
class _Vectors:
    """tf-idf vectors of a set of sentences, as sorted sparse entries."""

    rows: np.ndarray  # (E,) sentence of each entry
    keys: np.ndarray
    orders: np.ndarray
    values: np.ndarray  # float64 tf-idf weights
    norms: np.ndarray  # (M, 4)
    lengths: np.ndarray  # (M,) bigram counts (the toolkit's "length")


class CiderD:
    """CIDEr-D with document frequencies from ``refs`` (one list of id sequences per image).

    ``score(hyps, image)`` scores hypothesis ``i`` against the references of ``image[i]``, an index
    into ``refs``. ``sigma`` is the length-penalty width (6 in the toolkit). ``base`` must exceed every
    id a hypothesis can hold by 2 (default: the references' largest id + 2, enough only when
    hypotheses use no other words).
    """

    def __init__(self, refs: Sequence[Sequence[Sequence[int]]], *, base: int | None = None, sigma: float = 6.0,
                 df_refs: Sequence[Sequence[Sequence[int]]] | None = None):
        flat = [s for image in refs for s in image]
        counts = np.array([len(image) for image in refs], dtype=np.int64)
        if (counts == 0).any():
            raise ValueError("every image needs at least one reference")
        self.sigma = sigma
        self.base = base or (max((max(s) for s in flat if len(s)), default=0) + 2)
        self.ref_offsets = np.concatenate([[0], np.cumsum(counts)])
        self.n_refs = counts
        df_source = refs if df_refs is None else df_refs
        self._fit_document_frequency(df_source)
        tokens, lengths = pad_ids(flat)
        self.refs = self._vectors(tokens, lengths)
        e_off = np.searchsorted(self.refs.rows, np.arange(len(flat) + 1))
        self.entry_offsets = e_off  # entries of reference sentence j: e_off[j]:e_off[j+1]

    def _fit_document_frequency(self, refs: Sequence[Sequence[Sequence[int]]]) -> None:
        image_of = np.repeat(np.arange(len(refs)), [len(r) for r in refs])
        tokens, lengths = pad_ids([s for image in refs for s in image])
        rows, keys, _, _ = ngram_counts(tokens, lengths, self.base)
        img = image_of[rows]
        pairs = np.unique(np.stack([keys, img], 1), axis=0) if len(keys) else np.zeros((0, 2), np.int64)
        self.df_keys, self.df_counts = np.unique(pairs[:, 0], return_counts=True)
        self.ref_len = float(np.log(float(len(refs))))

    def _df(self, keys: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.df_keys, keys)
        pos_c = np.minimum(pos, max(len(self.df_keys) - 1, 0))
        found = (pos < len(self.df_keys)) & (self.df_keys[pos_c] == keys) if len(self.df_keys) else np.zeros(len(keys), bool)
        return np.where(found, self.df_counts[pos_c] if len(self.df_keys) else 0, 0).astype(np.float64)

    def _vectors(self, tokens: np.ndarray, lengths: np.ndarray) -> _Vectors:
        rows, keys, orders, counts = ngram_counts(tokens, lengths, self.base)
        values = counts * (self.ref_len - np.log(np.maximum(1.0, self._df(keys))))
        m = len(lengths)
        sq = np.bincount(rows * ORDERS + orders, weights=values ** 2, minlength=m * ORDERS)
        return _Vectors(rows, keys, orders, values, np.sqrt(sq).reshape(m, ORDERS), np.maximum(lengths - 1, 0))

    def score(self, hyps: np.ndarray | Sequence[Sequence[int]], image: np.ndarray | Sequence[int],
              lengths: np.ndarray | None = None) -> np.ndarray:
        """(B,) CIDEr-D of each hypothesis. ``hyps`` is a list of id lists, or a (B, T) array with
        ``lengths`` (tokens past a row's length are ignored)."""
        if lengths is None:
            hyps, lengths = pad_ids(list(hyps))
        hyps, lengths = np.asarray(hyps, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
        image = np.asarray(image, dtype=np.int64)
        b = len(lengths)
        h = self._vectors(hyps, lengths)
        # the reference sentences of every hypothesis's image: one row per (hypothesis, reference)
        first, n_ref = self.ref_offsets[image], self.n_refs[image]
        pair_hyp = np.repeat(np.arange(b), n_ref)
        pair_ref = np.repeat(first - np.concatenate([[0], np.cumsum(n_ref)[:-1]]), n_ref) + np.arange(n_ref.sum())
        # every reference entry of those pairs
        e_start, e_len = self.entry_offsets[pair_ref], np.diff(self.entry_offsets)[pair_ref]
        pair_of_entry = np.repeat(np.arange(len(pair_ref)), e_len)
        entry = np.repeat(e_start - np.concatenate([[0], np.cumsum(e_len)[:-1]]), e_len) + np.arange(e_len.sum())
        r_keys, r_vals, r_ord = self.refs.keys[entry], self.refs.values[entry], self.refs.orders[entry]
        # match on (hypothesis, n-gram): dense ids for the keys of this batch, then one composite int
        uniq, inv = np.unique(np.concatenate([h.keys, r_keys]), return_inverse=True)
        h_comp = h.rows * len(uniq) + inv[: len(h.keys)]
        r_comp = pair_hyp[pair_of_entry] * len(uniq) + inv[len(h.keys):]
        order = np.argsort(h_comp, kind="stable")
        pos = np.searchsorted(h_comp[order], r_comp)
        pos_c = np.minimum(pos, max(len(h_comp) - 1, 0))
        hit = (pos < len(h_comp)) & (h_comp[order][pos_c] == r_comp) if len(h_comp) else np.zeros(len(r_comp), bool)
        v_h = np.where(hit, h.values[order][pos_c] if len(h_comp) else 0.0, 0.0)
        contrib = np.minimum(v_h, r_vals) * r_vals
        n_pairs = len(pair_ref)
        val = np.bincount(pair_of_entry * ORDERS + r_ord, weights=contrib, minlength=n_pairs * ORDERS)
        val = val.reshape(n_pairs, ORDERS)
        denom = h.norms[pair_hyp] * self.refs.norms[pair_ref]
        val = np.where(denom != 0, val / np.where(denom != 0, denom, 1.0), val)
        delta = (h.lengths[pair_hyp] - self.refs.lengths[pair_ref]).astype(np.float64)
        val *= np.exp(-(delta ** 2) / (2 * self.sigma ** 2))[:, None]
        per_pair = val.mean(1)
        return np.bincount(pair_hyp, weights=per_pair, minlength=b) / n_ref * 10.0
