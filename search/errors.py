"""What the search service answers instead of a result. Domain errors, not HTTP: the REST routers
(app/api/errors.py) and the UI (a notice) decide how to show them."""
from __future__ import annotations

import re


class SearchError(Exception):
    """A request the search service cannot answer; ``detail`` says why, ``extra`` adds fields."""

    def __init__(self, detail: str, **extra):
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class BadRequest(SearchError):
    """The request itself is wrong (empty query, k out of range, not decodable, …)."""


class NotFound(SearchError):
    """An unknown model, image or caption id."""


class NotReady(SearchError):
    """The models are still loading, or the model asked for could not be loaded."""


class Busy(SearchError):
    """Too much work of this kind at once (image decodes); try again shortly."""


class Unsupported(SearchError):
    """The model cannot do this (e.g. encode an upload without an image backbone)."""


class UnsupportedMediaType(SearchError):
    """An upload that is not an image of an accepted type."""


class Forbidden(SearchError):
    """Allowed to no one here: writes to a server started without ``--writable``, a folder outside the
    ingest roots."""


class Conflict(SearchError):
    """The request does not fit the current state (e.g. a compaction already running)."""


# A path with at least one folder: absolute (/a/b), home-relative (~/a) or relative (../a, ./a).
# Components stop at whitespace, quotes, brackets and the separators of flags (=, @, :, ,).
_PATH = re.compile(r"(?<![\w./~-])(?:~|\.\.?)?/(?:[^\s/'\"`,;:=@()<>\[\]{}]+/)+([^\s/'\"`,;:=@()<>\[\]{}]*)")


def redact_paths(text: str) -> str:
    """``text`` with every file path cut to its last part: errors that reach clients say what is wrong
    (``manifest.json is corrupt``), never where the server keeps its files."""
    return _PATH.sub(lambda m: m.group(1) or "…", text)
