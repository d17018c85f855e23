"""Files the server reads and writes on a client's behalf, kept to what it owns.

- **Images it serves** are the index's own: an image path recorded in an index is served only when,
  links followed, it lies inside one of the index's image folders (``IndexDir.image_file``), has an
  image file's extension, and starts with an image type's magic bytes; it is read only through a
  descriptor whose real path is that checked one (``open_served``: a link swapped in after the check
  is refused). A crafted ``images.json``
  naming ``/etc/passwd`` (with the manifest's hashes recomputed to match) is refused, not served,
  even in an index old enough to record no image folders.
- **Folders it writes** for the UI (thumbnails, Gradio's upload cache) are private: created 0700 by
  this user, refused when they are a link, belong to someone else or are writable by others (a local
  user who creates ``/tmp/ltd-ui-thumbs`` first must not choose what the UI serves), and files are
  written through ``O_NOFOLLOW | O_EXCL`` temporaries, so no link planted in advance is followed.
"""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from search.errors import NotFound
from training.data.members import MAX_MEMBER_BYTES, ImageMember

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
# Magic numbers of the formats load_image accepts (WebP is RIFF....WEBP).
_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
          (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))


def sniff_image_type(data: bytes) -> str | None:
    """The image format named by the first bytes, or None when they are not an accepted image type."""
    for magic, fmt in _MAGIC:
        if data.startswith(magic):
            return fmt
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


# ---- images an index serves ------------------------------------------------------------------------
def servable_image(path: Path | ImageMember, what: str) -> Path | ImageMember:
    """``path`` (already resolved and confined to the index's image folders: IndexDir.image_file) when
    it is a regular file with an image extension whose first bytes name an image type — or a shard
    member with an image name, inside its shard and at most ``MAX_MEMBER_BYTES``, whose first bytes do;
    NotFound otherwise (the message says what is wrong, not where)."""
    member = path if isinstance(path, ImageMember) else None
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise NotFound(f"{what} is not an image file; it is not served")
    with open_served(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if member is not None and (member.size > MAX_MEMBER_BYTES or member.offset + member.size > size):
            raise NotFound(f"{what} is not inside its shard as the index recorded it (changed or truncated?)")
        try:
            f.seek(member.offset if member is not None else 0)
            head = f.read(min(16, member.size) if member is not None else 16)
        except OSError:
            raise NotFound(f"{what} cannot be read on the server") from None
    if sniff_image_type(head) is None:
        raise NotFound(f"{what} is not an image file; it is not served")
    return path


def open_served(path: Path | ImageMember, what: str):
    """The file of a served image (its shard, for a member; ``path`` resolved and confined already),
    open for reading — only when the file opened is that path's: a name swapped for a link since the
    check leads elsewhere and is refused, so every read of a served image goes through this."""
    container = path.container if isinstance(path, ImageMember) else path
    f, real = open_regular(container, what)
    if real != container:
        f.close()
        raise NotFound(f"{what} changed on the server since it was checked; it is not served")
    return f


def open_regular(path: Path, what: str):
    """``path`` open for reading, and the real path of the file opened (``opened_path``), when it is a
    regular file; NotFound otherwise. O_NONBLOCK: a FIFO found there opens without waiting for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotFound(f"{what}: its file is missing on the server") from None
    except OSError:
        raise NotFound(f"{what} cannot be read on the server") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotFound(f"{what} is not a regular file")
    f = os.fdopen(fd, "rb")
    return f, opened_path(f, path)


def opened_path(f, path: Path) -> Path:
    """The real path of the open file ``f`` (opened as ``path``): read from its descriptor where the
    system says (Linux's /proc), so no link swapped in after a check can point it elsewhere."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{f.fileno()}"))
    except OSError:
        return path.resolve()


# ---- private files (private folders: training/fsio.py) -------------------------------------------
def write_private(path: Path, data: bytes) -> Path:
    """``data`` at ``path`` through a temporary opened with O_NOFOLLOW | O_EXCL (no link followed or
    reused) and renamed over ``path`` (a link there is replaced, not followed)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def is_own_file(path: Path, size: int) -> bool:
    """True when ``path`` is a regular file (not a link) of ``size`` bytes owned by this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size == size
