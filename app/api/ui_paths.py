"""The UI's answers name no folder of the server: private folders are shown under short aliases.

Gradio names every file by its absolute path: the upload reply, each event's output values and their
``url`` fields carry ``/home/…/.cache/ltd/ui-uploads/<hash>/x.jpg``, which tells a client the user's home
folder and the cache layout. ``PathAliases`` replaces each private folder (the upload folder, the
thumbnail folder) by an alias such as ``@ltd-uploads`` in what the UI sends out, and the alias by the
folder in what comes in (request bodies and ``/gradio_api/file=`` paths), so Gradio itself still sees
absolute paths. The browser only ever echoes back what it was given, so it never notices.

Replacement is on bytes, in three spellings of each folder: raw, URL-quoted and JSON-escaped. Streamed
answers (Gradio's server-sent events) are rewritten chunk by chunk: a chunk's tail that could be the
start of a folder's name is held back until the next chunk (an event ends in a blank line, which never
is, so no event is delayed).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

ALIAS_PREFIX = "@ltd-"


class PathAliases:
    """Two-way byte replacement between private folders and their aliases (see the module doc)."""

    def __init__(self, folders: dict[str, str | Path]):
        """``folders``: alias name → folder, e.g. ``{"uploads": "/home/u/.cache/ltd/ui-uploads"}``."""
        self.out: list[tuple[bytes, bytes]] = []
        self.back: list[tuple[bytes, bytes]] = []
        for name, folder in folders.items():
            real = str(Path(folder).absolute()).rstrip("/")
            alias = f"{ALIAS_PREFIX}{name}"
            for spelling in {real, quote(real, safe="/"), json.dumps(real)[1:-1]}:
                self.out.append((spelling.encode(), alias.encode()))
            self.back.append((alias.encode(), real.encode()))
            self.back.append((quote(alias, safe="/").encode(), real.encode()))  # "%40ltd-uploads" in a URL
        self.out.sort(key=lambda p: -len(p[0]))  # the longest spelling first
        self._hold = max((len(s) for s, _ in self.out), default=1) - 1

    @staticmethod
    def _replace(data: bytes, pairs: Iterable[tuple[bytes, bytes]]) -> bytes:
        for old, new in pairs:
            if old in data:
                data = data.replace(old, new)
        return data

    def hide(self, data: bytes) -> bytes:
        """Outgoing: every private folder → its alias."""
        return self._replace(data, self.out)

    def reveal(self, data: bytes) -> bytes:
        """Incoming: every alias → its folder."""
        return self._replace(data, self.back)

    def reveal_path(self, path: str) -> str:
        """An incoming URL path (``/ui/gradio_api/file=@ltd-uploads/…``) with its alias resolved."""
        return self.reveal(path.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def streaming(self) -> StreamHider:
        """A new ``StreamHider`` over these aliases, for one body that arrives in chunks."""
        return StreamHider(self)


class StreamHider:
    """Hides folders in a body that arrives in chunks (see the module doc): ``feed`` each chunk, then
    ``flush`` what was held back at the end."""

    def __init__(self, aliases: PathAliases):
        self.aliases, self.carry = aliases, b""

    def feed(self, chunk: bytes) -> bytes:
        """The next chunk with its folders hidden, less a tail that could start a folder's name (held back
        for the next chunk or ``flush``)."""
        data = self.aliases.hide(self.carry + chunk)
        keep = self._partial_tail(data)
        self.carry = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep] if keep else data

    def flush(self) -> bytes:
        """The held-back tail with its folders hidden (empty if none); call once, at the end of the body."""
        out, self.carry = self.aliases.hide(self.carry), b""
        return out

    def _partial_tail(self, data: bytes) -> int:
        """The length of the longest tail of ``data`` that is a proper prefix of a folder's spelling."""
        for n in range(min(self.aliases._hold, len(data)), 0, -1):
            tail = data[-n:]
            if any(old.startswith(tail) for old, _ in self.aliases.out):
                return n
        return 0
