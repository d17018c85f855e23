"""Every one-word-removed variant of many captions through a bidirectional GRU caption encoder, at half
the recurrent work of encoding each variant as a new text.

Removing the word at tokens [s, e) of a caption of L tokens leaves the forward direction's states
before s and the backward direction's states from e on exactly as in the full caption. So the full
captions run once (both directions, every position's state kept), and each variant only runs:
forward over tokens e…L−1 starting from the full caption's forward state at s−1, and backward over
tokens s−1…0 starting from its backward state at e. Pooling adds the shared part from prefix sums
(or maxima) of the full run. Per caption that is L(L−1) recurrent steps instead of 2L(L−1), and the
GRU is three quarters of the encoder's time on a CPU (the projection head the rest).

Only for what it is exact for: a one-layer bidirectional ``GRUTextEncoder``, captions within its
``max_len`` whose words split into the tokenizer's tokens (``search.attribution.split_words`` words are
runs of word characters; the tokenizer's are runs of [a-z0-9] inside them). Anything else (a
truncated caption, a variant left with no token) goes through the plain encoder. Checked against
encoding every variant as text in tests/test_word_usage.py.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from search.attribution import WordSpan, without
from training.data.karpathy import tokenize
from training.models.text_encoder import GRUTextEncoder


def supports(text_encoder: nn.Module) -> bool:
    """True when ``text_encoder`` is a one-layer bidirectional GRU encoder with mean or max pooling, the
    kind whose one-word-removed variants this module encodes exactly from shared states."""
    gru = getattr(text_encoder, "gru", None)
    return (type(text_encoder) is GRUTextEncoder and isinstance(gru, nn.GRU) and gru.num_layers == 1
            and gru.bidirectional and gru.batch_first and text_encoder.pool in ("mean", "max"))


def _direction(gru: nn.GRU, suffix: str) -> nn.GRU:
    """A one-direction GRU with the weights of one direction of ``gru`` (shared, not copied)."""
    one = nn.GRU(gru.input_size, gru.hidden_size, batch_first=True, bias=gru.bias)
    for name in ("weight_ih_l0", "weight_hh_l0", *(("bias_ih_l0", "bias_hh_l0") if gru.bias else ())):
        setattr(one, name, getattr(gru, name + suffix))
    return one.eval()


def _pooled_run(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor, h0: torch.Tensor, pool: str) -> torch.Tensor:
    """The sum (mean pooling) or maximum (max pooling) over time of ``gru``'s outputs on right-padded
    inputs, per row; rows of length 0 get 0 (sum) or −inf (max). Reduced straight from the packed
    outputs: no padded (rows × time × hidden) tensor is made."""
    H = gru.hidden_size
    fill = 0.0 if pool == "mean" else float("-inf")
    out = torch.full((x.shape[0], H), fill, device=x.device)
    live = torch.nonzero(lengths > 0).flatten()
    if not len(live):
        return out
    packed = pack_padded_sequence(x[live], lengths[live].cpu(), batch_first=True, enforce_sorted=False)
    data, _ = gru(packed, h0[live].unsqueeze(0).contiguous())
    order = packed.sorted_indices.to(x.device)
    rows = torch.cat([order[:int(n)] for n in packed.batch_sizes])  # the sequence of each packed output row
    target = live[rows]
    if pool == "mean":
        return out.index_add_(0, target, data.data)
    return out.scatter_reduce_(0, target[:, None].expand(-1, H), data.data, reduce="amax", include_self=True)


class GRUOcclusion:
    """``encode(texts, words)`` → the embeddings of every variant, caption by caption, word by word."""

    def __init__(self, enc: GRUTextEncoder, fallback: Callable[[list[str]], np.ndarray]):
        self.enc, self.fallback = enc, fallback
        self.fwd, self.bwd = _direction(enc.gru, ""), _direction(enc.gru, "_reverse")
        self.hidden = enc.gru.hidden_size

    def _spans(self, text: str, words: list[WordSpan]) -> list[tuple[int, int]] | None:
        """Token range of each word, or None when the shared-state shortcut would not be exact."""
        toks = tokenize(text)
        if len(toks) > self.enc.max_len or len(toks) < 1:
            return None
        spans, at = [], 0
        for w in words:
            n = len(tokenize(w.text))
            spans.append((at, at + n))
            at += n
        return spans if at == len(toks) else None

    def __call__(self, texts: list[str], words: list[list[WordSpan]]) -> np.ndarray:
        out = np.zeros((sum(len(w) for w in words), self.enc.out_dim), dtype=np.float32)
        jobs, slow = [], []  # (row in out, caption k, s, e) ; (row, variant text)
        row = 0
        for k, (text, ws) in enumerate(zip(texts, words)):
            spans = self._spans(text, ws)
            n_tok = spans[-1][1] if spans else 0
            for i, w in enumerate(ws):
                if spans is None or n_tok - (spans[i][1] - spans[i][0]) == 0:
                    slow.append((row, without(text, w)))
                else:
                    jobs.append((row, k, *spans[i]))
                row += 1
        if jobs:
            out[[j[0] for j in jobs]] = self._shared(texts, jobs)
        if slow:
            out[[r for r, _ in slow]] = self.fallback([t for _, t in slow])
        return out

    @torch.inference_mode()
    def _shared(self, texts: list[str], jobs: list[tuple[int, int, int, int]]) -> np.ndarray:
        enc, H, pool = self.enc, self.hidden, self.enc.pool
        batch = enc.prepare(texts)
        dev = next(enc.parameters()).device
        tok, lengths = batch["tokens"].to(dev), batch["lengths"].to(dev)
        C, T = tok.shape
        packed = pack_padded_sequence(enc.embed(tok), lengths.cpu(), batch_first=True, enforce_sorted=False)
        o = pad_packed_sequence(enc.gru(packed)[0], batch_first=True, total_length=T)[0]  # (C, T, 2H)
        hf, hb = o[..., :H], o[..., H:]
        pos = torch.arange(T, device=dev)
        valid = (pos[None, :] < lengths[:, None]).unsqueeze(-1)
        # shared parts: forward states before s (prefix), backward states from e on (suffix), per caption
        zero_row = torch.zeros(C, 1, H, device=dev)
        if pool == "mean":
            pre = torch.cat([zero_row, hf.cumsum(1)], 1)  # pre[c, s] = sum of hf[c, :s]
            suf = torch.cat([(hb * valid).flip(1).cumsum(1).flip(1), zero_row], 1)  # suf[c, e] = sum of hb[c, e:L]
        else:
            ninf = torch.full_like(zero_row, float("-inf"))
            pre = torch.cat([ninf, hf.masked_fill(~valid, float("-inf")).cummax(1).values], 1)
            suf = torch.cat([hb.masked_fill(~valid, float("-inf")).flip(1).cummax(1).values.flip(1), ninf], 1)
        k, s, e = (torch.tensor([j[i] for j in jobs], device=dev) for i in (1, 2, 3))
        L = lengths[k]
        h0f = torch.where((s > 0)[:, None], hf[k, (s - 1).clamp_min(0)], 0.0)
        h0b = torch.where((e < L)[:, None], hb[k, e.clamp_max(T - 1)], 0.0)
        # the new runs: forward over tokens e..L-1, backward over tokens s-1..0
        f_ids = tok[k[:, None], (e[:, None] + pos[None, :]).clamp_max(T - 1)]
        b_ids = tok[k[:, None], (s[:, None] - 1 - pos[None, :]).clamp_min(0)]
        new_f = _pooled_run(self.fwd, enc.embed(f_ids), L - e, h0f, pool)
        new_b = _pooled_run(self.bwd, enc.embed(b_ids), s, h0b, pool)
        if pool == "max":
            pf, pb = torch.maximum(pre[k, s], new_f), torch.maximum(suf[k, e], new_b)
        else:
            n = (L - (e - s)).clamp_min(1).unsqueeze(-1).float()
            pf, pb = (pre[k, s] + new_f) / n, (suf[k, e] + new_b) / n
        return enc.head(torch.cat([pf, pb], dim=-1)).float().cpu().numpy()
