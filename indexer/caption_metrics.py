"""Caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr-D with the COCO toolkit's scorers
(``pycocoevalcap``), self-retrieval R@k of generated captions, and the shares of unique and novel
captions.

- Tokenisation is the toolkit's (its Java PTBTokenizer, lower-cased, punctuation dropped), reproduced
  token for token in Python by ``indexer/ptb_tokenize.py`` (a port of the scanner's rules) so that no
  Java is needed for it.
- METEOR runs the toolkit's Java jar: it needs ``java`` on PATH (``make java-deps`` installs
  Debian's ``default-jre-headless``). Without Java it is left out and ``meteor_unavailable`` says why.
- SPICE is not supported: the toolkit's SPICE downloads Stanford CoreNLP models on first use, and
  this project never downloads at run time.
- "CIDEr-D" here is the toolkit's ``Cider`` scorer, which implements CIDEr-D (clipped counts, length
  penalty); its document frequencies come from the evaluated split's references, as in COCO.
"""
from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence

import numpy as np

from indexer.ptb_tokenize import tokenize_for_eval
from training.data.karpathy import tokenize
from training.errors import UserError

log = logging.getLogger(__name__)

SPICE_UNSUPPORTED = ("SPICE is not computed: pycocoevalcap's SPICE downloads Stanford CoreNLP models at "
                     "run time, and this project never downloads anything at run time")


class CaptionMetricsError(UserError, RuntimeError):
    """pycocoevalcap is missing or the inputs do not line up."""


def java_available() -> bool:
    return shutil.which("java") is not None


def meteor_unavailable_reason() -> str | None:
    if java_available():
        return None
    return ("METEOR needs Java (`java` is not on PATH): install a JRE, e.g. `make java-deps` "
            "(Debian's default-jre-headless); the other metrics do not need it")


def _scorers():
    try:  # lazy: optional extra (.[caption]); its absence is reported, not fatal
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.rouge.rouge import Rouge
    except ImportError as e:
        raise CaptionMetricsError(f"caption metrics need pycocoevalcap (pip install '.[caption]'): {e}") from None
    return Bleu, Rouge, Cider


def _check(gts: dict, res: dict) -> None:
    if set(gts) != set(res):
        raise CaptionMetricsError("references and candidates must cover the same keys")
    if not gts:
        raise CaptionMetricsError("nothing to score")
    for k, v in res.items():
        if not isinstance(v, list) or len(v) != 1:
            raise CaptionMetricsError(f"{k!r}: exactly one candidate caption per key, got {v!r}")
        if not gts[k]:
            raise CaptionMetricsError(f"{k!r}: no reference captions")


def coco_scores(gts: dict, res: dict, *, meteor: bool | None = None, tokenized: bool = False) -> dict:
    """Corpus scores (in [0, 1], CIDEr-D in [0, 10]) and per-caption CIDEr-D.

    ``gts``: {key: [reference, ...]}, ``res``: {key: [candidate]} (raw text unless ``tokenized``).
    ``meteor``: None = when Java is available, True = required (error without Java), False = skip.
    Returns {"BLEU-1".."BLEU-4", "ROUGE-L", "CIDEr-D", ["METEOR"], "per_caption_CIDEr-D": {key: score},
    "meteor_unavailable": reason or None}.
    """
    _check(gts, res)
    Bleu, Rouge, Cider = _scorers()
    if not tokenized:
        gts, res = tokenize_for_eval(gts), tokenize_for_eval(res)
    keys = list(gts)
    gts, res = {k: gts[k] for k in keys}, {k: res[k] for k in keys}
    out: dict = {}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    for n, b in enumerate(bleu, 1):
        out[f"BLEU-{n}"] = float(b)
    out["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    cider, per = Cider().compute_score(gts, res)
    out["CIDEr-D"] = float(cider)
    out["per_caption_CIDEr-D"] = {k: float(s) for k, s in zip(keys, per)}
    reason = meteor_unavailable_reason()
    if meteor is True and reason:
        raise CaptionMetricsError(reason)
    if meteor is not False and not reason:
        from pycocoevalcap.meteor.meteor import Meteor  # lazy: optional extra (.[caption])

        scorer = Meteor()
        try:
            out["METEOR"] = float(scorer.compute_score(gts, res)[0])
        finally:
            del scorer  # stops the Java process
    out["meteor_unavailable"] = reason if meteor is not False else "skipped"
    return out


def normalised(caption: str) -> str:
    """The form captions are compared in for uniqueness and novelty: lower-case words, no punctuation."""
    return " ".join(tokenize(caption))


def unique_share(captions: Sequence[str]) -> float:
    """Share of generated captions that no other image got (distinct captions / captions)."""
    if not captions:
        return 0.0
    return len({normalised(c) for c in captions}) / len(captions)


def novel_share(captions: Sequence[str], training_captions: Sequence[str]) -> float:
    """Share of generated captions that do not appear verbatim among the training captions."""
    if not captions:
        return 0.0
    seen = {normalised(c) for c in training_captions}
    return float(np.mean([normalised(c) not in seen for c in captions]))


def self_retrieval(sims: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Generated caption i as a text→image query over all images: R@k (%) of finding image i, and the
    median rank. ``sims`` is (n_images, n_captions) with caption i generated for image i."""
    sims = np.asarray(sims, dtype=np.float64)
    n = sims.shape[0]
    if sims.shape != (n, n):
        raise CaptionMetricsError(f"self-retrieval needs one caption per image, got scores {sims.shape}")
    own = sims[np.arange(n), np.arange(n)]
    idx = np.arange(n)
    # images scored above the caption's own image; ties count against it when the other image comes
    # first (the tie rule of indexer/metrics.py: ties go to the smaller index)
    ranks = (sims > own[None, :]).sum(0) + ((sims == own[None, :]) & (idx[:, None] < idx[None, :])).sum(0)
    out = {f"self_R@{k}": float(100.0 * np.mean(ranks < k)) for k in ks}
    out["self_medr"] = float(np.median(ranks + 1))
    return out
