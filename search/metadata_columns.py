"""The building blocks of ``MetadataTable`` (search/metadata_table.py): growable arrays that snapshots
share, one metadata field's columns, the loop that sorts JSON values into them, and the word index.

Every array here is written only past the length a reader was given (``Buf.frozen``), or replaced by
a new one, so a snapshot reads without a lock while the live table keeps growing. Entries are keyed
by *slot*, not row: appended rows and edited rows take new slots, and the table maps slots to rows
(``MetadataTable.update``).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from training.data.karpathy import tokenize

_ISO = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?")


def parse_date(text: str) -> float | None:
    """Epoch seconds of an ISO-8601 date or date-time (``2024-05-01``, ``2024-05-01T12:30:00+02:00``);
    a date alone is midnight UTC and a time without an offset is UTC. None when ``text`` is not one."""
    if not 10 <= len(text) <= 40 or not _ISO.fullmatch(text):
        return None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:  # 2024-02-30, 25:00, fractions Python cannot read
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def words(text: str) -> list[str]:
    """The words of ``text`` as the text index stores them (distinct, in first-seen order)."""
    return list(dict.fromkeys(tokenize(text)))


class Buf:
    """A growable 1-d array. ``view()`` is the filled part; ``frozen()`` shares the memory with a fixed
    length (later ``extend`` calls write past it or into a new array, never into what it shows)."""

    __slots__ = ("data", "n")

    def __init__(self, dtype, data: np.ndarray | None = None, n: int = 0):
        self.data = np.empty(0, dtype) if data is None else data
        self.n = n

    def view(self) -> np.ndarray:
        """The filled part, ``data[:n]``: a view that shares the memory, not a copy."""
        return self.data[: self.n]

    def frozen(self) -> Buf:
        """A ``Buf`` over the same memory and length, for a snapshot: later ``extend`` calls never change it."""
        return Buf(self.data.dtype, self.data, self.n)

    def extend(self, values) -> None:
        """Append ``values`` (cast to this dtype) after the filled part, growing into a new array (at least
        doubled) when they do not fit, so frozen copies never see the write."""
        values = np.asarray(values, dtype=self.data.dtype)
        end = self.n + len(values)
        if end > len(self.data):
            grown = np.empty(max(end, 2 * len(self.data), 16), self.data.dtype)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n: end] = values
        self.n = end


class FieldColumns:
    """One metadata field's values: (slots, codes) for strings, (slots, values) for numbers and booleans."""

    def __init__(self):
        self.s_slots, self.s_codes = Buf(np.int64), Buf(np.int32)
        self.n_slots, self.n_vals = Buf(np.int64), Buf(np.float64)
        self.b_slots, self.b_vals = Buf(np.int64), Buf(np.bool_)
        self.vocab: dict[str, int] = {}  # string → code (shared with snapshots; codes only grow)
        self.strings: list[str] = []
        self.dates = Buf(np.float64)  # per code: epoch seconds, NaN when the string is not a date
        self.any_dates = False

    def frozen(self) -> FieldColumns:
        """These columns for a snapshot: frozen ``Buf``s, with the vocabulary shared (codes only grow)."""
        f = object.__new__(FieldColumns)
        for name in ("s_slots", "s_codes", "n_slots", "n_vals", "b_slots", "b_vals", "dates"):
            setattr(f, name, getattr(self, name).frozen())
        f.vocab, f.strings, f.any_dates = self.vocab, self.strings, self.any_dates
        return f

    def codes(self, strings: list[str]) -> np.ndarray:
        """Codes of ``strings``, adding the new ones to the vocabulary (and their instants when dates)."""
        vocab = self.vocab
        new = [v for v in dict.fromkeys(strings) if v not in vocab]
        if new:
            vocab.update(zip(new, range(len(self.strings), len(self.strings) + len(new))))
            self.strings.extend(new)
            dates = [parse_date(v) if len(v) >= 10 and v[4] == "-" else None for v in new]
            self.any_dates |= any(d is not None for d in dates)
            self.dates.extend([np.nan if d is None else d for d in dates])
        return np.fromiter(map(vocab.__getitem__, strings), np.int32, len(strings))


