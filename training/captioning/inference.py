"""Captions for images: beam search (or greedy) over batches of region features."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from training.captioning.decoding import Specials, beam_search, greedy
from training.captioning.model import TopDownCaptioner
from training.captioning.vocab import CaptionVocab
from training.progress import progress_enabled


def specials(vocab: CaptionVocab, *, allow_unk: bool = False) -> Specials:
    """The vocabulary's special ids for the decoders; ``allow_unk`` lets them emit ``<unk>`` (analysis)."""
    return Specials(pad=vocab.pad_id, bos=vocab.bos_id, eos=vocab.eos_id, unk=vocab.unk_id if not allow_unk else None)


@torch.no_grad()
def decode_regions(model: TopDownCaptioner, regions: torch.Tensor, vocab: CaptionVocab, *, beam: int = 1,
                   max_len: int | None = None, allow_unk: bool = False) -> torch.Tensor:
    """(B, R, C) regions → (B, max_len) word ids (greedy when ``beam`` is 1; never ``<unk>`` unless
    ``allow_unk``)."""
    was = model.training
    model.eval()
    max_len = max_len or vocab.max_len
    dev = next(model.parameters()).device
    ctx = model.encode(regions.to(dev)).expand(beam)
    step = lambda w, st: model.step(w, ctx, st)  # noqa: E731
    state, sp = model.init_state(len(ctx)), specials(vocab, allow_unk=allow_unk)
    if beam == 1:
        ids, _ = greedy(step, state, len(ctx), max_len, sp)
    else:
        ids, _, _ = beam_search(step, state, regions.shape[0], max_len, beam, sp)
    model.train(was)
    return ids.cpu()


@dataclass(frozen=True)
class CaptionDecoding:
    """How :func:`caption_rows` decodes: beam search of width ``beam`` (1: greedy) over ``batch_size``
    images at a time, never emitting ``<unk>`` unless ``allow_unk`` (analysis)."""

    beam: int = 5
    batch_size: int = 50
    allow_unk: bool = False


def caption_rows(model: TopDownCaptioner, vocab: CaptionVocab, rows: np.ndarray,
                 load: Callable[[np.ndarray], torch.Tensor], *, decoding: CaptionDecoding | None = None,
                 desc: str = "captions") -> list[str]:
    """Captions for the images ``rows``, whose regions ``load(rows_chunk)`` returns, decoded as
    ``decoding`` says (None: the defaults of :class:`CaptionDecoding`, beam 5)."""
    d = decoding if decoding is not None else CaptionDecoding()
    out: list[str] = []
    bar = tqdm(total=len(rows), desc=desc, unit="img", disable=not progress_enabled())
    for i in range(0, len(rows), d.batch_size):
        chunk = rows[i : i + d.batch_size]
        out += vocab.decode_batch(decode_regions(model, load(chunk), vocab, beam=d.beam, allow_unk=d.allow_unk))
        bar.update(len(chunk))
    bar.close()
    return out
