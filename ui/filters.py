"""The filter bar's values ↔ a filter of the search service (search/filters.py), as plain functions.

The bar offers what the served models' metadata holds (``SearchService.metadata_fields``): a chip per
string or boolean value of a field (``split: test``), a range over a field of numbers or dates, and
words that must appear. Chips of one field are alternatives (``in``), everything else must hold at
once (``and``). A chip's value is the JSON ``[field, value]``; every value that comes back from the
browser is hostile and parsed here (a bad one is a ``BadRequest`` with a message, never a trace), and
the filter built from them goes through ``search.filters.parse_filter`` like a REST request's.
"""
from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

import numpy as np

from search import BadRequest, SearchService
from search.facets import FieldValues
from search.filters import parse_filter
from search.metadata_table import parse_date

MAX_CHIPS = 300
MAX_CHIP_CHARS = 1200


def merged_fields(service: SearchService, names: list[str]) -> list[FieldValues]:
    """The metadata fields of the loaded models among ``names`` (a field several models have: the
    first model's values); models that cannot answer (loading, down) are left out."""
    seen: dict[str, FieldValues] = {}
    for name in names:
        try:
            fields = service.metadata_fields(name)
        except Exception:  # noqa: BLE001 - a model still loading or down offers no chips
            continue
        for fv in fields:
            seen.setdefault(fv.name, fv)
    return list(seen.values())


def chip_value(field: str, value: str | bool) -> str:
    """The dropdown value of the chip ``field: value``."""
    return json.dumps([field, value], ensure_ascii=False)


def chip_choices(fields: list[FieldValues], keep: list[str] | None = None) -> list[tuple[str, str]]:
    """(label, value) of every chip: string values of fields that hold no dates, and booleans; ``keep``
    (chips already selected) stay offered, so a selection is never orphaned by a write."""
    out: list[tuple[str, str]] = []
    for fv in fields:
        if not fv.dates:
            out += [(f"{fv.name}: {v} · {n}", chip_value(fv.name, v)) for v, n in fv.strings]
        out += [(f"{fv.name}: {str(v).lower()} · {n}", chip_value(fv.name, v)) for v, n in fv.bools]
    out = out[:MAX_CHIPS]
    offered = {v for _, v in out}
    for v in keep or []:
        if isinstance(v, str) and v not in offered:
            try:
                f, val = parse_chip(v)
            except BadRequest:
                continue
            out.append((f"{f}: {val} · 0", v))
    return out


def range_choices(fields: list[FieldValues]) -> list[tuple[str, str]]:
    """(label, field) of the fields a range applies to: those holding dates or numbers, with their span."""
    out = [("—", "")]
    for fv in fields:
        if fv.dates:
            out.append((f"{fv.name} (dates {fv.dates[0][:10]} … {fv.dates[1][:10]})", fv.name))
        elif fv.numbers:
            lo, hi = fv.numbers
            out.append((f"{fv.name} ({lo:g} … {hi:g})", fv.name))
    return out


def parse_chip(value: Any) -> tuple[str, str | bool]:
    """(field, value) of a chip value from the browser; BadRequest when it is not one."""
    if not isinstance(value, str) or len(value) > MAX_CHIP_CHARS:
        raise BadRequest("a filter chip is not one the page offered")
    try:
        got = json.loads(value)
    except (ValueError, RecursionError):
        raise BadRequest("a filter chip is not one the page offered") from None
    if not (isinstance(got, list) and len(got) == 2 and isinstance(got[0], str) and isinstance(got[1], (str, bool))):
        raise BadRequest("a filter chip is not one the page offered")
    return got[0], got[1]


def _bound(field: str, text: str, upper: bool) -> tuple[str, object] | None:
    """(operator, bound) of a range box: a date (a date alone, as the upper bound, includes its day) or a number."""
    text = " ".join(str(text or "").split())
    if not text:
        return None
    if parse_date(text) is not None:
        if upper and len(text) == 10:
            return "lt", (date.fromisoformat(text) + timedelta(days=1)).isoformat()
        return ("lte" if upper else "gte"), text
    try:
        v = float(text)
    except ValueError:
        raise BadRequest(f"the range of {field} takes numbers or dates (2024-05-01), got {text[:40]!r}") from None
    if not np.isfinite(v):
        raise BadRequest(f"the range of {field} takes finite numbers")
    return ("lte" if upper else "gte"), int(v) if v.is_integer() and abs(v) < 2**53 else v


