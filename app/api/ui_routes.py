"""The routes of the mounted Gradio app that the UI uses: an allow-list, everything else is a 404.

Gradio 6 mounts ~60 routes: besides the page, its assets and the event queue, a URL fetcher
(``/gradio_api/file=http…`` and, older, ``/gradio_api/file/…``), a proxy to other Gradio apps, login and
OAuth pages, monitoring, run history, "vibe" code editing, streaming, MCP and custom-component loaders.
A block-list of the bad ones misses the next one Gradio adds, so this is the other way round: the
methods and paths that the browser UI (and a script calling one of its events through ``call/``)
needs, measured by recording what Chromium requests while every tab is used. ``file=`` takes local
paths only (the UI guard then checks that they name uploads). Paths are relative to the mount point.
"""
from __future__ import annotations

import re

_NAME = r"[A-Za-z0-9_-]{1,100}"
_GET = (
    r"/?",  # the page
    r"/config/?",
    r"/gradio_api/info/?",
    r"/(?:assets|static)/[A-Za-z0-9_./@-]{1,300}",
    r"/theme\.css",
    r"/favicon\.ico",
    r"/gradio_api/heartbeat/" + _NAME,
    r"/gradio_api/queue/data",
    r"/gradio_api/upload_progress",
    r"/gradio_api/file=(?![a-zA-Z][a-zA-Z0-9+.-]*:)(?!//)[^\\]{1,2000}",  # a local path, never a URL
    rf"/gradio_api/call/{_NAME}/{_NAME}",  # the result stream of a call
)
_POST = (
    r"/gradio_api/queue/join",
    r"/gradio_api/upload",
    r"/gradio_api/cancel",
    rf"/gradio_api/call/{_NAME}",
)
_ROUTES = {
    "GET": re.compile("|".join(f"(?:{p})" for p in _GET)),
    "HEAD": re.compile("|".join(f"(?:{p})" for p in _GET)),
    "POST": re.compile("|".join(f"(?:{p})" for p in _POST)),
}
_CALL = re.compile(rf"/gradio_api/call/({_NAME})")


def allowed(method: str, path: str) -> bool:
    """Whether the UI uses ``method`` on ``path`` (relative to the mount point)."""
    pattern = _ROUTES.get(method)
    return pattern is not None and pattern.fullmatch(path) is not None


def called_api(path: str) -> str | None:
    """The event name of a ``POST …/gradio_api/call/NAME`` path, else None."""
    m = _CALL.fullmatch(path)
    return m.group(1) if m else None
