"""ROUGE-L relevance between captions (TERN-style nDCG ground truth), exact and fast.

The LCS lengths of many (query, reference) pairs are computed at once with the bit-parallel
algorithm of Allison & Dix (1986) in the form of Hyyrö (2004): a query of m tokens is a bit vector
of m bits; for every reference token b, ``U = V & M[b]; V = (V + U) | (V - U)`` where ``M[b]`` has
the bits of the query positions holding b. After the last reference token the LCS length is the
number of zero bits among the low m bits of V. Here V is a numpy uint64 array over a block of
(reference, query) pairs, so one numpy call advances thousands of pairs by one token; queries longer
than 64 tokens use several words with the carry of ``V + U`` propagated between them.

Scores equal rouge-score's ``RougeScorer(["rougeL"]).score(reference, query).fmeasure`` (LCS-based
F1, rouge-score's default tokenizer, no stemming).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence

import numpy as np

from training.progress import progress

log = logging.getLogger(__name__)

_NON_ALNUM = re.compile(r"[^a-z0-9]+")
AGGREGATES = ("max", "mean", "tern")
TERN_BETA = 1.2  # coco-caption's ROUGE-L beta, used by TERN's relevance files
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
# Pairs advanced per numpy call: (reference block) x (query chunk) uint64 state of ~2 MB, which
# stays in a core's L2 cache between the five calls of one step.
_REF_BLOCK = 128
_QUERY_CHUNK = 2048
_AGG_ROWS = 256


def tokenize(text: str) -> list[str]:
    """rouge-score's default tokenizer: lowercase, non-[a-z0-9] runs become spaces, split."""
    return _NON_ALNUM.sub(" ", text.lower()).split()


def tern_tokenize(text: str) -> list[str]:
    """coco-caption/TERN tokenizer: lowercase, split on single spaces (punctuation kept)."""
    return text.lower().split(" ")


def _lcs_one_word(table: np.ndarray, ref_ids: np.ndarray, ref_len: np.ndarray) -> np.ndarray:
    """LCS bit state for queries of <= 64 tokens: returns V of shape (n_refs, n_queries)."""
    n_refs, n_q = ref_ids.shape[0], table.shape[1]
    v = np.full((n_refs, n_q), _ALL_ONES)
    g = np.empty_like(v)
    u = np.empty_like(v)
    for t in range(int(ref_len.max(initial=0))):
        k = int(np.count_nonzero(ref_len > t))  # references are sorted by length, longest first
        vk, gk, uk = v[:k], g[:k], u[:k]
        np.take(table, ref_ids[:k, t], axis=0, out=gk)
        np.bitwise_and(vk, gk, out=uk)
        np.subtract(vk, uk, out=gk)
        np.add(vk, uk, out=vk)
        np.bitwise_or(vk, gk, out=vk)
    return v[None]


def _lcs_multi_word(table: np.ndarray, ref_ids: np.ndarray, ref_len: np.ndarray) -> np.ndarray:
    """Same as ``_lcs_one_word`` for W-word queries: table (W, vocab, n_q) -> V (W, n_refs, n_q)."""
    n_words, n_q = table.shape[0], table.shape[2]
    v = np.full((n_words, ref_ids.shape[0], n_q), _ALL_ONES)
    for t in range(int(ref_len.max(initial=0))):
        k = int(np.count_nonzero(ref_len > t))
        carry = np.zeros((k, n_q), dtype=np.uint64)
        for w in range(n_words):
            vw = v[w, :k]
            u = vw & table[w, ref_ids[:k, t]]
            s = vw + u + carry
            carry = ((s < vw) | ((carry == 1) & (s == vw))).astype(np.uint64)
            v[w, :k] = s | (vw - u)
    return v