def build_filter(chips: Any = None, range_field: Any = None, lo: Any = None, hi: Any = None,
                 words: Any = None) -> dict | None:
    """The filter the bar's values name (None: no filter); BadRequest for a value that is not one."""
    parts: list[dict] = []
    by_field: dict[str, list] = {}
    for v in chips if isinstance(chips, list) else []:
        f, val = parse_chip(v)
        by_field.setdefault(f, [])
        if val not in by_field[f]:
            by_field[f].append(val)
    for f, vals in by_field.items():
        parts.append({"field": f, "eq": vals[0]} if len(vals) == 1 else {"field": f, "in": vals})
    if isinstance(range_field, str) and range_field:
        bounds = [b for b in (_bound(range_field, lo, False), _bound(range_field, hi, True)) if b is not None]
        if bounds:
            parts.append({"field": range_field, **dict(bounds)})
    text = " ".join(str(words or "").split())
    if text:
        parts.append({"text": text})
    if not parts:
        return None
    flt = parts[0] if len(parts) == 1 else {"and": parts}
    parse_filter(flt)  # the service's own check: names, sizes, bounds of one kind
    return flt


def bar_values(flt: Any) -> tuple[list[str], str, str, str, str] | None:
    """The bar's values (chips, range field, from, to, words) that build ``flt`` — a filter this module
    built, e.g. read back from a shared link; None for any other filter."""
    if not isinstance(flt, dict):
        return None
    parts = flt["and"] if set(flt) == {"and"} and isinstance(flt["and"], list) else [flt]
    chips, rng, words = [], ("", "", ""), ""
    for p in parts:
        if not isinstance(p, dict):
            return None
        if set(p) == {"text"} and isinstance(p["text"], str) and not words:
            words = p["text"]
        elif set(p) in ({"field", "eq"}, {"field", "in"}) and isinstance(p["field"], str):
            vals = [p["eq"]] if "eq" in p else p["in"]
            if not isinstance(vals, list) or not all(isinstance(v, (str, bool)) for v in vals):
                return None
            chips += [chip_value(p["field"], v) for v in vals]
        elif "field" in p and set(p) - {"field"} <= {"gte", "lte", "lt"} and len(p) > 1 and not rng[0]:
            lo = p.get("gte", "")
            hi = p.get("lte", "")
            if "lt" in p:
                if not (isinstance(p["lt"], str) and len(p["lt"]) == 10 and parse_date(p["lt"]) is not None):
                    return None
                hi = (date.fromisoformat(p["lt"]) - timedelta(days=1)).isoformat()
            rng = (str(p["field"]), str(lo), str(hi))
        else:
            return None
    try:
        if build_filter(chips, *rng, words) is None:
            return None
    except BadRequest:
        return None
    return chips, *rng, words


def describe(flt: dict | None) -> str:
    """A short reading of a filter this module built: ``split = test · album in {a, b} · words "red"``."""
    values = bar_values(flt)
    if values is None:
        return "no filter" if flt is None else "a filter"
    chips, field, lo, hi, words = values
    by_field: dict[str, list[str]] = {}
    for c in chips:
        f, v = parse_chip(c)
        by_field.setdefault(f, []).append(str(v).lower() if isinstance(v, bool) else v)
    out = [f"{f} = {vs[0]}" if len(vs) == 1 else f"{f} in {{{', '.join(vs)}}}" for f, vs in by_field.items()]
    if field:
        out.append(f"{field} {lo or '…'} to {hi or '…'}")
    if words:
        out.append(f'words "{words}"')
    return " · ".join(out)


def matching(service: SearchService, name: str, flt: dict | None) -> tuple[int, int]:
    """(live images of model ``name`` the filter keeps, live images): what the bar's status line says."""
    e = service.registry.get(name)
    n = len(e.index.images.meta["ids"])
    dead = getattr(e.index.images.index, "dead", None)
    alive = ~np.asarray(dead[:n], bool) if dead is not None else np.ones(n, bool)
    mask, _ = service.filter_masks(e, flt)
    return int((alive & mask).sum()) if mask is not None else int(alive.sum()), int(alive.sum())
