"""The filter language of every search route: a JSON object, parsed once into an immutable ``Filter``
whose ``mask(table)`` says which rows of a ``MetadataTable`` it keeps.

```
filter := {"and": [filter, ...]} | {"or": [filter, ...]} | {"not": filter}
        | {"field": NAME, "eq": SCALAR} | {"field": NAME, "in": [SCALAR, ...]}
        | {"field": NAME, "gte"|"gt"|"lte"|"lt": NUMBER or ISO-8601 DATE, ...}   (one or two bounds)
        | {"field": NAME, "exists": true|false}
        | {"text": "words"}      every word appears in the item's captions or metadata strings
```

Semantics (docs/guides/living-index.md, "Filters", says the same for users):

- A field's values are its scalar, or the elements of its list; ``null``, ``[]`` and a missing key
  are no value. ``eq``/``in`` match when any value equals one given; a range when any value lies
  within both bounds. Types do not mix: ``1`` matches ``1`` and ``1.0`` but not ``"1"`` or ``true``.
- A range with number bounds looks at numbers, one with date bounds at strings that are ISO-8601
  dates, compared as instants (a date alone is midnight UTC, a time without an offset is UTC).
- ``exists: true`` keeps rows with at least one value; ``not`` and ``exists: false`` keep the rest.
- Words are lower-cased ``[a-z0-9]+`` tokens, as captions are tokenised; each must occur whole.

Limits (a ``BadRequest`` with a one-line reason that names the place, e.g. ``filter.and[2]``): depth
≤ 8, ≤ 64 nodes, ≤ 1,000 values in an ``in``, field names ``^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`` (dots
address nested objects), text ≤ 200 characters with at least one word, no unknown keys.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from search.errors import BadRequest
from search.metadata_table import MetadataTable, parse_date, words

__all__ = ["Filter", "MetadataTable", "parse_filter", "MAX_DEPTH", "MAX_NODES", "MAX_IN", "MAX_TEXT"]

MAX_DEPTH = 8
MAX_NODES = 64
MAX_IN = 1000
MAX_TEXT = 200
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
RANGE_OPS = ("gte", "gt", "lte", "lt")
_FIELD_OPS = ("eq", "in", "exists", *RANGE_OPS)

Scalar = tuple[str, object]  # ("s", str) | ("n", float) | ("b", bool): bool never equals a number


class Filter:
    """A parsed filter: immutable and hashable (equal filters can share a cached mask)."""

    def mask(self, table: MetadataTable) -> np.ndarray:
        """The rows of ``table`` this filter keeps, as a bool array of ``len(table)``."""
        raise NotImplementedError

    def to_json(self) -> dict:
        """The filter as JSON (``parse_filter(f.to_json()) == f``), e.g. to send it to a shard."""
        raise NotImplementedError


def _rows_mask(table: MetadataTable, rows: np.ndarray) -> np.ndarray:
    m = np.zeros(len(table), bool)
    m[rows] = True
    return m


@dataclass(frozen=True)
class And(Filter):
    """``{"and": [...]}``: the rows every one of ``parts`` keeps (one or more parts)."""

    parts: tuple[Filter, ...]

    def mask(self, table):
        """The rows all parts keep, as a bool array of ``len(table)``; stops early once none is left."""
        m = self.parts[0].mask(table)
        for p in self.parts[1:]:
            if not m.any():
                break
            m &= p.mask(table)
        return m

    def to_json(self):
        """``{"and": [part, ...]}``, each part as its own JSON."""
        return {"and": [p.to_json() for p in self.parts]}


@dataclass(frozen=True)
class Or(Filter):
    """``{"or": [...]}``: the rows at least one of ``parts`` keeps (one or more parts)."""

    parts: tuple[Filter, ...]

    def mask(self, table):
        """The rows any part keeps, as a bool array of ``len(table)``."""
        m = self.parts[0].mask(table)
        for p in self.parts[1:]:
            m |= p.mask(table)
        return m

    def to_json(self):
        """``{"or": [part, ...]}``, each part as its own JSON."""
        return {"or": [p.to_json() for p in self.parts]}


@dataclass(frozen=True)
class Not(Filter):
    """``{"not": filter}``: the rows ``part`` does not keep."""

    part: Filter

    def mask(self, table):
        """The rows ``part`` leaves out, as a bool array of ``len(table)``."""
        return ~self.part.mask(table)

    def to_json(self):
        """``{"not": part}``, the part as its own JSON."""
        return {"not": self.part.to_json()}


@dataclass(frozen=True)
class Match(Filter):
    """``eq`` (one value) or ``in`` (several): any value of the field equals one of ``values``."""

    field: str
    op: str
    values: tuple[Scalar, ...]

    def mask(self, table):
        """The rows with a string, number or boolean value equal to one of ``values``, as a bool array."""
        kinds = {k: [v for t, v in self.values if t == k] for k in "snb"}
        rows = [table.rows_with_strings(self.field, kinds["s"]), table.rows_with_numbers(self.field, kinds["n"]),
                table.rows_with_bools(self.field, kinds["b"])]
        return _rows_mask(table, np.concatenate(rows))

    def to_json(self):
        """``{"field": NAME, "eq": V}`` or ``{"field": NAME, "in": [...]}``; whole numbers below 2**53 as integers."""
        vals = [int(v) if t == "n" and float(v).is_integer() and abs(v) < 2**53 else v for t, v in self.values]
        return {"field": self.field, "eq": vals[0]} if self.op == "eq" else {"field": self.field, "in": vals}


@dataclass(frozen=True)
class Range(Filter):
    """Bounds ``(op, value as given, value as a number or epoch seconds)`` on numbers or on dates."""

    field: str
    kind: str  # "number" | "date"
    bounds: tuple[tuple[str, object, float], ...]

    def mask(self, table):
        """The rows with a value (a number, or a date for date bounds) within every bound, as a bool array."""
        return _rows_mask(table, table.rows_in_range(self.field, self.kind, [(op, b) for op, _, b in self.bounds]))

    def to_json(self):
        """``{"field": NAME, op: bound, ...}`` with each bound as it was given (a number or a date string)."""
        return {"field": self.field, **{op: raw for op, raw, _ in self.bounds}}


@dataclass(frozen=True)
class Exists(Filter):
    """``{"field": NAME, "exists": present}``: the rows with at least one value of ``field`` (or, with
    ``present`` false, the rows with none)."""

    field: str
    present: bool

    def mask(self, table):
        """The rows with a value of the field (without one when ``present`` is false), as a bool array."""
        m = _rows_mask(table, table.rows_present(self.field))
        return m if self.present else ~m

    def to_json(self):
        """``{"field": NAME, "exists": true|false}``, as parsed."""
        return {"field": self.field, "exists": self.present}


@dataclass(frozen=True)
class Text(Filter):
    """``{"text": "words"}``: the rows whose captions or metadata strings hold every one of ``words``
    (``text`` as given, tokenised; at least one word)."""

    text: str
    words: tuple[str, ...]

    def mask(self, table):
        """The rows holding every word whole, as a bool array of ``len(table)``; stops early once none is left."""
        m = _rows_mask(table, table.rows_with_word(self.words[0]))
        for w in self.words[1:]:
            if not m.any():
                break
            m &= _rows_mask(table, table.rows_with_word(w))
        return m

    def to_json(self):
        """``{"text": TEXT}`` with the text as it was given."""
        return {"text": self.text}


# ---- parsing ------------------------------------------------------------------------------------
def parse_filter(obj: object) -> Filter:
    """Validate a filter's JSON (module doc) into a ``Filter``; ``BadRequest`` says what is wrong."""
    count = [0]
    return _parse(obj, "filter", 1, count)


