"""The request fields of the REST API that carry the server's limits, and the limits' way into the
OpenAPI document.

The limits are the service's (``search.SearchConfig``, inherited by the settings): one value each, set
by a flag or an ``LTD_*`` variable. A request body is validated with ``context={"limits": settings}``
(routers/bodies.py ``validate``); the OpenAPI document carries the same values, written into the marked
schema nodes by ``apply_limits`` when the app builds it (app/api/main.py). So ``LTD_MAX_K=50`` documents
and enforces 50, and ``LTD_MAX_K=5000`` accepts k = 5,000. Query text is cleaned by the service's own
``clean_query`` (control characters dropped, whitespace collapsed) before its length is checked.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from search import BadRequest, SearchConfig
from search.encoding import clean_query

LIMIT_KEY = "x-ltd-limit"  # {JSON Schema keyword: SearchConfig field}; replaced by the value


def limit_marker(**keywords: str) -> dict:
    """A schema fragment that ``apply_limits`` turns into ``{keyword: settings.<field>}``."""
    return {LIMIT_KEY: keywords}


def apply_limits(node: Any, limits: SearchConfig) -> Any:
    """Replace every ``limit_marker`` in a JSON Schema / OpenAPI document (in place) by the limits' values."""
    if isinstance(node, dict):
        for keyword, field in node.pop(LIMIT_KEY, {}).items():
            node[keyword] = getattr(limits, field)
        for v in node.values():
            apply_limits(v, limits)
    elif isinstance(node, list):
        for v in node:
            apply_limits(v, limits)
    return node


def _limits(info: ValidationInfo) -> SearchConfig:
    limits = (info.context or {}).get("limits")
    if not isinstance(limits, SearchConfig):  # a programming error, not a bad request
        raise RuntimeError("request models are validated with context={'limits': settings} (bodies.validate)")
    return limits


def _check_k(v: int, info: ValidationInfo) -> int:
    top = _limits(info).max_k
    if v > top:
        raise PydanticCustomError("less_than_equal", "Input should be less than or equal to {le}", {"le": top})
    return v


def check_batch(v: list, info: ValidationInfo) -> list:
    """A batch of at most the server's ``max_batch_queries`` queries (a 422 naming the limit beyond it)."""
    top = _limits(info).max_batch_queries
    if len(v) > top:
        raise PydanticCustomError("too_long", "List should have at most {max_length} items", {"max_length": top})
    return v


def _clean_query(v: str, info: ValidationInfo) -> str:
    """The service's query cleaning (search/encoding.py ``clean_query``): control characters dropped,
    whitespace collapsed, the length limit applied to what remains."""
    try:
        return clean_query(v, _limits(info).max_query_chars)
    except BadRequest as e:
        raise ValueError(e.detail) from None


# Ids are the dataset's integer ids (Karpathy imgid / sentid, or the corpus row for corpora), at most
# 2^53 - 1 so that every JSON client (JavaScript numbers are doubles) reads them exactly.
MAX_ID = 2**53 - 1
ItemId = Annotated[int, Field(ge=0, le=MAX_ID)]
K = Annotated[int, Field(ge=1, json_schema_extra=limit_marker(maximum="max_k"),
                         description="number of results, 1 to the server's max_k (the maximum here)"),
              AfterValidator(_check_k)]
ModelName = Annotated[str, Field(min_length=1, max_length=100, description="a model name from GET /api/models")]
FilterJSON = Annotated[dict[str, Any] | None, Field(description="only items whose metadata match: {\"field\": "
                       "\"split\", \"eq\": \"test\"}, {\"and\": [...]}, {\"text\": \"beach\"} … "
                       "(docs/guides/living-index.md)")]
Cursor = Annotated[str | None, Field(max_length=400, description="the `next_cursor` of the previous page")]
QueryText = Annotated[
    str,
    AfterValidator(_clean_query),
    # a character that is neither whitespace nor a control character (those are dropped or collapsed)
    Field(json_schema_extra={"minLength": 1, "pattern": r"[^\s\u0000-\u001f\u007f-\u009f]",
                             **limit_marker(maxLength="max_query_chars")},
          description="free text: control characters are dropped and whitespace collapsed, then it must be 1 to "
                      "the server's max_query_chars (the maxLength here) characters long"),
]
