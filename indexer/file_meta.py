"""What a folder index knows of an image file without decoding it: folder, file time, size, pixel size
and the EXIF date (``file_metadata``), the metadata of folder indexes and the living index's items."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from PIL import Image

_EXIF_DATE = 36867  # DateTimeOriginal (Exif IFD)
_EXIF_DATE_0 = 306  # DateTime (IFD0)


def file_metadata(path: Path, root: Path | None = None) -> dict:
    """What a folder index knows of an image file: its folder (relative to ``root``), modification time,
    size in bytes, width and height, and the EXIF date it was taken when it has one (ISO 8601)."""
    out: dict = {}
    try:
        st = path.stat()
        out["bytes"] = int(st.st_size)
        out["file_time"] = dt.datetime.fromtimestamp(st.st_mtime, dt.UTC).isoformat(timespec="seconds")
    except OSError:
        pass
    if root is not None:
        try:
            parent = path.parent.resolve().relative_to(root.resolve())
            out["folder"] = "" if str(parent) == "." else parent.as_posix()
        except ValueError:
            pass
    try:
        with Image.open(path) as img:  # the header only
            out["width"], out["height"] = int(img.width), int(img.height)
            exif = img.getexif()
            raw = exif.get_ifd(0x8769).get(_EXIF_DATE) or exif.get(_EXIF_DATE_0)
        if isinstance(raw, str) and len(raw) >= 19:  # "YYYY:MM:DD HH:MM:SS"
            out["exif_date"] = dt.datetime.strptime(raw[:19], "%Y:%m:%d %H:%M:%S").isoformat()
    except Exception:  # noqa: BLE001 - a damaged header or EXIF block: the fields are just absent
        pass
    return out
