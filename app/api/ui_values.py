"""What a UI request may carry: file values that name uploads, no URLs, no data URLs, calls that exist.

Gradio turns any file-shaped value of an event's payload into a file before a handler runs: a ``path``
that is an ``http(s)://`` URL is downloaded, and an image value whose ``url`` is a ``data:`` URL is
base64-decoded and re-encoded as WebP with no pixel budget (a 43 KB PNG of 16,383² 1-bit pixels took
3.8 GB and 19 s). So every dict in a payload that has a ``path`` or a ``url`` key, or Gradio's
``FileData`` marker, whatever else it holds and however deeply it is nested, is checked:

- ``path`` must be a string naming an existing file inside the upload folder (not a URL, not a link out
  of it, not the folder itself);
- ``url``, when present, must be the UI's own file route for that same path
  (``…/gradio_api/file=<path>``, which is what the browser sends back) or the path itself; anything
  else is refused;
- no string anywhere in the payload may be a ``data:`` URL (the UI uploads files; it never sends them
  inline).

``UICalls`` knows the mounted Blocks' events: a call names an existing event and passes as many inputs
as it takes, or it is refused with a 4xx before Gradio sees it (Gradio answers unknown API names and
short input lists with a 500 and a 5–13 KB traceback in the log).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote

FILE_MARK = "gradio.FileData"
_DATA_URL = re.compile(r"\s*data:", re.IGNORECASE)
_FILE_ROUTE = "gradio_api/file="
_SESSION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ForbiddenFile(ValueError):
    """A file value the UI does not accept (400 ``forbidden_file``)."""


class BadCall(ValueError):
    """A call of the UI's API that is not one of its events, or not with its inputs."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status


def _file_like(node: dict) -> bool:
    meta = node.get("meta")
    return "path" in node or "url" in node or (isinstance(meta, dict) and meta.get("_type") == FILE_MARK)


def _inside(path: str, root: str) -> str:
    """The real path of ``path`` when it is a file inside ``root``; ForbiddenFile otherwise."""
    if "://" in path or path.startswith(("//", "\\\\")):
        raise ForbiddenFile("the UI does not fetch URLs: upload the file instead")
    real = os.path.realpath(path)
    if os.path.commonpath([real, root]) != root or real == root:
        raise ForbiddenFile("the UI accepts only files uploaded through it")
    if not os.path.isfile(real):  # Gradio's own error would echo the server's folder
        raise ForbiddenFile("the uploaded file is gone (uploads are kept for a while); upload it again")
    return real


def _check_url(url: object, real: str) -> None:
    if url is None:
        return
    if not isinstance(url, str) or _DATA_URL.match(url):
        raise ForbiddenFile("the UI does not decode inline (data:) files: upload the file instead")
    if url.startswith("/") and not url.startswith("//") and os.path.realpath(url) == real:
        return  # the path itself
    route = url.find(_FILE_ROUTE)
    if route < 0 or not (url.startswith(("http://", "https://", "/"))) or url.startswith("//"):
        raise ForbiddenFile("the UI does not fetch URLs: upload the file instead")
    named = unquote(url[route + len(_FILE_ROUTE):].split("?", 1)[0])
    if os.path.realpath(named) != real:
        raise ForbiddenFile("a file value's url must be the UI's own address of that file")


def check_file_values(data: object, upload_dir: str | os.PathLike) -> int:
    """The number of file values in ``data`` (parsed JSON); ForbiddenFile for the first value the
    module doc refuses. Iterative: a deeply nested payload cannot exhaust the stack."""
    root, count, stack = os.path.realpath(upload_dir), 0, [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if _file_like(node):
                count += 1
                path = node.get("path")
                if not isinstance(path, str):
                    raise ForbiddenFile("a file value must name a file uploaded through the UI")
                _check_url(node.get("url"), _inside(path, root))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and _DATA_URL.match(node):
            raise ForbiddenFile("the UI does not decode inline (data:) files: upload the file instead")
    return count


@dataclass(frozen=True)
class UICalls:
    """The events of the mounted Blocks: fn index → number of inputs, API name → fn index."""

    inputs: dict[int, int]
    api_names: dict[str, int]

    @classmethod
    def of(cls, blocks) -> UICalls:
        """Read from a Gradio ``Blocks``: each event's input count, and the index of each event with an API name."""
        inputs, names = {}, {}
        for index, fn in blocks.fns.items():
            inputs[int(index)] = len(fn.inputs)
            if isinstance(fn.api_name, str) and fn.api_name:
                names[fn.api_name] = int(index)
        return cls(inputs, names)

    def _check_data(self, data: object, index: int) -> None:
        if not isinstance(data, list):
            raise BadCall(422, "'data' must be a list of the event's input values")
        if len(data) != self.inputs[index]:
            raise BadCall(422, f"this event takes {self.inputs[index]} input value(s), not {len(data)}")

    def check_api_call(self, api_name: str, body: object) -> None:
        """``POST …/call/API_NAME {"data": [...]}``."""
        if api_name not in self.api_names:
            raise BadCall(404, "the UI has no event of that name (GET /ui/config lists them)")
        if not isinstance(body, dict):
            raise BadCall(422, "the body must be a JSON object with a 'data' list")
        self._check_data(body.get("data"), self.api_names[api_name])

    def check_join(self, body: object) -> None:
        """``POST …/queue/join {"fn_index": N, "data": [...], "session_hash": "…"}``."""
        if not isinstance(body, dict):
            raise BadCall(422, "the body must be a JSON object")
        index = body.get("fn_index")
        if isinstance(index, bool) or not isinstance(index, int) or index not in self.inputs:
            raise BadCall(422, "'fn_index' must name one of the UI's events")
        session = body.get("session_hash")
        if not isinstance(session, str) or not _SESSION.match(session):
            raise BadCall(422, "'session_hash' must be 1-64 letters, digits, '_' or '-'")
        self._check_data(body.get("data"), index)
