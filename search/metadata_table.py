"""Item metadata as numpy columns, so that a filter (``search/filters.py``) is evaluated over every row
of an index side at once instead of one JSON object at a time.

A row's metadata is a JSON object (nested objects flatten to dotted names: ``{"exif": {"model": …}}`` is
field ``exif.model``); a value is a scalar or a list of scalars. Each field keeps, per kind of value,
a pair of arrays — where each value belongs and the value — so a list-valued field (tags) is a
posting list with one entry per element and a scalar field one entry per row that has it:

- strings: ``int32`` codes into the field's vocabulary (categorical); strings that are ISO-8601 dates
  also have an instant (``float64`` epoch seconds, per vocabulary entry);
- numbers (``int``/``float``, not ``bool``): ``float64`` (exact up to 2⁵³);
- booleans: ``bool``.

``null``, an empty list and a missing key are the same: no value. The words of a row (``{"text": …}``)
are an inverted index, word → rows, over the row's ``texts`` (captions, file name) and its metadata
strings, tokenised as captions are (``training.data.karpathy.tokenize``: lower-cased ``[a-z0-9]+``).

Writes: ``append`` adds rows at the end in amortised O(rows added); ``update`` replaces one row's
metadata and words. Values are stored by *slot*: a row's current slot is its latest write, so an
edit appends the new values under a new slot and repoints the row (copy-on-write of the row → slot
map, O(rows)). A ``snapshot()`` — what one request works on — is unchanged by every later write and
is read without a lock; writes to the live table are serialised by its lock.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np

from search.metadata_columns import Buf, Collected, FieldColumns, WordIndex, gather, parse_date, words

__all__ = ["MetadataTable", "parse_date", "words"]

def _text(t: str | Sequence[str] | None) -> str:
    if t is None:
        return ""
    return t if isinstance(t, str) else " ".join(s for s in t if isinstance(s, str))


_OPS = {"gte": np.greater_equal, "gt": np.greater, "lte": np.less_equal, "lt": np.less}
_NONE = np.empty(0, np.int64)


class MetadataTable:
    """Per-row metadata of one index side, as columns (module doc). Rows are 0..len-1 in the order
    given; ``texts[row]`` (a string, a list of strings or None) are the row's captions."""

    def __init__(self):
        self.n = 0
        self.fields: dict[str, FieldColumns] = {}
        self.words = WordIndex()
        self.slot_row = Buf(np.int64)  # slot → row
        self.row_slot = Buf(np.int64)  # row → its current slot (replaced, not written, by update)
        self.edited = False  # some slot is stale: results must be checked against row_slot
        self._frozen = False
        self._lock = threading.Lock()

    @classmethod
    def from_dicts(cls, dicts: Sequence[dict | None], texts: Sequence | None = None) -> MetadataTable:
        """A new table with one row per metadata object (and ``texts[i]`` as row i's captions); ``ValueError``
        when ``texts`` is not as long as ``dicts``."""
        table = cls()
        table.append(dicts, texts=texts)
        return table

    def __len__(self) -> int:
        return self.n

    def snapshot(self) -> MetadataTable:
        """This table as it is now, unchanged by later writes (shares its arrays; O(fields))."""
        with self._lock:
            t = object.__new__(MetadataTable)
            t.n, t.words, t.edited, t._frozen, t._lock = self.n, self.words.frozen(), self.edited, True, threading.Lock()
            t.slot_row, t.row_slot = self.slot_row.frozen(), self.row_slot.frozen()
            t.fields = {name: f.frozen() for name, f in self.fields.items()}
            return t

    def append(self, dicts: Sequence[dict | None], texts: Sequence | None = None) -> None:
        """Add rows ``len(self)…`` with these metadata objects (and captions)."""
        self._writable()
        if texts is not None and len(texts) != len(dicts):
            raise ValueError(f"{len(dicts)} metadata rows but {len(texts)} texts")
        with self._lock:
            first = self.slot_row.n
            self._add_slots(dicts, texts, first)
            self.slot_row.extend(np.arange(self.n, self.n + len(dicts)))
            self.row_slot.extend(np.arange(first, first + len(dicts)))
            self.n += len(dicts)

    def update(self, row: int, metadata: dict | None, text: str | Sequence[str] | None = None) -> None:
        """Replace row ``row``'s metadata and words (``text``: its captions now; None: no caption words)."""
        self._writable()
        row = int(row)
        if not 0 <= row < self.n:
            raise IndexError(f"row {row} is not in a table of {self.n} rows")
        with self._lock:
            slot = self.slot_row.n
            self._add_slots([metadata], None if text is None else [text], slot)
            self.slot_row.extend([row])
            current = self.row_slot.view().copy()  # snapshots keep the old map
            current[row] = slot
            self.row_slot = Buf(np.int64, current, len(current))
            self.edited = True

    def _writable(self) -> None:
        if self._frozen:
            raise ValueError("a snapshot is read-only: write to the table it was taken from")

    def _add_slots(self, dicts: Sequence[dict | None], texts: Sequence | None, first: int) -> None:
        cols: dict[str, Collected] = {}
        slots = np.arange(first, first + len(dicts), dtype=np.int64)
        gather([d if isinstance(d, dict) else {} for d in dicts], slots, "", cols)
        for name, c in cols.items():
            f = self.fields.get(name)
            if f is None:
                f = self.fields[name] = FieldColumns()
            a = c.arrays()
            if c.s_vals:
                f.s_slots.extend(a["s_slots"])
                f.s_codes.extend(f.codes(c.s_vals))
                self.words.add_texts(c.s_vals, a["s_slots"])
            f.n_slots.extend(a["n_slots"])
            f.n_vals.extend(a["n_vals"])
            f.b_slots.extend(a["b_slots"])
            f.b_vals.extend(a["b_vals"])
        if texts is not None:
            self.words.add_texts([_text(t) for t in texts], slots)

    # ---- what filters ask: the rows (possibly repeated) with a matching value --------------------
    def _rows(self, slots: np.ndarray) -> np.ndarray:
        """Rows of the slots that are their row's current write (slots past this snapshot dropped)."""
        slots = slots[slots < self.slot_row.n]
        rows = self.slot_row.view()[slots]
        if self.edited:
            rows = rows[self.row_slot.view()[rows] == slots]
        return rows

    def rows_with_strings(self, name: str, values: Iterable[str]) -> np.ndarray:
        """Rows (possibly repeated) where field ``name`` has a string equal to one of ``values``."""
        f = self.fields.get(name)
        if f is None:
            return _NONE
        codes = [c for c in (f.vocab.get(v) for v in values) if c is not None and c < f.dates.n]
        if not codes:
            return _NONE
        sc = f.s_codes.view()
        hit = sc == codes[0] if len(codes) == 1 else np.isin(sc, codes)
        return self._rows(f.s_slots.view()[hit])

    def rows_with_numbers(self, name: str, values: Sequence[float]) -> np.ndarray:
        """Rows (possibly repeated) where field ``name`` has a number equal to one of ``values``."""
        f = self.fields.get(name)
        if f is None or not len(values):
            return _NONE
        return self._rows(f.n_slots.view()[np.isin(f.n_vals.view(), np.asarray(values, np.float64))])

    def rows_with_bools(self, name: str, values: Sequence[bool]) -> np.ndarray:
        """Rows (possibly repeated) where field ``name`` has a boolean equal to one of ``values``."""
        f = self.fields.get(name)
        if f is None or not len(values):
            return _NONE
        return self._rows(f.b_slots.view()[np.isin(f.b_vals.view(), np.asarray(values, np.bool_))])

    def rows_in_range(self, name: str, kind: str, bounds: Sequence[tuple[str, float]]) -> np.ndarray:
        """Rows with a value of ``kind`` (``number`` or ``date``) inside every ``(op, bound)``."""
        f = self.fields.get(name)
        if f is None:
            return _NONE
        if kind == "number":
            slots, vals = f.n_slots.view(), f.n_vals.view()
        else:
            if not f.any_dates:
                return _NONE
            slots, vals = f.s_slots.view(), f.dates.view()[f.s_codes.view()]
        hit = np.ones(len(vals), bool)
        for op, b in bounds:
            hit &= _OPS[op](vals, b)
        return self._rows(slots[hit])

    def rows_present(self, name: str) -> np.ndarray:
        """Rows (possibly repeated) where field ``name`` has at least one value of any kind."""
        f = self.fields.get(name)
        if f is None:
            return _NONE
        return self._rows(np.concatenate([f.s_slots.view(), f.n_slots.view(), f.b_slots.view()]))

    def rows_with_word(self, word: str) -> np.ndarray:
        """Rows (possibly repeated) whose captions or metadata strings hold ``word`` (a lower-cased token)."""
        return self._rows(self.words.slots_of(word))
