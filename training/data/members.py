"""Images that live inside another file: a member of an uncompressed tar shard (webdataset).

An :class:`ImageMember` names a byte range of a container file (``offset``, ``size``: where the
member's data starts and how long it is), found while the shard was read once, header by header.
Decoding one reads exactly that range, so a corpus of shards is never unpacked and never held in
memory; worker processes open the container themselves. Everything that lists image paths (the
decode pool, the feature cache, index metadata) takes a member where it takes a path:
:func:`image_source` keeps members as they are and turns anything else into a ``Path``.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

# One image's encoded bytes; a 144-megapixel PNG is ~430 MB raw, but a captioned corpus photo is a few MB.
MAX_MEMBER_BYTES = 64 << 20


@dataclass(frozen=True)
class ImageMember:
    """``size`` bytes at ``offset`` of ``container``: one image inside a shard (``name``: its member name)."""

    container: Path
    offset: int
    size: int
    name: str

    @classmethod
    def recorded(cls, container: Path, members: list | None, pos: int) -> ImageMember | None:
        """Row ``pos``'s member of ``container`` as an index's metadata records it (``members[pos]`` =
        ``[name, offset, size]``, ``location``'s second value); None for a row that is a file (no record,
        or a row added after the build); ValueError for a malformed record."""
        record = members[pos] if members is not None and pos < len(members) else None
        if record is None:
            return None
        ok = isinstance(record, list) and len(record) == 3 and isinstance(record[0], str) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in record[1:]) and record[1] >= 0 and record[2] > 0
        if not ok:
            raise ValueError(f"not a shard member record: {str(record)[:80]}")
        return cls(container, record[1], record[2], record[0])

    def __str__(self) -> str:  # messages and logs: the shard and the member
        return f"{self.container}:{self.name}"

    @property
    def parent(self) -> Path:
        """The folder the shard lies in (an index built from members serves nothing outside it)."""
        return self.container.parent

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    def resolve(self) -> ImageMember:
        return replace(self, container=self.container.resolve())

    def is_relative_to(self, folder: Path) -> bool:
        return self.container.is_relative_to(folder)

    def is_file(self) -> bool:
        """Whether the byte range lies inside an existing container."""
        try:
            return self.container.is_file() and self.offset + self.size <= self.container.stat().st_size
        except OSError:
            return False

    def read_bytes(self, limit: int = MAX_MEMBER_BYTES) -> bytes:
        """The member's bytes (OSError when the container is shorter than the range, or the member is
        larger than ``limit``)."""
        with open(self.container, "rb") as f:
            return self.read_from(f, limit)

    def read_from(self, f, limit: int = MAX_MEMBER_BYTES) -> bytes:
        """``read_bytes`` from ``f``, the container already open."""
        if self.size > limit:
            raise OSError(f"{self.size:,} bytes is more than the {limit:,} an image may have")
        f.seek(self.offset)
        data = f.read(self.size)
        if len(data) != self.size:
            raise OSError(f"the shard ends after {len(data)} of the member's {self.size} bytes (truncated?)")
        return data

    def cache_id(self) -> str:
        """What the feature cache keys this image by: the shard's absolute path, size and the range."""
        try:
            size = os.path.getsize(self.container)
        except OSError:
            size = -1
        return f"{os.path.abspath(self.container)}\0{size}\0{self.offset}+{self.size}"


ImageSource = Path | ImageMember


def image_source(p: str | os.PathLike | ImageMember) -> ImageSource:
    """A path as a ``Path``; a shard member unchanged."""
    return p if isinstance(p, ImageMember) else Path(p)


def image_sources(paths: Sequence[str | os.PathLike | ImageMember]) -> list[ImageSource]:
    return [image_source(p) for p in paths]


def location(p: ImageSource) -> tuple[str, list | None]:
    """How an index records an image: the resolved file (for a member, its shard) and, for a member,
    ``[name, offset, size]``."""
    if isinstance(p, ImageMember):
        r = p.resolve()
        return str(r.container), [r.name, r.offset, r.size]
    return str(Path(p).resolve()), None