def _lcs_chunks(
    q_ids: Sequence[np.ndarray], r_ids: Sequence[np.ndarray], vocab_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (query indices, LCS lengths int32 (len(indices), n_refs)) chunk by chunk.

    Token id ``vocab_size`` pads references; query tokens absent from the references are -1."""
    n_r = len(r_ids)
    r_len = np.array([len(r) for r in r_ids], dtype=np.int64)
    order = np.argsort(-r_len, kind="stable")
    inverse = np.argsort(order)
    padded = np.full((n_r, int(r_len.max(initial=0))), vocab_size, dtype=np.int64)
    for row, j in enumerate(order):
        padded[row, : r_len[j]] = r_ids[j]
    r_len_sorted = r_len[order]
    q_len = np.array([len(q) for q in q_ids], dtype=np.int64)
    n_words = (q_len + 63) // 64
    if np.any(n_words == 0):  # empty queries: LCS 0 with everything
        yield np.flatnonzero(n_words == 0), np.zeros((int(np.sum(n_words == 0)), n_r), dtype=np.int32)
    jobs = []
    for w in np.unique(n_words[n_words > 0]):
        members = np.flatnonzero(n_words == w)
        chunk = max(1, _QUERY_CHUNK // int(w))
        jobs += [(int(w), members[i : i + chunk]) for i in range(0, members.size, chunk)]
    n_blocks = -(-n_r // _REF_BLOCK)
    with progress(len(jobs) * n_blocks, desc="ROUGE-L", unit="block") as bar:
        for w, qs in jobs:
            table = _match_table([q_ids[i] for i in qs], w, vocab_size)
            low = np.array([_low_bits(q_len[i], w) for i in qs], dtype=np.uint64).T  # (w, n_qs)
            lcs = np.empty((n_r, qs.size), dtype=np.int32)
            for b0 in range(0, n_r, _REF_BLOCK):
                sl = slice(b0, b0 + _REF_BLOCK)
                if w == 1:
                    v = _lcs_one_word(table[0], padded[sl], r_len_sorted[sl])
                else:
                    v = _lcs_multi_word(table, padded[sl], r_len_sorted[sl])
                lcs[sl] = np.bitwise_count(~v & low[:, None, :]).sum(axis=0, dtype=np.int32)
                bar.update()
            yield qs, lcs[inverse].T


def _low_bits(m: int, n_words: int) -> list[int]:
    """Per-word masks of the low m bits of an n_words x 64-bit vector."""
    m = int(m)
    return [(1 << min(64, max(0, m - 64 * w))) - 1 for w in range(n_words)]


def _match_table(queries: Sequence[np.ndarray], n_words: int, vocab_size: int) -> np.ndarray:
    """Match masks, uint64 (n_words, vocab_size + 1, n_queries): bit p of [w, tok, q] is set when
    token ``64 * w + p`` of query q is ``tok``. Row ``vocab_size`` (padding) stays zero."""
    table = np.zeros((n_words, vocab_size + 1, len(queries)), dtype=np.uint64)
    lens = np.array([len(q) for q in queries], dtype=np.int64)
    if lens.sum() == 0:
        return table
    toks = np.concatenate(queries)
    qi = np.repeat(np.arange(len(queries)), lens)
    pos = np.arange(toks.size) - np.repeat(np.cumsum(lens) - lens, lens)
    known = toks >= 0
    bits = np.left_shift(np.uint64(1), (pos % 64).astype(np.uint64))
    np.bitwise_or.at(table, (pos[known] // 64, toks[known], qi[known]), bits[known])
    return table


def _ids(tokens: Sequence[Sequence[str]], vocab: dict[str, int]) -> list[np.ndarray]:
    return [np.array([vocab.get(t, -1) for t in toks], dtype=np.int64) for toks in tokens]


def rouge_l_matrix(
    queries: Sequence[str],
    references: Sequence[Sequence[str]],
    *,
    aggregate: str = "max",
) -> np.ndarray:
    """ROUGE-L of every query caption against every group of reference captions.

    Parameters
    ----------
    queries: n_queries captions. references: n_groups groups (one image's captions, usually 5).
    aggregate: how the per-reference scores of a group become one relevance:

        - ``"max"`` (default): the best rouge-score ROUGE-L F1 over the group's references. TERN
          (Messina et al., ``evaluate_utils/compute_relevance.py``) aggregates by maxima too, so a
          query caption scores 1.0 against its own image, and this equals rouge-score's own
          multi-reference ``score_multi``.
        - ``"mean"``: the mean F1 over the group's references.
        - ``"tern"``: TERN's exact numbers: coco-caption's ``Rouge`` (lowercase, split on single
          spaces, precision and recall each maximised over the references *separately*, then
          F-beta with beta = 1.2).
    A progress counter runs over (query chunk, reference block) pairs (``training.progress``).

    Returns
    -------
    float32 (n_queries, n_groups); 0 where the query or the group is empty.
    """
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
    tok = tern_tokenize if aggregate == "tern" else tokenize
    flat_refs = [r for group in references for r in group]
    sizes = np.array([len(g) for g in references], dtype=np.int64)
    r_tok = [tok(r) for r in flat_refs]
    vocab: dict[str, int] = {}
    for toks in r_tok:
        for t in toks:
            vocab.setdefault(t, len(vocab))
    q_tok = [tok(q) for q in queries]
    log.info("ROUGE-L: %d queries x %d references (%d groups), vocabulary %d",
             len(queries), len(flat_refs), len(references), len(vocab))
    q_len = np.array([len(t) for t in q_tok], dtype=np.int64)
    r_len = np.array([len(t) for t in r_tok], dtype=np.int64)
    out = np.zeros((len(queries), len(references)), dtype=np.float32)
    for qs, lcs in _lcs_chunks(_ids(q_tok, vocab), _ids(r_tok, vocab), len(vocab)):
        for i in range(0, qs.size, _AGG_ROWS):  # float64 temporaries of _AGG_ROWS x n_refs
            rows = qs[i : i + _AGG_ROWS]
            out[rows] = _aggregate(lcs[i : i + _AGG_ROWS], q_len[rows], r_len, sizes, aggregate)
    return out


def _aggregate(
    lcs: np.ndarray, q_len: np.ndarray, r_len: np.ndarray, sizes: np.ndarray, how: str
) -> np.ndarray:
    """Per-group ROUGE-L (float32, (n_queries, n_groups)) from LCS lengths against every reference."""
    out = np.zeros((lcs.shape[0], sizes.size), dtype=np.float32)
    nonempty = np.flatnonzero(sizes > 0)
    if nonempty.size == 0 or lcs.shape[0] == 0:
        return out
    starts = (np.cumsum(sizes) - sizes)[nonempty]
    lcs = lcs.astype(np.float64)
    if how == "tern":
        prec = np.maximum.reduceat(lcs, starts, axis=1) / np.maximum(q_len, 1)[:, None]
        rec = np.maximum.reduceat(lcs / np.maximum(r_len, 1)[None, :], starts, axis=1)
        beta2 = TERN_BETA**2
        denom = rec + beta2 * prec
        f_beta = (1 + beta2) * prec * rec / np.where(denom > 0, denom, 1)
        score = np.where((prec > 0) & (rec > 0), f_beta, 0.0)
    else:
        total = q_len[:, None] + r_len[None, :]
        f1 = np.where(lcs > 0, 2.0 * lcs / np.maximum(total, 1), 0.0)
        if how == "max":
            score = np.maximum.reduceat(f1, starts, axis=1)
        else:
            score = np.add.reduceat(f1, starts, axis=1) / sizes[nonempty]
    out[:, nonempty] = score
    return out
