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

from training.config import ModelConfig
from training.data.karpathy import tokenize
from training.data.vocab import Vocab, pad_batch
from training.errors import UserValueError
from training.models.heads import ProjectionHead
from training.models.text_runtimes import torch_sentence_embeddings
from training.targets import compute_targets, load_sentence_model

MEMORY_MAX = 500_000  # frozen sentence embeddings kept in memory (a long-running server must not grow without bound)
CORPUS_MIN = 512      # embed_corpus: fewer new texts than this stay in memory only


class GRUTextEncoder(nn.Module):
    def __init__(self, vocab: Vocab, m: ModelConfig, *, max_len: int = 40, embeddings: torch.Tensor | None = None):
        """Word embeddings (``embeddings``' width when given, else ``m.word_dim``) → a bi-GRU of
        ``m.text_layers`` layers and ``m.text_hidden`` units per direction, pooled by ``m.text_pool``
        → the projection head (``m.text_head``, ``m.head_hidden``, ``m.batchnorm``) into ``m.embed_dim``;
        ``m.token_dropout`` while training, captions cut at ``max_len`` words."""
        super().__init__()
        word_dim = embeddings.shape[1] if embeddings is not None else m.word_dim
        hidden, embed_dim, token_dropout, pool = m.text_hidden, m.embed_dim, m.token_dropout, m.text_pool
        if pool not in ("mean", "max"):
            raise ValueError(f"pool must be mean or max, not {pool!r}")
        self.vocab, self.max_len, self.token_dropout, self.pool = vocab, max_len, token_dropout, pool
        self.embed = nn.Embedding(len(vocab), word_dim, padding_idx=vocab.pad_id)
        if embeddings is not None:
            self.embed.weight.data.copy_(embeddings)
        self.gru = nn.GRU(word_dim, hidden, num_layers=m.text_layers, batch_first=True, bidirectional=True)
        self.head = ProjectionHead(2 * hidden, embed_dim, m.head_hidden, m.text_head, m.batchnorm)
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
        if self.pool == "max":  # over the caption's own words: a padding position never wins
            pooled = out.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)
        else:
            pooled = (out * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)
        return self.head(pooled)


class SBERTTextEncoder(nn.Module):
    """A local sentence-transformers model as the caption encoder, plus a projection head.

    ``train_layers``: -1 fine-tunes every transformer layer (TERN fine-tunes BERT this way); 0 keeps
    the model frozen — its sentence embeddings are computed once (no gradient) and remembered, so
    training runs the head only; k > 0 fine-tunes the top k layers and freezes the rest.
    """

    def __init__(self, model_path: str, m: ModelConfig, *, max_len: int = 40, cache_dir: str = ""):
        """``m``: the joint space's size (``embed_dim``), the layers fine-tuned (``sbert_train_layers``, as
        ``train_layers`` above) and the projection head (``text_head``, ``head_hidden``, ``batchnorm``)."""
        super().__init__()
        embed_dim, train_layers = m.embed_dim, m.sbert_train_layers
        self.st = load_sentence_model(model_path)
        # word pieces: a caption of max_len words rarely needs more than 2 per word (+ CLS/SEP)
        self.st.max_seq_length = min(self.st.max_seq_length, 2 * max_len + 2)
        self.max_len, self.train_layers, self.model_path = max_len, train_layers, model_path
        self.frozen = train_layers == 0
        self.cache_dir = cache_dir  # where embed_corpus keeps a frozen encoder's embeddings ("" = the default cache)
        dim_of = getattr(self.st, "get_embedding_dimension", None) or self.st.get_sentence_embedding_dimension
        self.head = ProjectionHead(dim_of(), embed_dim, m.head_hidden, m.text_head, m.batchnorm)
        self.out_dim = embed_dim
        self._memory: dict[str, torch.Tensor] = {}
        train_top_layers(self.st, train_layers)

    def transformer_layers(self) -> list[nn.Module]:
        return transformer_layers(self.st)

    def frozen_prefixes(self) -> list[str]:
        """State-dict prefixes rebuilt from the model folder instead of being saved."""
        return ["st."] if self.frozen else []

    def remember(self, texts: Sequence[str], embeddings: torch.Tensor) -> None:
        """Seed the frozen-embedding memory (e.g. from the on-disk target cache)."""
        if len(self._memory) + len(texts) > MEMORY_MAX:  # a long-running server must not grow without bound
            self._memory.clear()
        for t, e in zip(texts, embeddings):
            self._memory[t] = e

    def embed_corpus(self, texts: Sequence[str]) -> None:
        """A whole caption corpus (every training caption, a val/test split, an index's captions) through
        the on-disk cache, so that runs sharing the corpus and the model embed it once between them
        (a frozen all-mpnet-base-v2 takes minutes per 10k captions on a 2-core CPU). No-op unless frozen,
        and for fewer than CORPUS_MIN new texts (queries stay in memory: no file per request)."""
        if not self.frozen:
            return
        uniq = list(dict.fromkeys(texts))
        if sum(t not in self._memory for t in uniq) < CORPUS_MIN:
            return
        emb = compute_targets(uniq, self.model_path, cache_dir=self.cache_dir, model=self.st,
                              max_seq_length=self.st.max_seq_length)
        self.remember(uniq, torch.from_numpy(emb))

    @torch.no_grad()
    def _frozen_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        missing = list(dict.fromkeys(t for t in texts if t not in self._memory))
        if missing:
            emb = torch_sentence_embeddings(self.st, missing)
            new = dict(zip(missing, emb))
            out = torch.stack([new[t] if t in new else self._memory[t] for t in texts])
            self.remember(missing, emb)  # may clear the memory first: `out` is already built
            return out
        return torch.stack([self._memory[t] for t in texts])

    def prepare(self, texts: Sequence[str], train: bool = False, generator: torch.Generator | None = None) -> dict:
        if self.frozen:
            return {"sentence_embedding": self._frozen_embeddings(list(texts))}
        return dict(self.st.tokenize(list(texts)))

    def forward(self, batch: dict) -> torch.Tensor:
        x = batch["sentence_embedding"] if "sentence_embedding" in batch else self.st(dict(batch))["sentence_embedding"]
        return self.head(x)


def transformer_layers(st: nn.Module) -> list[nn.Module]:
    """The transformer layers of a sentence-transformers model (BERT-like ``encoder.layer``)."""
    for mod in st.modules():
        enc = getattr(mod, "encoder", None)
        if enc is not None and isinstance(getattr(enc, "layer", None), nn.ModuleList):
            return list(enc.layer)
    raise UserValueError("cannot find the transformer layers of this sentence-transformers model")


def train_top_layers(st: nn.Module, k: int) -> None:
    """-1: every parameter trains; 0: none; k > 0: only the top k transformer layers."""
    if k < 0:
        return
    for p in st.parameters():
        p.requires_grad_(False)
    layers = transformer_layers(st)
    if k > len(layers):
        raise UserValueError(f"model.sbert_train_layers={k} but the model has {len(layers)} layers")
    for layer in layers[len(layers) - k:]:
        for p in layer.parameters():
            p.requires_grad_(True)


def take_rows(batch: dict, rows: slice, n: int) -> dict:
    """Rows ``rows`` of a prepared batch of ``n`` captions: every tensor or list with n rows is sliced
    (a data-parallel process prepares the global batch, so its random draws are the global batch's,
    and encodes its own rows). The whole batch is returned as is."""
    if rows == slice(0, n):
        return batch
    return {k: (v[rows] if (torch.is_tensor(v) and v.dim() and v.shape[0] == n) or (isinstance(v, list) and len(v) == n)
                else v) for k, v in batch.items()}
