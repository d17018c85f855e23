"""What a model's item metadata holds, field by field: the values a filter can name (the UI's filter
chips and its range controls are built from it).

``field_values(table, alive)`` reads a ``MetadataTable`` snapshot (search/metadata_table.py) and says,
for each field, how many live items have a value, its most frequent strings with their item counts,
its boolean counts, its number range and its date range (ISO-8601 strings compared as instants, as
filters compare them). Only rows of ``alive`` count: a removed item's values are never listed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from search.metadata_table import MetadataTable

MAX_FIELDS = 40
MAX_VALUES = 50


@dataclass(frozen=True)
class FieldValues:
    """One metadata field as the live items hold it (see the module doc)."""

    name: str
    items: int  # live items with at least one value
    strings: tuple[tuple[str, int], ...] = ()  # (value, items), most items first, at most ``max_values``
    more_strings: int = 0  # distinct strings left out of ``strings``
    bools: tuple[tuple[bool, int], ...] = ()  # (value, items)
    numbers: tuple[float, float] | None = None  # (min, max) of its numbers
    dates: tuple[str, str] | None = None  # (earliest, latest) of its ISO-8601 date strings, as written

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of values it holds: some of ``string``, ``bool``, ``number``, ``date``."""
        return tuple(k for k, has in (("string", self.strings or self.more_strings), ("bool", self.bools),
                                      ("number", self.numbers), ("date", self.dates)) if has)


def _live_rows(table: MetadataTable, slots: np.ndarray, alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions into ``slots`` that are their row's current write and alive, those rows)."""
    pos = np.flatnonzero(slots < table.slot_row.n)
    rows = table.slot_row.view()[slots[pos]]
    keep = np.ones(len(pos), bool)
    if table.edited:
        keep &= table.row_slot.view()[rows] == slots[pos]
    inside = rows < len(alive)
    keep &= inside
    keep[inside] &= alive[rows[inside]]
    return pos[keep], rows[keep]


def _counted(rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, how many distinct rows hold each), most rows first, ties by value."""
    if not len(rows):
        return values[:0], np.zeros(0, np.int64)
    pairs = np.unique(np.stack([values.astype(np.int64), rows]), axis=1)
    vals, counts = np.unique(pairs[0], return_counts=True)
    order = np.lexsort((vals, -counts))
    return vals[order], counts[order]


def _field(table: MetadataTable, name: str, alive: np.ndarray, max_values: int) -> FieldValues | None:
    f = table.fields[name]
    seen: list[np.ndarray] = []
    strings, more, bools, numbers, dates = (), 0, (), None, None
    pos, rows = _live_rows(table, f.s_slots.view(), alive)
    if len(pos):
        codes = f.s_codes.view()[pos]
        ok = codes < f.dates.n  # codes the snapshot knows
        codes, rows = codes[ok], rows[ok]
        seen.append(rows)
        vals, counts = _counted(rows, codes)
        strings = tuple((f.strings[int(c)], int(n)) for c, n in zip(vals[:max_values], counts[:max_values]))
        more = max(0, len(vals) - max_values)
        instants = f.dates.view()[codes] if f.any_dates else np.zeros(0)
        has = np.isfinite(instants)
        if has.any():
            dc, di = codes[has], instants[has]
            dates = (f.strings[int(dc[np.argmin(di)])], f.strings[int(dc[np.argmax(di)])])
    pos, rows = _live_rows(table, f.b_slots.view(), alive)
    if len(pos):
        seen.append(rows)
        vals, counts = _counted(rows, f.b_vals.view()[pos])
        bools = tuple((bool(v), int(n)) for v, n in zip(vals, counts))
    pos, rows = _live_rows(table, f.n_slots.view(), alive)
    if len(pos):
        seen.append(rows)
        nv = f.n_vals.view()[pos]
        numbers = (float(nv.min()), float(nv.max()))
    if not seen:
        return None
    return FieldValues(name, int(len(np.unique(np.concatenate(seen)))), strings, more, bools, numbers, dates)


def field_values(table: MetadataTable, alive: np.ndarray, *, max_fields: int = MAX_FIELDS,
                 max_values: int = MAX_VALUES) -> list[FieldValues]:
    """The fields of ``table`` that live rows (``alive``, a bool mask over its rows) have values of, most
    items first (ties by name), at most ``max_fields``, each with at most ``max_values`` strings."""
    out = [fv for name in table.fields if (fv := _field(table, name, alive, max_values)) is not None]
    out.sort(key=lambda fv: (-fv.items, fv.name))
    return out[:max_fields]
