"""open_clip's default tokenizer, written here: CLIP's byte-level BPE over open_clip's vocabulary file.

The vocabulary is ``bpe_simple_vocab_16e6.txt.gz`` (a header line, then one merge "a b" per line):
ids are the 256 byte symbols, the same with ``</w>``, one per merge (the first 48,894), then
``<start_of_text>`` and ``<end_of_text>``. Text is cleaned as open_clip cleans it (``ftfy.fix_text``,
HTML entities unescaped twice, whitespace collapsed, lower case), split with CLIP's pattern, each
piece's UTF-8 bytes mapped to symbols and merged by rank; a sequence is ``[sot] + ids + [eot]``,
cut to the context length (the last id then eot) and padded with 0. Without ``ftfy`` (the
``towers`` extra) text is NFC-normalised instead, which differs from open_clip only on text that
ftfy would repair (mojibake, curly quotes, ligatures).

The file comes from the model's folder or from an installed open_clip_torch package (read, not
imported); it is decompressed under a bound, and checkpoints carry its merges as text.
"""
from __future__ import annotations

import functools
import gzip
import html
import importlib.util
import logging
import unicodedata
from pathlib import Path

import regex
import torch

from training.models.tower_files import TowerError

log = logging.getLogger(__name__)

BPE_FILE = "bpe_simple_vocab_16e6.txt.gz"
BPE_LIMIT = 16 << 20  # decompressed bytes (the real file is 1.36 MB)
N_MERGES = 49152 - 256 - 2  # merges open_clip reads (lines 1 … 48,894 after the header)
SOT, EOT = "<start_of_text>", "<end_of_text>"
_PATTERN = regex.compile(r"""<start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
                         regex.IGNORECASE)


def read_bpe(folder: Path | None) -> str:
    """The merges file's text: the folder's ``bpe_simple_vocab_16e6.txt.gz``, else the installed package's."""
    path = folder / BPE_FILE if folder is not None else None
    if path is None or not path.is_file():
        spec = importlib.util.find_spec("open_clip")
        if spec is None or not spec.submodule_search_locations:
            raise TowerError(f"open_clip's tokenizer vocabulary ({BPE_FILE}) is neither in the model's folder nor in an "
                             "installed open_clip_torch package (pip install --no-deps open_clip_torch)")
        path = Path(list(spec.submodule_search_locations)[0]) / BPE_FILE
    try:
        with gzip.open(path) as f:
            data = f.read(BPE_LIMIT + 1)
    except (OSError, EOFError) as e:
        raise TowerError(f"{path}: not a readable gzip file ({e})") from None
    if len(data) > BPE_LIMIT:
        raise TowerError(f"{path}: decompresses to more than {BPE_LIMIT:,} bytes; not a BPE vocabulary")
    lines = data.decode("utf-8").split("\n")[: N_MERGES + 1]
    return "\n".join(lines)


def byte_map() -> dict[int, str]:
    """CLIP's printable stand-in for each byte value: printable Latin-1 bytes stand for themselves, the
    others for 256, 257, … in byte order; the dict's order is the vocabulary's."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    rest = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(rest)}}


def _clean(text: str) -> str:
    try:
        import ftfy  # optional (extra "towers"): open_clip's own text repair

        text = ftfy.fix_text(text)
    except ImportError:
        text = unicodedata.normalize("NFC", text)
    text = html.unescape(html.unescape(text)).strip()
    return " ".join(text.split()).strip().lower()


class OpenClipTokenizer:
    """``tokenizer(texts)`` → (n, context_length) int64 ids, as open_clip's ``SimpleTokenizer`` gives."""

    def __init__(self, bpe_text: str, context_length: int = 77):
        merges = [tuple(ln.split()) for ln in bpe_text.split("\n")[1:N_MERGES + 1]]
        self.byte_map = byte_map()
        symbols = list(self.byte_map.values())
        vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges] + [SOT, EOT]
        self.ids = {tok: i for i, tok in enumerate(vocab)}  # a later duplicate wins, as in a dict built from zip
        self.ranks = {m: r for r, m in enumerate(merges) if len(m) == 2}
        self.sot, self.eot, self.context_length = self.ids[SOT], self.ids[EOT], int(context_length)
        self._bpe = functools.lru_cache(maxsize=65536)(self._merge)

    def _merge(self, piece: str) -> tuple[str, ...]:
        word = list(piece[:-1]) + [piece[-1] + "</w>"]
        while len(word) > 1:
            pairs = {(a, b) for a, b in zip(word, word[1:])}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return tuple(word)

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in _PATTERN.findall(_clean(text)):
            if piece in (SOT, EOT):
                out.append(self.ids[piece])
                continue
            out.extend(self.ids[t] for t in self._bpe("".join(self.byte_map[b] for b in piece.encode("utf-8"))))
        return out

    def __call__(self, texts: list[str]) -> torch.Tensor:
        result = torch.zeros(len(texts), self.context_length, dtype=torch.long)
        for i, text in enumerate(texts):
            ids = [self.sot, *self.encode(text), self.eot]
            if len(ids) > self.context_length:
                ids = ids[: self.context_length]
                ids[-1] = self.eot
            result[i, : len(ids)] = torch.tensor(ids)
        return result
