"""Caption encoders. Each has ``prepare(texts, train) -> batch dict`` and ``forward(batch) -> embedding``.

- ``GRUTextEncoder``: word embeddings (GloVe-initialised, fine-tuned) → bidirectional GRU → mean over
  time of the concatenated directions → projection head → L2-normalised.
- ``SBERTTextEncoder``: a local sentence-transformers model fine-tuned end to end (TERN fine-tunes BERT
  the same way) → projection head.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from training.data.karpathy import tokenize
from training.data.vocab import Vocab, pad_batch
from training.models.heads import ProjectionHead


class GRUTextEncoder(nn.Module):
    def __init__(self, vocab: Vocab, word_dim: int, hidden: int, embed_dim: int, *, layers: int = 1,
                 head_hidden: int = 2048, batchnorm: bool = False, token_dropout: float = 0.0,
                 max_len: int = 40, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.vocab, self.max_len, self.token_dropout = vocab, max_len, token_dropout
        self.embed = nn.Embedding(len(vocab), word_dim, padding_idx=vocab.pad_id)
        if embeddings is not None:
            self.embed.weight.data.copy_(embeddings)
        self.gru = nn.GRU(word_dim, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.head = ProjectionHead(2 * hidden, embed_dim, head_hidden, "mlp", batchnorm)
        self.out_dim = embed_dim

    def prepare(self, texts: Sequence[str], train: bool = False, generator: torch.Generator | None = None) -> dict:
        ids = [self.vocab.encode(tokenize(t)[: self.max_len]) for t in texts]
        tokens, lengths = pad_batch(ids)
        if train and self.token_dropout > 0:
            drop = torch.rand(tokens.shape, generator=generator) < self.token_dropout
            tokens = torch.where(drop & (tokens != self.vocab.pad_id), torch.full_like(tokens, self.vocab.unk_id), tokens)
        return {"tokens": tokens, "lengths": lengths}

    def forward(self, batch: dict) -> torch.Tensor:
        tokens, lengths = batch["tokens"], batch["lengths"]
        x = self.embed(tokens)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        mask = (torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths.to(tokens.device)[:, None])
        pooled = (out * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)
        return self.head(pooled)


class SBERTTextEncoder(nn.Module):
    def __init__(self, model_path: str, embed_dim: int, *, head_hidden: int = 2048, batchnorm: bool = False,
                 max_len: int = 40):
        super().__init__()
        from sentence_transformers import SentenceTransformer

        self.st = SentenceTransformer(model_path, device="cpu")
        self.max_len = max_len
        self.head = ProjectionHead(self.st.get_sentence_embedding_dimension(), embed_dim, head_hidden, "mlp", batchnorm)
        self.out_dim = embed_dim

    def prepare(self, texts: Sequence[str], train: bool = False, generator: torch.Generator | None = None) -> dict:
        feats = self.st.tokenize(list(texts))
        return {k: v[:, : self.max_len + 2] for k, v in feats.items()}

    def forward(self, batch: dict) -> torch.Tensor:
        return self.head(self.st(dict(batch))["sentence_embedding"])


def move_batch(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