def _parse(obj: object, where: str, depth: int, count: list[int]) -> Filter:
    if depth > MAX_DEPTH:
        raise BadRequest(f"{where}: filter nested deeper than {MAX_DEPTH} levels")
    count[0] += 1
    if count[0] > MAX_NODES:
        raise BadRequest(f"{where}: filter has more than {MAX_NODES} nodes")
    if not isinstance(obj, dict):
        raise BadRequest(f"{where}: a filter is a JSON object, got {_json_type(obj)}")
    for key in ("and", "or", "not", "text"):
        if key in obj:
            if len(obj) != 1:
                other = sorted(k for k in obj if k != key)[0]
                raise BadRequest(f"{where}: unexpected key {_show(other)} beside {key!r}")
            return _parse_one(key, obj[key], where, depth, count)
    if "field" in obj:
        return _parse_field(obj, where)
    keys = ", ".join(_show(k) for k in sorted(map(str, obj))) or "none"
    raise BadRequest(f"{where}: a filter needs one of 'and', 'or', 'not', 'field', 'text' (got keys: {keys})")


def _parse_one(key: str, value: object, where: str, depth: int, count: list[int]) -> Filter:
    if key == "not":
        return Not(_parse(value, f"{where}.not", depth + 1, count))
    if key == "text":
        return _parse_text(value, f"{where}.text")
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{where}.{key}: expected a non-empty list of filters, got {_json_type(value)}")
    parts = tuple(_parse(v, f"{where}.{key}[{i}]", depth + 1, count) for i, v in enumerate(value))
    return And(parts) if key == "and" else Or(parts)


