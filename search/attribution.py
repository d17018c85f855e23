"""Word attributions by occlusion: how much each word of a query holds an image up, per model.

For a query and an image, every variant of the query with one word removed is encoded in one batch
together with the full query; each variant's score for the image, and the image's rank among the
index's images, against the full query's give the word's contribution:

- ``delta_score = score(full) − score(without the word)``: > 0 when the word pulls the image closer;
- ``delta_rank = rank(without) − rank(full)``: > 0 when the image drops that many places without it.

Occlusion, not gradients: it is exact for any encoder (GRU, BERT, shortcuts), it answers the
question a user asks ("would this image still come up without *red*?"), and a batch of a dozen
short captions costs about one encoder call. Its limit: a word that matters only together with
another (a synonym pair) shows a small contribution for each. The GRU encoder reads at most its
``max_len`` tokens, so words past that have no effect, and that is what the numbers say.

Ranks count the images scoring at least as high as the image (ties count against it), as
``search.captioning.image_rank`` does; an outside image (an upload) is ranked as one more candidate.
"""
from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from search.errors import BadRequest

MAX_WORDS = 64  # words per explained query: each is one more variant to encode
_WORD_RE = re.compile(r"\w+(?:['’]\w+)*")  # "dog's" is one word; "red-haired" two, as the tokenizer sees them


@dataclass(frozen=True)
class WordSpan:
    """A word of the query as the user typed it: its text and [start, end) offsets in the query."""

    text: str
    start: int
    end: int


def split_words(text: str) -> list[WordSpan]:
    """The words of ``text`` (runs of letters/digits, with inner apostrophes); punctuation and spaces between
    them are kept in place but are not words."""
    return [WordSpan(m.group(), m.start(), m.end()) for m in _WORD_RE.finditer(text)]


def without(text: str, span: WordSpan) -> str:
    """``text`` with one word cut out and the whitespace around the cut collapsed."""
    return " ".join((text[: span.start] + " " + text[span.end:]).split())


def occlusion_variants(text: str, *, max_words: int = MAX_WORDS) -> tuple[list[WordSpan], list[str]]:
    """(words, variants): variant i is ``text`` without word i. No variants for fewer than two words
    (removing the only word leaves nothing to encode); BadRequest for more than ``max_words``."""
    words = split_words(text)
    if len(words) > max_words:
        raise BadRequest(f"the query has {len(words)} words; explanations take at most {max_words}")
    return words, [without(text, w) for w in words] if len(words) >= 2 else []


def why_no_words(words: list[WordSpan]) -> str | None:
    """The message shown instead of attributions when a query has fewer than two words."""
    if not words:
        return "the query has no words (only punctuation or symbols): there is nothing to remove"
    if len(words) == 1:
        return (f"a one-word query ({words[0].text!r}) cannot be explained by removing words: removing it leaves "
                "nothing to encode; add a word or two")
    return None


