"""The captioner's vocabulary: lower-case words without punctuation (Karpathy tokens), words seen
fewer than ``min_count`` times in the training captions → ``<unk>``, captions truncated to ``max_len``
words. Serialised to plain types (a list of words and two ints) inside caption checkpoints.

Ids follow ``training/data/vocab.py`` (0 ``<pad>``, 1 ``<unk>``, 2 ``<bos>``, 3 ``<eos>``).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from training.data.karpathy import tokenize
from training.data.vocab import Vocab


class CaptionVocab:
    def __init__(self, vocab: Vocab, max_len: int = 16):
        self.vocab, self.max_len = vocab, max_len
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 5, max_len: int = 16) -> CaptionVocab:
        """Counts words over whole captions (before truncation), as the paper's preprocessing does."""
        return cls(Vocab.build((tokenize(c) for c in captions), min_count=min_count), max_len)

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def words(self) -> list[str]:
        return self.vocab.words

    def encode(self, caption: str) -> list[int]:
        """Word ids of a caption, truncated to ``max_len`` (no <bos>/<eos>)."""
        return self.vocab.encode(tokenize(caption)[: self.max_len])

    def encode_batch(self, captions: Sequence[str]) -> torch.Tensor:
        """(N, max_len + 1) long: word ids, then <eos>, then <pad> (the XE targets)."""
        out = torch.full((len(captions), self.max_len + 1), self.pad_id, dtype=torch.long)
        for i, c in enumerate(captions):
            ids = self.encode(c)
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            out[i, len(ids)] = self.eos_id
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Words up to the first <eos>; <unk> is written as ``<unk>``."""
        return " ".join(self.vocab.decode(ids))

    def decode_batch(self, ids: torch.Tensor | np.ndarray) -> list[str]:
        return [self.decode(row) for row in np.asarray(ids).tolist()]

    def to_dict(self) -> dict:
        return {"words": list(self.vocab.words), "max_len": int(self.max_len)}

    @classmethod
    def from_dict(cls, d: dict) -> CaptionVocab:
        return cls(Vocab.from_dict({"words": d["words"]}), int(d["max_len"]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CaptionVocab) and self.vocab == other.vocab and self.max_len == other.max_len


def sequence_lengths(ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B,) number of words before the first <eos> (or the row length when there is none)."""
    is_eos = ids == eos_id
    first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full_like(ids[:, 0], ids.shape[1]))
    return first.long()
