"""Decoding: greedy, sampling (with temperature) and beam search, for any step function.

``step(words (M,), state) -> (log_probs (M, V), state)`` where ``state`` is a tuple of tensors with
rows first. Every decoder starts from ``<bos>``, never emits ``<pad>``, ``<bos>`` or ``<unk>`` (their
probability is removed and the rest renormalised: ``allowed_log_probs``), and returns
(B, max_len) word ids with ``<pad>`` after the first ``<eos>``. ``<unk>`` is blocked as the
self-critical code's ``suppress_UNK`` does: a caption saying "a man is sitting on a <unk>" is no
caption, and SCST would otherwise be rewarded for it whenever the rest scores well; XE still learns
to predict it (it marks where a rare word goes). ``Specials(unk=None)`` lets it through, for analysis
(``ltd caption eval|generate --allow-unk``).

Length handling: a caption has at most ``max_len`` words. A sequence that reaches ``max_len`` words
without ``<eos>`` ends there, and its score is the sum of its words' log-probabilities (no
``<eos>`` term); a sequence that ends earlier includes log p(``<eos>``). Beam search ranks
hypotheses by the plain sum of log-probabilities (no length normalisation unless
``length_alpha > 0``, which divides final scores by ``n_words ** length_alpha``); finished
hypotheses stay in the beam and compete with unfinished ones, so with a beam as wide as the
number of sequences it returns the exact best (tests/test_captioning.py checks this exhaustively).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

StepFn = Callable[[torch.Tensor, tuple], tuple[torch.Tensor, tuple]]


@dataclass(frozen=True)
class Specials:
    pad: int = 0
    bos: int = 2
    eos: int = 3
    unk: int | None = 1  # blocked at decoding; None lets the decoders emit it (analysis only)

    @property
    def blocked(self) -> list[int]:
        return [self.pad, self.bos] + ([] if self.unk is None else [self.unk])


def allowed_log_probs(logp: torch.Tensor, sp: Specials) -> torch.Tensor:
    """The policy the decoders follow: the model's distribution without <pad>, <bos> and (unless
    ``sp.unk`` is None) <unk>, renormalised (without renormalising, REINFORCE would shift mass onto
    the blocked tokens it never samples)."""
    blocked = torch.zeros(logp.shape[1], dtype=torch.bool, device=logp.device)
    blocked[sp.blocked] = True
    return torch.log_softmax(logp.masked_fill(blocked, float("-inf")), -1)


def greedy(step: StepFn, state: tuple, n: int, max_len: int, sp: Specials = Specials()
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Most likely word at every step: (ids (n, max_len), summed log-probabilities (n,))."""
    device = state[0].device
    words = torch.full((n,), sp.bos, dtype=torch.long, device=device)
    ids = torch.full((n, max_len), sp.pad, dtype=torch.long, device=device)
    score = torch.zeros(n, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    for t in range(max_len):
        logp, state = step(words, state)
        logp = allowed_log_probs(logp, sp)
        best, words = logp.max(1)
        score = score + torch.where(done, torch.zeros_like(best), best)
        ids[:, t] = torch.where(done, torch.full_like(words, sp.pad), words)
        done = done | (words == sp.eos)
        if bool(done.all()):
            break
    return ids, score


def sample(step: StepFn, state: tuple, n: int, max_len: int, sp: Specials = Specials(), *,
           temperature: float = 1.0, generator: torch.Generator | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Words drawn from softmax(log p / temperature): (ids (n, max_len), log-probabilities of the drawn
    words under that distribution (n, max_len), keeping their graph for REINFORCE, mask (n, max_len)
    of the positions that belong to the caption, its <eos> included)."""
    device = state[0].device
    words = torch.full((n,), sp.bos, dtype=torch.long, device=device)
    ids = torch.full((n, max_len), sp.pad, dtype=torch.long, device=device)
    logps, masks = [], []
    done = torch.zeros(n, dtype=torch.bool, device=device)
    for t in range(max_len):
        logp, state = step(words, state)
        logp = allowed_log_probs(logp, sp)
        if temperature != 1.0:
            logp = torch.log_softmax(logp / temperature, -1)
        drawn = torch.multinomial(logp.detach().exp().cpu(), 1, generator=generator).squeeze(1).to(device)
        words = torch.where(done, torch.full_like(drawn, sp.eos), drawn)
        logps.append(logp.gather(1, words[:, None]).squeeze(1))
        masks.append(~done)
        ids[:, t] = torch.where(done, torch.full_like(words, sp.pad), words)
        done = done | (words == sp.eos)
        if bool(done.all()):
            break
    lp = torch.stack(logps, 1)
    mask = torch.stack(masks, 1)
    pad = max_len - lp.shape[1]
    if pad:
        lp = torch.cat([lp, lp.new_zeros(n, pad)], 1)
        mask = torch.cat([mask, mask.new_zeros(n, pad)], 1)
    return ids, lp, mask


def _reorder(state: tuple, rows: torch.Tensor) -> tuple:
    return tuple(s.index_select(0, rows) for s in state)


def beam_search(step: StepFn, state: tuple, n: int, max_len: int, beam: int = 5, sp: Specials = Specials(), *,
                length_alpha: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Beam search for ``n`` images at once. ``state`` has ``n * beam`` rows, image-major (row
    ``i * beam + k`` is beam k of image i). Returns (best ids (n, max_len), their scores (n,),
    all final beams (n, beam, max_len) best first)."""
    device = state[0].device
    k = beam
    words = torch.full((n * k,), sp.bos, dtype=torch.long, device=device)
    ids = torch.full((n * k, max_len), sp.pad, dtype=torch.long, device=device)
    scores = torch.full((n, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # identical start: only one live beam at t = 0
    done = torch.zeros(n * k, dtype=torch.bool, device=device)
    n_words = torch.zeros(n * k, dtype=torch.long, device=device)
    for t in range(max_len):
        logp, state = step(words, state)
        logp = allowed_log_probs(logp, sp)
        v = logp.shape[1]
        # a finished beam continues with one zero-cost token (<eos>) and keeps its score
        finished_row = torch.full((v,), float("-inf"), device=device)
        finished_row[sp.eos] = 0.0
        logp = torch.where(done[:, None], finished_row[None, :], logp)
        cand = (scores.reshape(n * k, 1) + logp).reshape(n, k * v)
        top, flat = cand.topk(k, dim=1)
        src = (flat // v) + torch.arange(n, device=device)[:, None] * k  # source row of each new beam
        tok = flat % v
        src, tok = src.reshape(-1), tok.reshape(-1)
        state = _reorder(state, src)
        ids = ids[src]
        prev_done = done[src]
        n_words = n_words[src] + (~prev_done & (tok != sp.eos)).long()
        ids[:, t] = torch.where(prev_done, torch.full_like(tok, sp.pad), tok)
        done = prev_done | (tok == sp.eos)
        scores = top
        words = tok
        if bool(done.all()):
            break
    final = scores.clone()
    if length_alpha > 0:
        final = final / n_words.reshape(n, k).clamp_min(1).float() ** length_alpha
    order = final.argsort(1, descending=True)
    all_ids = ids.reshape(n, k, max_len).gather(1, order[:, :, None].expand(n, k, max_len))
    best_scores = final.gather(1, order)
    return all_ids[:, 0], best_scores[:, 0], all_ids
