"""The UI's state in the page URL, so that a comparison can be linked and reopened.

``/ui/?tab=compare&a=bl&b=ltd&k=10&cid=1234`` opens the Compare tab on dataset caption 1234 with
those models; ``q=`` is free text, ``img=`` a dataset image query, ``ex=`` the image whose word
attributions are shown; ``tab=explorer&view=words`` the Explorer's words view, ``word=`` the map's
colouring word; ``f=`` the filter bar's filter (JSON, ui/filters.py). A link pins what each model
served when it was made: ``ga=3.12&gb=1.0`` is model a's index generation 3 after its item-store write
12 (``pins``); opened after the index changed (a compaction, or items added, removed or edited since),
the page says so above what it shows (``pin_note``). The page reads the URL once on load (``read``)
and rewrites it, without reloading and without a new history entry, whenever the shown state changes
(``SYNC_JS``).

Everything read from a URL is hostile: unknown keys are dropped, values are length-capped, ids must
be whole numbers, models must be served ones, k one of the offered choices; a bad value is ignored,
never an error.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from search import SearchError, SearchService
from ui import filters
from ui.render import notice

TABS = ("search", "compare", "explorer", "caption", "training")
VIEWS = ("queries", "words", "map")
MAX_VALUE = 1000
MAX_FILTER = 4000  # characters of the f= value (a filter's JSON)
_PIN = re.compile(r"\d{1,9}\.\d{1,15}")

SYNC_JS = """(s) => {
  if (typeof s !== 'string' || !s) return;
  const u = new URL(window.location.href);
  u.search = s;
  window.history.replaceState(window.history.state, '', u.toString());
}"""
"""js of an event on the hidden state box: the box holds the query string of the state to keep."""

TAB_JS = """() => setTimeout(() => {
  const b = document.querySelector('#ltd-tabs button[role="tab"][aria-selected="true"]');
  if (!b) return;
  const ids = {Search: 'search', Compare: 'compare', Explorer: 'explorer', Caption: 'caption', Training: 'training'};
  const id = ids[b.textContent.trim()];
  if (!id) return;
  const u = new URL(window.location.href);
  if (u.searchParams.get('tab') === id) return;
  u.searchParams.set('tab', id);
  window.history.replaceState(window.history.state, '', u.toString());
}, 50)"""
"""js of the tab bar's select event: the selected tab goes into the URL."""

READ_JS = "(x) => window.location.search"
"""js of the page's load event: hands the URL's query string to the Python side."""


@dataclass(frozen=True)
class UIState:
    tab: str | None = None
    a: str | None = None
    b: str | None = None
    k: int | None = None
    q: str | None = None  # free text
    cid: int | None = None  # a dataset caption
    img: int | None = None  # a dataset image (image → captions)
    ex: int | None = None  # the image whose word attributions are shown
    view: str | None = None  # explorer: queries | words | map
    word: str | None = None  # explorer map: colour by this word
    f: dict | None = None  # the filter bar's filter
    ga: str | None = None  # "generation.write" model a served when the link was made
    gb: str | None = None

    def query(self) -> dict | None:
        """The Compare query this state names ({"caption_id"} / {"query"} / {"image_id"}), if any."""
        if self.cid is not None:
            return {"caption_id": self.cid}
        if self.q:
            return {"query": self.q}
        if self.img is not None:
            return {"image_id": self.img}
        return None


def _id(v: str) -> int | None:
    return int(v) if v.isdigit() and len(v) <= 16 else None


def _filter(text: str) -> dict | None:
    """A filter the bar built, from its JSON in a link (anything else: None)."""
    try:
        flt = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None
    return flt if filters.bar_values(flt) is not None else None


def read(search: str, models: list[str], k_choices: list[int]) -> UIState:
    """The state a URL query string names, keeping only valid values."""
    raw: dict[str, str] = {}
    for key, value in parse_qsl((search or "").lstrip("?")[: 8 * MAX_VALUE + MAX_FILTER], keep_blank_values=False):
        if key not in raw:  # the first of repeated keys
            raw[key] = value[:MAX_FILTER if key == "f" else MAX_VALUE]
    k = _id(raw.get("k", ""))
    return UIState(tab=raw.get("tab") if raw.get("tab") in TABS else None,
                   a=raw.get("a") if raw.get("a") in models else None,
                   b=raw.get("b") if raw.get("b") in models else None,
                   k=k if k in k_choices else None,
                   q=" ".join(raw.get("q", "").split()) or None,
                   cid=_id(raw.get("cid", "")), img=_id(raw.get("img", "")), ex=_id(raw.get("ex", "")),
                   view=raw.get("view") if raw.get("view") in VIEWS else None,
                   word=" ".join(raw.get("word", "").split())[:100] or None,
                   f=_filter(raw.get("f", "")),
                   ga=raw["ga"] if _PIN.fullmatch(raw.get("ga", "")) else None,
                   gb=raw["gb"] if _PIN.fullmatch(raw.get("gb", "")) else None)


def write(tab: str, **fields: object) -> str:
    """The query string of a state (empty fields left out), e.g. ``tab=compare&a=bl&b=ltd&k=10&cid=3``."""
    keep = {k: v for k, v in fields.items() if v is not None and v != ""}
    return urlencode({"tab": tab, **keep})


def filter_value(flt: dict | None) -> str | None:
    """The ``f=`` value of a filter (compact JSON), None without one."""
    return json.dumps(flt, separators=(",", ":"), ensure_ascii=False) if flt else None


def pin(service: SearchService, name: str) -> str | None:
    """What model ``name`` serves now, as a link pins it: ``"GENERATION.WRITE"`` (None when it cannot say)."""
    try:
        e = service.registry.get(name)
    except SearchError:
        return None
    return f"{int(e.generation)}.{int(e.seq)}"


def pins(service: SearchService, a: str, b: str) -> dict[str, str | None]:
    """The ``ga`` / ``gb`` pins of a link about models ``a`` and ``b``."""
    return {"ga": pin(service, a), "gb": pin(service, b)}


def pin_note(service: SearchService, state: UIState, a: str, b: str) -> str:
    """A notice when a link's pinned index state differs from what its models serve now ('' when the
    same, or when the link pins nothing)."""
    changed = []
    for name, pinned in ((a, state.ga), (b, state.gb)) if a != b else ((a, state.ga),):
        now = pin(service, name)
        if pinned is None or now is None or pinned == now:
            continue
        (g0, w0), (g1, w1) = pinned.split("."), now.split(".")
        what = (f"generation {g0} → {g1} (compacted or rebuilt)" if g0 != g1 else
                f"generation {g0}, item-store write {w0} → {w1} (items added, removed or edited)")
        changed.append(f"{name}: {what}")
    if not changed:
        return ""
    return notice("This link was made on another state of the index, so what it shows may differ from what its "
                  "author saw: " + "; ".join(changed) + ".", "warn")


def compare_state(a: str, b: str, k: object, query: dict | None, explained: int | None = None, *,
                  flt: dict | None = None, pins: dict | None = None) -> str:
    """The URL state of a Compare view: models, k, the query, the explained image, the filter and what
    each model served (``pins``)."""
    q = query or {}
    return write("compare", a=a, b=b, k=k, cid=q.get("caption_id"), q=q.get("query"), img=q.get("image_id"),
                 ex=explained, f=filter_value(flt), **(pins or {}))
