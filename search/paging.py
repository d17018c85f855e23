"""Cursor pagination past the first k: pages of one ranking in a stable order.

A ranking orders hits by exact score, then id. A page's cursor carries where it ended (the last hit's
score and id) and how deep it was; the next page is the hits strictly after that point, found by
ranking deep enough again. Because the order is by (score, id) and not by position, a page is stable
while the index changes: a removed item just drops out, an added one appears where its score puts it.
The cursor also names the query, filter and direction it belongs to (a digest), so it cannot be
replayed against another query, and the index generation it was made on (answers say when that
changed). Cursors are opaque to clients: base64url JSON, checked on the way in.
"""
from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from search.errors import BadRequest

MAX_DEPTH = 10_000  # hits a cursor may page through (offset + k)


@dataclass(frozen=True)
class Page:
    """Where the previous page ended."""

    offset: int  # hits already returned
    score: float
    id: int
    generation: int
    key: str  # digest of (direction, query, filter)


def query_key(*parts: object) -> str:
    """A short digest naming one ranking (what a cursor belongs to)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def encode(page: Page) -> str:
    """The opaque cursor for ``page``: its fields as compact JSON, base64url without padding (``decode`` reads it)."""
    raw = json.dumps({"o": page.offset, "s": page.score, "i": page.id, "g": page.generation, "q": page.key},
                     separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str | None, key: str, k: int) -> Page | None:
    """The page a cursor continues from (None for the first page); BadRequest for a cursor that is not
    one of ours, belongs to another query, or pages deeper than ``MAX_DEPTH``."""
    if cursor is None:
        return None
    if not isinstance(cursor, str) or len(cursor) > 400:
        raise BadRequest("cursor: not a cursor this server made")
    try:
        obj = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        page = Page(int(obj["o"]), float(obj["s"]), int(obj["i"]), int(obj["g"]), str(obj["q"]))
    except (ValueError, KeyError, TypeError):
        raise BadRequest("cursor: not a cursor this server made") from None
    if page.key != key:
        raise BadRequest("cursor: it belongs to another query, filter or direction")
    if not 0 < page.offset or page.offset + k > MAX_DEPTH:
        raise BadRequest(f"cursor: pages reach at most {MAX_DEPTH:,} hits deep")
    return page


def after(pairs: list[tuple[float, int]], page: Page | None) -> list[tuple[float, int]]:
    """The (score, id) pairs, in ranking order, strictly after where ``page`` ended."""
    if page is None:
        return pairs
    return [(s, i) for s, i in pairs if (-s, i) > (-page.score, page.id)]
