"""Reconstruction decoders that read the caption embedding.

- LTD (latent target decoding): an MLP that predicts a frozen sentence encoder's embedding of the
  caption. It forces the caption embedding to keep what that target encodes, including features
  that the contrastive loss alone would suppress.
- ITD (input target decoding, the paper's baseline): a GRU language model conditioned on the caption
  embedding that reconstructs the caption's tokens.
"""
from __future__ import annotations

import torch
from torch import nn


class LatentTargetDecoder(nn.Module):
    def __init__(self, embed_dim: int, target_dim: int, hidden: int = 1024, layers: int = 3):
        super().__init__()
        dims = [embed_dim] + [hidden] * (layers - 1) + [target_dim]
        mods: list[nn.Module] = []
        for i in range(layers):
            mods.append(nn.Linear(dims[i], dims[i + 1]))
            if i < layers - 1:
                mods.append(nn.ReLU(inplace=True))
        self.net = nn.Sequential(*mods)
        self.target_dim = target_dim

    def forward(self, caption_emb: torch.Tensor, batch: dict | None = None) -> torch.Tensor:
        return self.net(caption_emb)


class InputTokenDecoder(nn.Module):
    """Teacher-forced GRU: h0 = tanh(W·caption_emb); inputs ``<bos> w1 … wn``; predicts ``w1 … wn <eos>``."""

    def __init__(self, embed_dim: int, vocab_size: int, hidden: int = 1024, word_dim: int = 256):
        super().__init__()
        self.init = nn.Linear(embed_dim, hidden)
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.gru = nn.GRU(word_dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, caption_emb: torch.Tensor, batch: dict) -> torch.Tensor:
        """Logits (B, T, V) for ``batch['itd_in']`` (B, T) token ids."""
        h0 = torch.tanh(self.init(caption_emb)).unsqueeze(0)
        out, _ = self.gru(self.embed(batch["itd_in"]), h0)
        return self.out(out)

    @staticmethod
    def teacher_forcing(token_ids: list[list[int]], bos: int, eos: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) padded with 0: inputs ``<bos> w…``, targets ``w… <eos>``."""
        seqs = [ids[:max_len] for ids in token_ids]
        t = max(len(s) for s in seqs) + 1
        inp = torch.zeros(len(seqs), t, dtype=torch.long)
        tgt = torch.zeros(len(seqs), t, dtype=torch.long)
        for i, s in enumerate(seqs):
            inp[i, : len(s) + 1] = torch.tensor([bos, *s])
            tgt[i, : len(s) + 1] = torch.tensor([*s, eos])
        return inp, tgt
