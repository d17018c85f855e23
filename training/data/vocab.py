"""Word vocabulary built from training captions; serialisable into checkpoints as plain types."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from training.data.karpathy import tokenize

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)


class Vocab:
    """Maps words to ids. Ids 0..3 are ``<pad> <unk> <bos> <eos>``."""

    pad_id, unk_id, bos_id, eos_id = 0, 1, 2, 3

    def __init__(self, words: Sequence[str]):
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}")
        if len(set(words)) != len(words):
            raise ValueError("vocabulary words must be unique")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, token_lists: Iterable[Sequence[str]], min_count: int = 1, max_size: int | None = None) -> Vocab:
        """Words seen at least ``min_count`` times, most frequent first (ties alphabetical)."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counts = Counter(t for toks in token_lists for t in toks)
        kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max(0, max_size - len(SPECIALS))]
        return cls(list(SPECIALS) + kept)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Sequence[str], add_bos_eos: bool = False) -> list[int]:
        ids = [self.index.get(t, self.unk_id) for t in tokens]
        return [self.bos_id, *ids, self.eos_id] if add_bos_eos else ids

    def encode_text(self, text: str, add_bos_eos: bool = False) -> list[int]:
        return self.encode(tokenize(text), add_bos_eos)

    def decode(self, ids: Iterable[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self.words[i] if 0 <= i < len(self.words) else UNK)
        return out

    def to_dict(self) -> dict:
        return {"words": list(self.words)}

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        return cls(d["words"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.words == other.words


def pad_batch(seqs: Sequence[Sequence[int]], max_len: int | None = None, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into a (B, T) long tensor; returns (ids, lengths). Empty sequences get length 1
    (one pad token) so that packed RNNs accept them; callers treat that as an empty caption."""
    if max_len is not None:
        seqs = [s[:max_len] for s in seqs]
    lengths = torch.tensor([max(1, len(s)) for s in seqs], dtype=torch.long)
    out = torch.full((len(seqs), int(lengths.max()) if len(seqs) else 1), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out, lengths