class Collected:
    """Values of one field gathered from a batch of metadata objects: arrays of slots and values per kind."""

    __slots__ = ("s_slots", "s_vals", "n_slots", "n_vals", "b_slots", "b_vals")

    def __init__(self):
        self.s_slots, self.n_slots, self.n_vals, self.b_slots, self.b_vals = [], [], [], [], []
        self.s_vals: list[str] = []

    def strings(self, slots: np.ndarray, vals: list[str]) -> None:
        """Add string values, ``vals[i]`` under ``slots[i]``."""
        self.s_slots.append(slots)
        self.s_vals.extend(vals)

    def numbers(self, slots: np.ndarray, vals: np.ndarray) -> None:
        """Add number values, ``vals[i]`` under ``slots[i]``."""
        self.n_slots.append(slots)
        self.n_vals.append(vals)

    def bools(self, slots: np.ndarray, vals: np.ndarray) -> None:
        """Add boolean values, ``vals[i]`` under ``slots[i]``."""
        self.b_slots.append(slots)
        self.b_vals.append(vals)

    def arrays(self) -> dict[str, np.ndarray]:
        """The gathered slots and values concatenated per kind: ``s_slots``, ``n_slots``, ``n_vals``, ``b_slots``,
        ``b_vals`` (empty arrays for a kind with none; string values stay in ``s_vals``)."""
        def cat(parts, dtype):
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)
        return {"s_slots": cat(self.s_slots, np.int64), "n_slots": cat(self.n_slots, np.int64),
                "n_vals": cat(self.n_vals, np.float64), "b_slots": cat(self.b_slots, np.int64),
                "b_vals": cat(self.b_vals, np.bool_)}


_NONE_T = type(None)


def gather(objs: Sequence[dict], slots: np.ndarray, prefix: str, cols: dict[str, Collected]) -> None:
    """Sort the values of metadata objects (``objs[i]`` belongs to ``slots[i]``; ``{}`` when none) into
    per-field columns; nested objects become dotted names. Column by column: a field whose values are
    all of one scalar kind (the usual case) costs a few C-level passes, anything else a Python loop."""
    for key in sorted(set().union(*objs)):
        vals = [o.get(key) for o in objs]
        kinds = set(map(type, vals)) - {_NONE_T}
        name = prefix + key
        col = cols.get(name)
        if col is None:
            col = cols[name] = Collected()
        if dict in kinds:
            gather([v if type(v) is dict else {} for v in vals], slots, name + ".", cols)
            kinds.discard(dict)
        if not kinds:
            continue
        if len(kinds) == 1 and kinds <= {str, bool, int, float} or kinds == {int, float}:
            arr = np.empty(len(vals), object)
            arr[:] = vals
            has = arr != None  # noqa: E711 (element-wise)
            sl, v = slots[has], arr[has]
            if str in kinds:
                col.strings(sl, v.tolist())
                continue
            if bool in kinds:
                col.bools(sl, v.astype(np.bool_))
                continue
            try:
                col.numbers(sl, v.astype(np.float64))
                continue
            except OverflowError:  # an int past float range: value by value below
                pass
        _loop(col, vals, slots)


def _loop(col: Collected, vals: list, slots: np.ndarray) -> None:
    """Lists and mixed kinds, value by value; nested lists, objects inside lists and null hold no value
    (stored metadata is validated when it is written: a table built from it stays lenient)."""
    s_sl, s_v, n_sl, n_v, b_sl, b_v = [], [], [], [], [], []
    for slot, value in zip(slots.tolist(), vals):
        for v in value if type(value) is list else (value,):
            t = type(v)
            if t is str:
                s_sl.append(slot)
                s_v.append(v)
            elif t is bool:
                b_sl.append(slot)
                b_v.append(v)
            elif (t is int or t is float) and _finite_float(v) is not None:
                n_sl.append(slot)
                n_v.append(float(v))
    col.strings(np.asarray(s_sl, np.int64), s_v)
    col.numbers(np.asarray(n_sl, np.int64), np.asarray(n_v, np.float64))
    col.bools(np.asarray(b_sl, np.int64), np.asarray(b_v, np.bool_))


