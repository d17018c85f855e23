"""What the UI reads from its widgets: k, ids, the text or image query, files uploaded through it,
and dataset items to pick from. Plain functions (no Gradio), raising ``search.BadRequest`` with a
message for the user; ``guarded`` turns any error of an event into an inline notice."""
from __future__ import annotations

import functools
import logging
import random
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gradio.utils import get_upload_folder

from search import BadRequest, DatasetCaption, NotReady, SearchError, SearchService, redact_paths
from ui.render import notice

log = logging.getLogger(__name__)

K_CHOICES = [5, 10, 20, 50]


def guarded(fn: Callable[..., str]) -> Callable[..., str]:
    """Turn service errors into a notice (the detail, never a trace); log anything unexpected."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> str:
        try:
            return fn(*args, **kwargs)
        except NotReady as e:
            return notice(f"Models are still loading: {e.detail}. Try again in a moment.", "loading")
        except SearchError as e:
            return notice(e.detail, "error")
        except Exception as e:  # noqa: BLE001 - the UI must answer with a message, not a trace
            log.exception("UI handler %s failed", fn.__name__)
            return notice(f"Something went wrong ({type(e).__name__}: {redact_paths(str(e))}).", "error")
    return wrapper


def parse_k(k: Any, default: int = 10) -> int:
    """A dropdown's or a shared link's k as an int of at least 1 (``default`` when it is not a number); the
    service refuses one above its ``max_k`` with a message, so the limit is checked in one place."""
    try:
        k = int(k)
    except (TypeError, ValueError, OverflowError):
        return default
    return max(1, k)


def parse_id(value: Any, what: str) -> int | None:
    """A numeric id from a Number/Textbox value; None when empty; BadRequest when not a whole number."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{what} must be a whole number, got {value!r}") from None
    if f != int(f) or f < 0:
        raise BadRequest(f"{what} must be a non-negative whole number, got {value!r}")
    return int(f)


def text_query(text: str | None, picked: DatasetCaption | None) -> dict:
    """The query for a text box: the picked dataset caption (with ground truth) while the box still
    holds its text, free text otherwise."""
    text = (text or "").strip()
    if picked is not None and text and " ".join(text.split()) == " ".join(picked.text.split()):
        return {"caption_id": picked.id}
    if not text:
        raise BadRequest("Type a query, or pick a dataset caption (⚄ random caption, or an example) to see ground truth.")
    return {"query": text}


def read_upload(upload_path: str, max_bytes: int) -> bytes:
    """The bytes of a file the browser uploaded through this UI. Gradio already refuses input paths
    outside its upload folder (app/api/main.py marks the mounted Blocks as launched for that); this
    checks again, and reads only regular files, never more than ``max_bytes`` (no device files, no FIFOs)."""
    try:
        p = Path(upload_path).resolve(strict=True)
        st = p.stat()
    except (OSError, RuntimeError):
        raise BadRequest("the uploaded file is gone; upload it again") from None
    if not p.is_relative_to(Path(get_upload_folder()).resolve()) or not stat.S_ISREG(st.st_mode):
        raise BadRequest("only images uploaded through this page can be searched")
    if st.st_size > max_bytes:
        raise BadRequest(f"upload of {st.st_size:,} bytes exceeds the limit of {max_bytes:,} bytes")
    if st.st_size == 0:
        raise BadRequest("the uploaded file is empty")
    with open(p, "rb") as f:
        return f.read(max_bytes)


def image_query(image_id: Any, upload_path: str | None, max_bytes: int) -> dict:
    """The query for the image inputs: an uploaded file wins over a dataset image id."""
    if upload_path:
        return {"image_bytes": read_upload(upload_path, max_bytes)}
    iid = parse_id(image_id, "image id")
    if iid is None:
        raise BadRequest("Pick a dataset image (click one in the gallery or type its id), or upload an image.")
    return {"image_id": iid}


def random_caption(service: SearchService, model: str, seed: int | None = None,
                   exclude: DatasetCaption | None = None) -> DatasetCaption:
    """One random dataset caption: searching it attaches ground truth. ``exclude``
    (the caption on screen) is skipped so that the button always changes something."""
    rng = random.Random(seed)
    picks = service.sample_captions(model, 8, seed=rng.randrange(1 << 30))
    if not picks:
        raise BadRequest(f"model {model}'s index has no captions")
    fresh = [c for c in picks if exclude is None or c.id != exclude.id] or picks
    return fresh[rng.randrange(len(fresh))]


def example_captions(service: SearchService, model: str, n: int = 8, seed: int = 0) -> list[DatasetCaption]:
    try:
        return service.sample_captions(model, n, seed=seed)
    except SearchError:
        return []


def image_picker(service: SearchService, model: str, n: int = 24, seed: int = 0) -> tuple[list[tuple[str, str]], list[int]]:
    """Gallery items [(thumbnail path, "#id")] and their image ids: dataset images to query with."""
    ids: list[int] = []
    try:
        for c in service.sample_captions(model, n * 4, seed=seed):
            if c.image_id is not None and c.image_id not in ids:
                ids.append(c.image_id)
            if len(ids) >= n:
                break
    except SearchError:
        return [], []
    items = []
    for i in ids:
        try:
            items.append((str(service.thumbnail_file(i, size=160, model=model)), f"#{i}"))
        except SearchError:
            continue
    return items, [int(lbl[1:]) for _, lbl in items]
