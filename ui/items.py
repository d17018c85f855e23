"""Writes from the UI: photos dropped on the Search tab are added to a model's living index, and an
item is removed from its result card. Both go through ``service.writes`` (search/writes.py), the code
path of ``POST`` and ``DELETE /api/models/{name}/items``: the same checks (type sniffing, the pixel
budget, ``max_items_per_add``, metadata rules), durable when they return, seen by the next query.

Only when the UI may write (``UIContext.writes``: a writable server whose writes need no token);
files are read only from the UI's upload folder (``inputs.read_upload``). Plain functions returning
HTML, errors as notices (``inputs.guarded``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from search import BadRequest, Forbidden
from search.writes import Upload
from ui import inputs
from ui.context import UIContext
from ui.render import actions_html, esc, notice

WRITES_OFF = ("This server does not take writes from the page: start it with `ltd serve --writable` (on "
              "127.0.0.1) to add and remove photos here. A server with a write token takes writes through the "
              "REST API only.")
MAX_METADATA_CHARS = 4000


def _check_writes(ctx: UIContext) -> None:
    if not ctx.writes:
        raise Forbidden(WRITES_OFF)


def parse_metadata(text: Any) -> dict:
    """The metadata box: empty, or a JSON object (its fields are checked by the write, as the REST route's)."""
    text = str(text or "").strip()
    if not text:
        return {}
    if len(text) > MAX_METADATA_CHARS:
        raise BadRequest(f"metadata of at most {MAX_METADATA_CHARS:,} characters")
    try:
        md = json.loads(text)
    except (ValueError, RecursionError):
        raise BadRequest('metadata must be a JSON object, e.g. {"album": "2025"}') from None
    if not isinstance(md, dict):
        raise BadRequest('metadata must be a JSON object, e.g. {"album": "2025"}')
    return md


def _files(paths: Any) -> list[str]:
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise BadRequest("drop image files to add them")
    return paths


@inputs.guarded
def add_photos(ctx: UIContext, model: str, paths: Any, metadata: Any = "") -> str:
    """Add the uploaded photos (``paths``: files in the UI's upload folder) to ``model`` with the metadata
    box's fields; the answer lists each with its id, new or already there."""
    _check_writes(ctx)
    files = _files(paths)
    if not files:
        raise BadRequest("Drop one or more photos here to add them.")
    limit = ctx.limits.max_items_per_add
    if len(files) > limit:
        raise BadRequest(f"add at most {limit} photos at a time ({len(files)} given)")
    md = parse_metadata(metadata)
    uploads = [Upload(data=inputs.read_upload(p, ctx.limits.max_upload_bytes), filename=Path(p).name, metadata=dict(md))
               for p in files]
    out = ctx.service.writes.add(model, uploads)
    return added_html(ctx, model, out, [u.filename for u in uploads])


def added_html(ctx: UIContext, model: str, out: list[dict], names: list[str]) -> str:
    """What an add answered: a line of counts, then a card per photo (its id, file name, "more like this")."""
    new = sum(bool(o["added"]) for o in out)
    again = len(out) - new
    line = f"Added {new} photo{'s' if new != 1 else ''} to model {model}" + (
        f"; {again} {'was' if again == 1 else 'were'} already there (same bytes: same id)" if again else "") + "."
    cards = []
    for o, name in zip(out, names):
        iid = int(o["id"])
        tag = "new" if o["added"] else "already there"
        cards.append(f'<figure class="ltd-card neutral" data-image-id="{iid}" title="{esc(name)}">'
                     f'<div class="ltd-thumb"><img loading="lazy" decoding="async" src="{esc(ctx.thumbs(iid, model, 256))}" '
                     f'alt="{esc(name)}"></div><figcaption><span class="ltd-id">#{iid}</span>'
                     f'<span class="ltd-score">{esc(tag)}</span></figcaption>{actions_html(iid, model, ("similar",))}'
                     f"</figure>")
    return f'<div class="ltd-added">{notice(line, "info")}<div class="ltd-grid">{"".join(cards)}</div></div>'


def card_target(ctx: UIContext, data: Any) -> tuple[str, int]:
    """(model, image id) of a card's button click (the browser's {"iid", "model"}); BadRequest otherwise."""
    if not isinstance(data, dict):
        raise BadRequest("that card is no longer on the page")
    model = data.get("model")
    if not isinstance(model, str) or model not in ctx.names:
        raise BadRequest("that card's model is not served here")
    iid = inputs.parse_id(data.get("iid"), "image id")
    if iid is None:
        raise BadRequest("that card names no image")
    return model, iid


@inputs.guarded
def remove_item(ctx: UIContext, data: Any) -> str:
    """Remove the image of a card's "remove" button from its model's index: gone from every answer when
    this returns. A notice says so (or why not)."""
    _check_writes(ctx)
    model, iid = card_target(ctx, data)
    ctx.service.writes.remove(model, iid)
    return notice(f"Removed image #{iid} from model {model}: no search, image or link shows it any more.", "info")