def _parse_text(value: object, where: str) -> Text:
    if not isinstance(value, str):
        raise BadRequest(f"{where}: expected a string, got {_json_type(value)}")
    if len(value) > MAX_TEXT:
        raise BadRequest(f"{where}: text longer than {MAX_TEXT} characters ({len(value)})")
    ws = words(value)
    if not ws:
        raise BadRequest(f"{where}: no words in {value[:40]!r} (words are letters a-z and digits)")
    return Text(value, tuple(ws))


def _parse_field(obj: dict, where: str) -> Filter:
    name = obj["field"]
    if not isinstance(name, str) or not FIELD_NAME.fullmatch(name):
        shown = _show(name) if isinstance(name, str) else _json_type(name)
        raise BadRequest(f"{where}.field: invalid field name {shown} (letters, digits, _ . -; "
                         "starting with a letter or _; at most 64 characters)")
    ops = [k for k in obj if k != "field"]
    unknown = [k for k in ops if k not in _FIELD_OPS]
    if unknown:
        raise BadRequest(f"{where}: unknown key {_show(unknown[0])} in a field filter (expected one of "
                         f"{', '.join(_FIELD_OPS)})")
    if not ops:
        raise BadRequest(f"{where}: the filter on {name!r} needs one of {', '.join(_FIELD_OPS)}")
    ranges = [k for k in ops if k in RANGE_OPS]
    if len(ranges) != len(ops) and len(ops) > 1:
        raise BadRequest(f"{where}: one operator per field filter, got {' and '.join(ops)}")
    op = ops[0]
    if op == "eq":
        return Match(name, "eq", (_scalar(obj["eq"], f"{where}.eq"),))
    if op == "in":
        return _parse_in(name, obj["in"], f"{where}.in")
    if op == "exists":
        if not isinstance(obj["exists"], bool):
            raise BadRequest(f"{where}.exists: expected true or false, got {_json_type(obj['exists'])}")
        return Exists(name, obj["exists"])
    return _parse_range(name, {k: obj[k] for k in ranges}, where)


def _parse_in(name: str, values: object, where: str) -> Match:
    if not isinstance(values, list):
        raise BadRequest(f"{where}: expected a list of values, got {_json_type(values)}")
    if len(values) > MAX_IN:
        raise BadRequest(f"{where}: more than {MAX_IN} values ({len(values)})")
    scalars = tuple(dict.fromkeys(_scalar(v, f"{where}[{i}]") for i, v in enumerate(values)))
    return Match(name, "in", scalars)


def _parse_range(name: str, bounds: dict, where: str) -> Range:
    if len(bounds) > 2 or ("gte" in bounds and "gt" in bounds) or ("lte" in bounds and "lt" in bounds):
        raise BadRequest(f"{where}: a range has at most one lower bound (gte or gt) and one upper bound "
                         f"(lte or lt), got {', '.join(bounds)}")
    parsed, kinds = [], set()
    for op, v in bounds.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not _finite(v):
                raise BadRequest(f"{where}.{op}: bound is not a finite number")
            parsed.append((op, v, float(v)))
            kinds.add("number")
        elif isinstance(v, str) and (t := parse_date(v)) is not None:
            parsed.append((op, v, t))
            kinds.add("date")
        else:
            shown = repr(v[:40]) if isinstance(v, str) else _json_type(v)
            raise BadRequest(f"{where}.{op}: a bound is a number or an ISO-8601 date (2024-05-01, "
                             f"2024-05-01T12:00:00Z), got {shown}")
    if len(kinds) > 1:
        raise BadRequest(f"{where}: both bounds must be numbers or both dates")
    return Range(name, kinds.pop(), tuple(parsed))


def _scalar(v: object, where: str) -> tuple[str, object]:
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, (int, float)):
        if not _finite(v):
            raise BadRequest(f"{where}: value is not a finite number")
        return ("n", float(v))
    if v is None:
        raise BadRequest(f"{where}: null matches nothing; use {{\"exists\": false}} for items without a value")
    raise BadRequest(f"{where}: expected a string, number or boolean, got {_json_type(v)}")


def _finite(v: int | float) -> bool:
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an int past float range
        return False


def _json_type(v: object) -> str:
    names = {bool: "a boolean", str: "a string", int: "a number", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(v), type(v).__name__)


def _show(key: object) -> str:
    s = str(key)
    return repr(s if len(s) <= 40 else s[:40] + "…")