def _finite_float(v: int | float) -> float | None:
    try:
        return float(v)
    except OverflowError:
        return None


_SPLIT = re.compile(r"[a-z0-9]+|\x01")  # tokenize's words, plus \x01 between texts (tests check the two agree)


def tokenize_many(texts: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """(text of each word, distinct words): every word of every text, as ``words`` gives them per
    text, in one regex pass over the texts joined by a separator, instead of one call per text."""
    joined = "\x01".join(t.replace("\x01", " ") for t in texts).lower()
    toks = _SPLIT.findall(joined)
    local = {t: i for i, t in enumerate(dict.fromkeys(toks))}
    ids = np.fromiter(map(local.__getitem__, toks), np.int64, len(toks))
    sep = local.get("\x01", -1)
    owner = np.cumsum(ids == sep)
    keep = ids != sep
    return np.stack([owner[keep], ids[keep]]), list(local)


class WordIndex:
    """Inverted index word → slots: a CSR part (sorted by word, then slot; no repeats) plus a tail of
    (word, slot) pairs added since, scanned linearly and folded into a new CSR part when it grows past
    a fraction of it."""

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.offsets = np.zeros(1, np.int64)
        self.slots = np.empty(0, np.int64)
        self.t_words, self.t_slots = Buf(np.int32), Buf(np.int64)

    def frozen(self) -> WordIndex:
        """This index for a snapshot: the current CSR part and a frozen tail (the vocabulary is shared)."""
        w = object.__new__(WordIndex)
        w.vocab, w.offsets, w.slots = self.vocab, self.offsets, self.slots
        w.t_words, w.t_slots = self.t_words.frozen(), self.t_slots.frozen()
        return w

    def add_texts(self, texts: Sequence[str], slots: np.ndarray) -> None:
        """Index the words of ``texts[i]`` under ``slots[i]``."""
        if not len(texts):
            return
        (owner, local), distinct = tokenize_many(texts)
        vocab = self.vocab
        for w in distinct:
            if w not in vocab and w != "\x01":
                vocab[w] = len(vocab)
        to_global = np.fromiter((vocab.get(w, -1) for w in distinct), np.int64, len(distinct))
        self.t_words.extend(to_global[local])
        self.t_slots.extend(np.asarray(slots, np.int64)[owner])
        if self.t_slots.n > max(65_536, len(self.slots) // 4):
            self._fold()

    def _fold(self) -> None:
        words_ = np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))
        key = np.unique(np.concatenate([(words_ << 32) | self.slots,
                                        (self.t_words.view().astype(np.int64) << 32) | self.t_slots.view()]))
        w = key >> 32
        self.offsets = np.searchsorted(w, np.arange(len(self.vocab) + 1)).astype(np.int64)
        self.slots = key & 0xFFFFFFFF
        self.t_words, self.t_slots = Buf(np.int32), Buf(np.int64)

    def slots_of(self, word: str) -> np.ndarray:
        """The slots whose texts hold ``word`` (a lower-cased token), CSR part then tail, possibly repeated;
        empty for a word this index has not seen."""
        wid = self.vocab.get(word)
        if wid is None:
            return np.empty(0, np.int64)
        base = self.slots[self.offsets[wid]: self.offsets[wid + 1]] if wid + 1 < len(self.offsets) else self.slots[:0]
        tail = self.t_slots.view()[self.t_words.view() == wid]
        return np.concatenate([base, tail]) if len(tail) else base