def inner(q: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``q @ vectors.T`` as float32, through torch's thread pool rather than numpy's BLAS.

    Why: in a process that also runs torch, numpy's OpenBLAS keeps its own threads, and on a shared
    2-core machine the two pools fight: a 13 × 1,024 by 1,024 × 1,000 product took 120 ms through
    numpy there against ~1 ms through torch (BENCHMARKS.md, "Explanations"). ``vectors`` may be a
    read-only memory map; it is only read."""
    with warnings.catch_warnings():  # torch warns that it cannot promise not to write a read-only array
        warnings.simplefilter("ignore", UserWarning)
        v = torch.from_numpy(np.asarray(vectors, dtype=np.float32))
    return (torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)) @ v.T).numpy()


def ranks_of(scores: np.ndarray, own: np.ndarray, *, in_index: bool) -> np.ndarray:
    """Rank (1 = best) of an image for each of several queries: ``scores`` (queries × index images), ``own``
    the image's score per query. Counting, not sorting: 1 + the other images scoring at least as high. With
    ``in_index`` the image is one of the columns (and its own column equals ``own``, so it is not counted)."""
    at_least = (scores >= own[:, None]).sum(axis=1)
    return (at_least if in_index else at_least + 1).astype(np.int64)


# ---- results -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordAttribution:
    """One word of a query under one model: the image's score and rank without it, and the change."""

    word: str
    start: int  # offsets in the model's query text
    end: int
    text_without: str  # the query with this word removed (what was encoded)
    score_without: float
    rank_without: int
    delta_score: float  # score(full) − score(without): > 0 the word pulls the image closer
    delta_rank: int  # rank(without) − rank(full): > 0 the image drops that many places without the word


@dataclass(frozen=True)
class ModelAttribution:
    """The word attributions of one query for one image under one model."""

    model: str
    text: str  # the query as this model encodes it (a dataset caption's model text)
    score: float  # the full query's score for the image
    rank: int  # the image's rank for the full query (1 = best)
    of: int  # among how many images (an upload counts as one more)
    words: list[WordAttribution]  # empty for a query of fewer than two words (``note`` says why)
    took_ms: float
    note: str | None = None


@dataclass(frozen=True)
class Explanation:
    """Word attributions of one query for one image under each model."""

    text: str  # the query as shown (a dataset caption's text)
    caption_id: int | None
    image_id: int | None  # None for an upload
    upload: bool
    results: list[ModelAttribution] = field(default_factory=list)  # one per model, in the order asked

    @property
    def summary(self) -> list[str]:
        """Plain sentences about the words the models treat most differently (empty with one model)."""
        return summary_sentences(self)


def attribute(model: str, text: str, encode: Callable[[list[str]], np.ndarray], image_vectors: np.ndarray, *,
              row: int | None = None, image_vec: np.ndarray | None = None, max_words: int = MAX_WORDS) -> ModelAttribution:
    """One model's word attributions for ``text`` and one image: the index row ``row``, or an outside image
    ``image_vec``. ``encode(texts)`` embeds a list of texts in one call ((n, E), normalised)."""
    t0 = time.perf_counter()
    words, variants = occlusion_variants(text, max_words=max_words)
    unique = list(dict.fromkeys([text, *variants]))  # "a a dog": both variants are "a dog", encoded once
    vecs = encode(unique)
    at = {t: i for i, t in enumerate(unique)}
    q = vecs[[at[text], *(at[v] for v in variants)]]  # row 0 = the full query
    q = np.asarray(q, dtype=np.float32)
    scores = inner(q, image_vectors)  # (1 + words, images)
    if row is not None:
        own = scores[:, row]
    elif image_vec is not None:
        own = inner(q, np.asarray(image_vec, dtype=np.float32)[None, :])[:, 0]
    else:
        raise ValueError("give the image's index row or its vector")
    ranks = ranks_of(scores, own, in_index=row is not None)
    n = scores.shape[1] + (row is None)
    out = [WordAttribution(w.text, w.start, w.end, v, float(own[i + 1]), int(ranks[i + 1]),
                           float(own[0] - own[i + 1]), int(ranks[i + 1] - ranks[0]))
           for i, (w, v) in enumerate(zip(words, variants))]
    return ModelAttribution(model, text, float(own[0]), int(ranks[0]), n, out, (time.perf_counter() - t0) * 1000,
                            why_no_words(words))


# ---- words into sentences ------------------------------------------------------------------------
def _places(n: int) -> str:
    return f"{n} place" + ("" if n == 1 else "s")


def _signed(x: float) -> str:
    """+0.0123 / -0.0123, and 0.0000 for a change that rounds to nothing (never "-0.000")."""
    s = f"{x:+.4f}"
    return "0.0000" if float(s) == 0 else s


def _effect(m: ModelAttribution, w: WordAttribution) -> str:
    if w.delta_rank > 0:
        return f"{m.model} drops it {_places(w.delta_rank)}"
    if w.delta_rank < 0:
        return f"{m.model} moves it up {_places(-w.delta_rank)}"
    return f"{m.model} ranks it the same"


def summary_sentences(ex: Explanation, limit: int = 2) -> list[str]:
    """Plain sentences about the words the models treat most differently, e.g. "Without *red*, bl ranks
    it the same; ltd drops it 40 places." (one model: its most important word)."""
    ms = [m for m in ex.results if m.words]
    notes = list(dict.fromkeys(m.note[0].upper() + m.note[1:] + "." for m in ex.results if m.note))
    if len(ms) == 1 or (ms and any(len(m.words) != len(ms[0].words) for m in ms)):
        out = []
        for m in ms:
            top = max(m.words, key=lambda w: (abs(w.delta_rank), abs(w.delta_score)))
            out.append(f"{m.model} ranks this image {m.rank} of {m.of}; its most important word is *{top.word}* "
                       f"(without it, {_effect(m, top)}).")
        return notes + out
    if not ms:
        return notes
    a, b = ms[0], ms[1]
    gap = sorted(range(len(a.words)), key=lambda i: (-abs(b.words[i].delta_rank - a.words[i].delta_rank),
                                                       -abs(b.words[i].delta_score - a.words[i].delta_score)))
    out = []
    for i in gap[:limit]:
        wa, wb = a.words[i], b.words[i]
        if wa.delta_rank == wb.delta_rank and out:
            break
        if wa.delta_rank == wb.delta_rank:
            d = wa.delta_rank
            body = ("both rank it the same" if d == 0 else f"both drop it {_places(d)}" if d > 0
                    else f"both move it up {_places(-d)}")
            out.append(f"Without *{wa.word}*, {body} (Δscore {_signed(wa.delta_score)} for {a.model}, "
                       f"{_signed(wb.delta_score)} for {b.model}).")
        else:
            out.append(f"Without *{wa.word}*, {_effect(a, wa)}; {_effect(b, wb)}.")
    return notes + out
