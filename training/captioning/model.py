"""The Top-Down captioner (Anderson et al., CVPR 2018) over a set of image regions.

Per word: an attention LSTM reads [previous language-LSTM state, global image feature, previous
word]; its state scores every region (additive attention); the language LSTM reads [attended
region feature, attention-LSTM state] and predicts the next word. Regions are the cells of the
EfficientNet-Lite0 grid (7×7×1280 at 224 px); the global feature is their mean, i.e. the pooled
backbone feature. Sizes follow the self-critical code (512 everywhere, dropout 0.5 on the word and
feature embeddings and before the output layer).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.captioning.config import CapModelConfig

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # h_att, c_att, h_lang, c_lang


@dataclass
class Context:
    """What every decoding step reads for each row: embedded regions, their attention projection
    and the global feature. Rows are image-major, so ``expand(k)`` gives k rows per image."""

    regions: torch.Tensor  # (B, R, A)
    p_regions: torch.Tensor  # (B, R, A)
    global_: torch.Tensor  # (B, A)

    def expand(self, k: int) -> Context:
        if k == 1:
            return self
        return Context(*(t.repeat_interleave(k, 0) for t in (self.regions, self.p_regions, self.global_)))

    def index(self, rows: torch.Tensor) -> Context:
        return Context(self.regions[rows], self.p_regions[rows], self.global_[rows])

    def __len__(self) -> int:
        return self.regions.shape[0]


class TopDownCaptioner(nn.Module):
    def __init__(self, vocab_size: int, feat_dim: int = 1280, shape: CapModelConfig | None = None, *,
                 pad_id: int = 0, bos_id: int = 2):
        """``shape``: the word embedding, LSTM and attention sizes and the dropout (the run config's
        ``model`` section; None: its defaults, the self-critical code's 512 everywhere, dropout 0.5)."""
        super().__init__()
        shape = shape if shape is not None else CapModelConfig()
        word_dim, hidden, att_dim, dropout = shape.word_dim, shape.hidden, shape.att_dim, shape.dropout
        self.vocab_size, self.feat_dim, self.hidden, self.pad_id, self.bos_id = vocab_size, feat_dim, hidden, pad_id, bos_id
        self.embed = nn.Sequential(nn.Embedding(vocab_size, word_dim), nn.ReLU(), nn.Dropout(dropout))
        self.region_embed = nn.Sequential(nn.Linear(feat_dim, att_dim), nn.ReLU(), nn.Dropout(dropout))
        self.global_embed = nn.Sequential(nn.Linear(feat_dim, att_dim), nn.ReLU(), nn.Dropout(dropout))
        self.att_lstm = nn.LSTMCell(hidden + att_dim + word_dim, hidden)
        self.lang_lstm = nn.LSTMCell(att_dim + hidden, hidden)
        self.att_region = nn.Linear(att_dim, att_dim)
        self.att_hidden = nn.Linear(hidden, att_dim)
        self.att_score = nn.Linear(att_dim, 1)
        self.out_drop = nn.Dropout(dropout)
        self.logit = nn.Linear(hidden, vocab_size)

    def encode(self, regions: torch.Tensor) -> Context:
        """(B, R, C) region features → the decoding context (computed once per image)."""
        if regions.dim() != 3 or regions.shape[2] != self.feat_dim:
            raise ValueError(f"expected regions (B, R, {self.feat_dim}), got {tuple(regions.shape)}")
        emb = self.region_embed(regions)
        return Context(emb, self.att_region(emb), self.global_embed(regions.mean(1)))

    def init_state(self, n: int) -> State:
        z = self.logit.weight.new_zeros(n, self.hidden)
        return z, z, z, z

    def core(self, words: torch.Tensor, ctx: Context, state: State) -> tuple[torch.Tensor, State]:
        """One step without the output layer: the language LSTM's output (dropout applied) and the new state."""
        h_att, c_att, h_lang, c_lang = state
        h_att, c_att = self.att_lstm(torch.cat([h_lang, ctx.global_, self.embed(words)], 1), (h_att, c_att))
        scores = self.att_score(torch.tanh(ctx.p_regions + self.att_hidden(h_att)[:, None])).squeeze(2)
        attended = torch.bmm(F.softmax(scores, 1)[:, None], ctx.regions).squeeze(1)
        h_lang, c_lang = self.lang_lstm(torch.cat([attended, h_att], 1), (h_lang, c_lang))
        return self.out_drop(h_lang), (h_att, c_att, h_lang, c_lang)

    def step(self, words: torch.Tensor, ctx: Context, state: State) -> tuple[torch.Tensor, State]:
        """(M,) previous words → (M, V) log-probabilities of the next word, new state."""
        out, state = self.core(words, ctx, state)
        return F.log_softmax(self.logit(out), -1), state

    def teacher_forced(self, ctx: Context, targets: torch.Tensor, ss_prob: float = 0.0,
                       generator: torch.Generator | None = None) -> torch.Tensor:
        """(N, T, V) log-probabilities of ``targets`` (words, <eos>, <pad>…) given the previous
        words. Scheduled sampling: each previous word is, with probability ``ss_prob``, replaced by a
        sample from the model's own prediction at that position (no gradient through the choice)."""
        n, t_max = targets.shape
        steps = int((targets != self.pad_id).sum(1).max()) if n else 0
        state = self.init_state(n)
        words = targets.new_full((n,), self.bos_id)
        outs = []
        for t in range(steps):
            if t > 0:
                words = targets[:, t - 1]
                if ss_prob > 0:
                    swap = torch.rand(n, generator=generator) < ss_prob
                    if swap.any():
                        rows = swap.nonzero().squeeze(1).to(targets.device)
                        with torch.no_grad():
                            probs = F.softmax(self.logit(outs[-1][rows]), -1)
                        words = words.clone()
                        words[rows] = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(words.device)
            out, state = self.core(words, ctx, state)
            outs.append(out)
        if not outs:
            return targets.new_zeros((n, 0, self.vocab_size), dtype=torch.float)
        logits = self.logit(torch.stack(outs, 1))  # one matmul for all steps
        return F.log_softmax(logits, -1)


def build_captioner(vocab_size: int, feat_dim: int, model_cfg: CapModelConfig, pad_id: int = 0,
                    bos_id: int = 2) -> TopDownCaptioner:
    return TopDownCaptioner(vocab_size, feat_dim, model_cfg, pad_id=pad_id, bos_id=bos_id)
