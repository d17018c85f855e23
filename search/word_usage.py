"""Which words a model uses, over a whole split: every caption's word attributions for its own image.

``occlude_split`` removes each word of each caption in turn (``search.attribution``'s occlusion) and
records how the caption's score for its image and the image's rank move. It is built for a whole
split on a small CPU: the variants of hundreds of captions are encoded in one call (for a GRU
caption encoder sharing the recurrent states the variants have in common with their caption,
search/occlusion_gru.py), the full captions' embeddings are the index's own vectors (not encoded
again), and ranks come from counting the images that score at least as high
(``search.attribution.ranks_of``), never from sorting. One table per index, cached next to it
(search/derived.py).

``compare_usage`` joins two models' tables on the same (caption, word) occurrences and aggregates
per word form: how often removing the word changes the image's rank under each model, and its mean
contribution, and how far removing it moves the caption's own image (``WordStat``: the mean
|log2 rank ratio|, 0 for a word the model ignores). The gap between the two models has a 95%
interval clustered by image (the captions of one image are not independent), and the lists put the
surest differences first, so a word "one model uses and the other ignores" is a claim with its
uncertainty, not a ranking of noise.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from indexer.caption_texts import model_texts
from indexer.disagreement import check_comparable
from indexer.index import IndexDir
from search.analysis import plain_ids
from search.attribution import WordSpan, inner, occlusion_variants, ranks_of, without
from search.derived import cached_arrays
from search.errors import BadRequest
from training.progress import progress_enabled

log = logging.getLogger(__name__)

OCCLUSION_VERSION = 1
FIELDS = ("caption_row", "position", "word", "delta_score", "delta_rank", "rank")


VariantEncoder = Callable[[list[str], list[list[WordSpan]]], np.ndarray]
"""(caption texts, their words) → the embeddings of every one-word-removed variant, caption by caption."""


def text_variants(encode: Callable[[list[str]], np.ndarray]) -> VariantEncoder:
    """The plain variant encoder: every variant encoded as a new text, in one call per batch."""
    def run(texts: list[str], words: list[list[WordSpan]]) -> np.ndarray:
        return encode([without(t, w) for t, ws in zip(texts, words) for w in ws])
    return run


def _captions(ix: IndexDir) -> list[tuple[int, str, list[WordSpan]]]:
    """(row, text, words) of every caption of the split that has an image and two or more words."""
    meta = ix.captions.meta
    texts = model_texts(meta)
    out = []
    for row, (text, img) in enumerate(zip(texts, meta["image"])):
        if img is None or img < 0:
            continue
        words, variants = occlusion_variants(text, max_words=10**6)
        if variants:  # (no variant: no word, or one; nothing is left to encode without it)
            out.append((row, text, words))
    return out


def occlude_split(ix: IndexDir, encode: VariantEncoder, *, captions_per_batch: int = 256) -> dict[str, np.ndarray]:
    """One row per (caption, word) occurrence: ``FIELDS`` as arrays (``rank`` is the full caption's)."""
    caps = _captions(ix)
    keys = [(row, k, w.text.lower()) for row, _, ws in caps for k, w in enumerate(ws)]
    img_vecs = np.ascontiguousarray(ix.images.vectors, dtype=np.float32)
    rows = np.array([k[0] for k in keys], dtype=np.int64)
    image_of = np.asarray([-1 if i is None else i for i in ix.captions.meta["image"]], dtype=np.int64)
    full_own, full_rank = _full_captions(ix, img_vecs, image_of, np.unique(rows), 1024)
    image = image_of[rows]
    score = np.empty(len(keys), dtype=np.float32)
    rank = np.empty(len(keys), dtype=np.int64)
    at = 0
    starts = range(0, len(caps), captions_per_batch)
    for s in tqdm(starts, desc=f"occluding {ix.name}", unit="batch", disable=not progress_enabled()):
        chunk = caps[s:s + captions_per_batch]
        sl = slice(at, at + sum(len(ws) for _, _, ws in chunk))
        sims = inner(encode([t for _, t, _ in chunk], [ws for _, _, ws in chunk]), img_vecs)
        own = sims[np.arange(len(sims)), image[sl]]
        score[sl], rank[sl] = own, ranks_of(sims, own, in_index=True)
        at = sl.stop
    return {"caption_row": rows.astype(np.int32), "position": np.array([k[1] for k in keys], dtype=np.int32),
            "word": np.array([k[2] for k in keys], dtype=str),
            "delta_score": (full_own[rows] - score).astype(np.float32),
            "delta_rank": (rank - full_rank[rows]).astype(np.int32), "rank": full_rank[rows].astype(np.int32)}


def _full_captions(ix: IndexDir, img_vecs: np.ndarray, image_of: np.ndarray, rows: np.ndarray,
                   batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(score, rank) of each caption's own image for the full caption, indexed by caption row (only
    ``rows`` are filled): from the index's caption vectors, which are these captions' embeddings."""
    own = np.zeros(len(image_of), dtype=np.float32)
    rank = np.zeros(len(image_of), dtype=np.int64)
    for s in range(0, len(rows), batch_size):
        r = rows[s:s + batch_size]
        sims = inner(ix.captions.vectors[r], img_vecs)
        own[r] = sims[np.arange(len(r)), image_of[r]]
        rank[r] = ranks_of(sims, own[r], in_index=True)
    return own, rank


def occlusion_table(ix: IndexDir, encode: VariantEncoder) -> dict[str, np.ndarray]:
    """``occlude_split`` of the index, computed once and cached in the index folder."""
    if not ix.has_ground_truth:
        raise BadRequest(f"{ix.name} is a corpus index (no caption ↔ image links): word usage needs a dataset split")
    return cached_arrays(ix, "word_occlusion", OCCLUSION_VERSION,
                         lambda: occlude_split(ix, encode))


# ---- two models ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordExample:
    """One occurrence of a word where the two models differ most: the caption and both rank changes."""

    caption_id: int
    text: str
    a_delta_rank: int
    b_delta_rank: int


@dataclass(frozen=True)
class WordStat:
    """One word form over every occurrence in the split, under models a and b.

    How much a model *uses* a word: ``moves``, the mean over its occurrences of |log2(rank of the
    caption's image without the word / rank with it)|: 1 means removing the word halves or doubles
    the image's rank, 0 that the model ignores it. Scale-free (a move from 2 to 4 counts as much as
    one from 40 to 80) and comparable between models, like the Explorer's Δ. ``changed`` is the
    plainer share of occurrences where the rank moves at all."""

    word: str
    n: int  # occurrences (caption, position)
    images: int  # distinct images of those captions
    a_moves: float  # mean |log2(rank without / rank with)| under a
    b_moves: float
    a_changed: float  # share of occurrences where removing the word changes the image's rank under a
    b_changed: float
    a_delta_score: float  # mean score(full) − score(without)
    b_delta_score: float
    a_delta_rank: float  # mean rank(without) − rank(full)
    b_delta_rank: float
    gap: float  # b_moves − a_moves: > 0, b uses the word where a ignores it
    gap_ci: float  # half-width of the gap's 95% interval, clustered by image (inf: one image)
    examples: tuple[WordExample, ...]  # occurrences where the two models differ most, in the gap's direction

    @property
    def shown(self) -> bool:
        """The interval excludes 0 (a difference the data show, not noise)."""
        return abs(self.gap) > self.gap_ci


@dataclass(frozen=True)
class WordUsage:
    """The words two models use differently over one split, with the counts behind the table."""

    a: str
    b: str
    captions: int  # captions with two or more words
    occurrences: int
    min_count: int
    words: tuple[WordStat, ...]  # every word seen min_count times, by gap (b's most used first)
    overall: WordStat | None = None  # every occurrence of every word together

    def b_uses(self, n: int = 20) -> list[WordStat]:
        """Words b uses and a ignores, the surest first: by the lower end of the gap's interval."""
        return sorted((w for w in self.words if w.gap > 0), key=lambda w: (-(w.gap - w.gap_ci), w.word))[:n]

    def a_uses(self, n: int = 20) -> list[WordStat]:
        """Words a uses and b ignores, the surest first: by the upper end of the gap's interval."""
        return sorted((w for w in self.words if w.gap < 0), key=lambda w: (w.gap + w.gap_ci, w.word))[:n]


def _clustered_ci(d: np.ndarray, groups: np.ndarray) -> float:
    """1.96 × the cluster-robust standard error of mean(d), clusters = ``groups`` (images)."""
    n, g = len(d), np.unique(groups, return_inverse=True)[1]
    k = int(g.max()) + 1
    if k < 2:
        return float("inf")
    sums = np.bincount(g, weights=d - d.mean(), minlength=k)
    return float(1.96 * np.sqrt(k / (k - 1) * (sums**2).sum()) / n)


def _join(ta: dict, tb: dict) -> tuple[np.ndarray, np.ndarray]:
    """Indices into a's and b's tables of the occurrences both have (same caption, position and word)."""
    def keys(t):
        return np.asarray(t["caption_row"], np.int64) * 100_000 + np.asarray(t["position"], np.int64)
    _, ia, ib = np.intersect1d(keys(ta), keys(tb), assume_unique=True, return_indices=True)
    same = ta["word"][ia] == tb["word"][ib]
    return ia[same], ib[same]


def _examples(k: np.ndarray, lean: np.ndarray, rows: np.ndarray, n: int) -> list[int]:
    """Up to ``n`` occurrences (indices into the joined arrays) where the models differ most in the gap's
    direction, one per caption ("a" twice in a caption is one example)."""
    out, seen = [], set()
    for p in np.argsort(-lean, kind="stable"):
        if lean[p] <= 0 or len(out) == n:
            break
        if int(rows[k[p]]) not in seen:
            seen.add(int(rows[k[p]]))
            out.append(int(k[p]))
    return out


@dataclass(frozen=True)
class UsageOptions:
    """How :func:`compare_usage` reports: the two models' ``names``, the words it lists (those seen at least
    ``min_count`` times) and how many ``examples`` each word shows (occurrences where the models differ most)."""

    names: tuple[str, str] = ("a", "b")
    min_count: int = 5
    examples: int = 3


def compare_usage(a: IndexDir, b: IndexDir, ta: dict, tb: dict, options: UsageOptions | None = None, *,
                  keep: np.ndarray | None = None) -> WordUsage:
    """Per word form, a's and b's use of it over the occurrences both tables have (only those of the
    caption rows ``keep`` marks, when given), reported as ``options`` says (:class:`UsageOptions`; None: its
    defaults)."""
    o = options or UsageOptions()
    names, min_count, examples = o.names, o.min_count, o.examples
    check_comparable(plain_ids(a), plain_ids(b))
    ia, ib = _join(ta, tb)
    if keep is not None:
        kept = np.asarray(keep, bool)[np.asarray(ta["caption_row"], np.int64)[ia]]
        ia, ib = ia[kept], ib[kept]
    words, rows = ta["word"][ia], ta["caption_row"][ia]
    img = np.asarray(a.captions.meta["image"], dtype=np.int64)[rows]
    ra, rb = ta["delta_rank"][ia].astype(np.int64), tb["delta_rank"][ib].astype(np.int64)
    ma, mb = _moves(ta, ia), _moves(tb, ib)
    sa, sb = ta["delta_score"][ia].astype(np.float64), tb["delta_score"][ib].astype(np.float64)
    order = np.argsort(words, kind="stable")
    uniq, start, count = np.unique(words[order], return_index=True, return_counts=True)
    ids, texts = a.captions.ids, a.captions.meta["texts"]

    def stat(word: str, k: np.ndarray) -> WordStat:
        gap = float(mb[k].mean() - ma[k].mean())
        ex = _examples(k, (mb[k] - ma[k]) * (1 if gap >= 0 else -1), rows, examples)
        return WordStat(word, int(len(k)), int(len(np.unique(img[k]))), float(ma[k].mean()), float(mb[k].mean()),
                        float((ra[k] != 0).mean()), float((rb[k] != 0).mean()), float(sa[k].mean()),
                        float(sb[k].mean()), float(ra[k].mean()), float(rb[k].mean()), gap,
                        _clustered_ci(mb[k] - ma[k], img[k]),
                        tuple(WordExample(int(ids[rows[j]]), texts[rows[j]], int(ra[j]), int(rb[j])) for j in ex))

    stats = [stat(str(w), order[s0:s0 + c]) for w, s0, c in zip(uniq, start, count) if c >= min_count]
    stats.sort(key=lambda s: (-s.gap, s.word))
    return WordUsage(names[0], names[1], int(len(np.unique(rows))), int(len(ia)), min_count, tuple(stats),
                     stat("(every word)", np.arange(len(ia))) if len(ia) else None)


def _moves(t: dict, idx: np.ndarray) -> np.ndarray:
    """|log2(rank without the word / rank with it)| of the occurrences ``idx`` of a table."""
    rank = t["rank"][idx].astype(np.float64)
    return np.abs(np.log2((rank + t["delta_rank"][idx]) / rank))


def usage_markdown(u: WordUsage, top: int = 15) -> str:
    """Two tables: the words b uses and a ignores, and the reverse (``ltd compare --words``)."""
    def table(title: str, rows: list[WordStat]) -> list[str]:
        out = [f"### {title}", "", f"| word | n | images | moves {u.a} | moves {u.b} | gap (95% CI) | "
               f"changes {u.a}'s rank | changes {u.b}'s rank | mean Δscore {u.a} | mean Δscore {u.b} |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for w in rows:
            mark = "" if w.shown else " ⁿˢ"
            ci = f"± {w.gap_ci:.2f}" if np.isfinite(w.gap_ci) else "(one image: no interval)"
            out.append(f"| {w.word} | {w.n} | {w.images} | {w.a_moves:.2f} | {w.b_moves:.2f} | {w.gap:+.2f} {ci}{mark} "
                       f"| {w.a_changed:.0%} | {w.b_changed:.0%} | {w.a_delta_score:+.4f} | {w.b_delta_score:+.4f} |")
        return out + [""] if rows else out + ["(none)", ""]

    head = (f"{u.occurrences:,} word occurrences in {u.captions:,} captions; words seen at least {u.min_count} times, "
            "the surest differences first (by the interval's end nearest 0). 'moves': mean |log2(rank of the "
            "caption's image without the word / with it)| (1: removing the word halves or doubles the rank; 0: the "
            "model ignores it); 'changes the rank': share of occurrences where the rank moves at all; ⁿˢ: the 95% "
            "interval (clustered by image) includes 0; one interval per word, not corrected for the number of words "
            f"compared ({len(u.words)}: about 1 in 20 of the words without a real difference shows one by chance).")
    o = u.overall
    if o is not None:
        head += (f"\n\nEvery word together: removing one moves the caption's image by {o.a_moves:.3f} under {u.a} "
                 f"and {o.b_moves:.3f} under {u.b} (gap {o.gap:+.3f} ± {o.gap_ci:.3f}, 95% CI clustered by image); "
                 f"the rank changes at all in {o.a_changed:.0%} / {o.b_changed:.0%} of the occurrences.")
    return "\n".join([head, "", *table(f"Words {u.b} uses and {u.a} ignores", u.b_uses(top)),
                      *table(f"Words {u.a} uses and {u.b} ignores", u.a_uses(top))])

