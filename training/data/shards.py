"""Webdataset shards: uncompressed tar files whose consecutive members with one key are one sample.

A sample ``000123`` is the members ``000123.jpg`` (or .jpeg/.png/.webp/.bmp), ``000123.txt`` (its
captions, one per non-empty line) and optionally ``000123.json`` (metadata; a ``caption`` or
``captions`` key stands in for a missing .txt, a ``split`` key names the split; without one the
sample is a test sample) — what img2dataset writes. The key is the member path up to the first dot
of its file name, as webdataset defines it.

Shards are read with the standard library's ``tarfile``, one header at a time, from a local path:
``x.tar``, a folder of ``*.tar`` files, or webdataset's brace notation ``shards/{0000..0099}.tar``.
Nothing is extracted and no image is read while scanning: an image is remembered as its byte range
(:class:`.members.ImageMember`), and the text and JSON members (at most ``TEXT_LIMIT`` bytes each)
are the only data read. Member names are never used as file system paths. Compressed shards
(``.tar.gz``) are refused: their members have no byte range to read an image from later.
"""
from __future__ import annotations

import json
import logging
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from training.data.karpathy import DatasetError
from training.data.members import ImageMember
from training.data.tables import Row, json_safe

log = logging.getLogger(__name__)

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
TEXT_LIMIT = 1 << 20  # bytes of one .txt or .json member
COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def is_shard_spec(path: str | Path) -> bool:
    """A tar file, a brace pattern of tar files, or a folder holding tar files."""
    s = str(path)
    if s.endswith((".tar", *COMPRESSED)) or _BRACES.search(s):
        return True
    p = Path(s)
    return p.is_dir() and any(p.glob("*.tar"))


def shard_files(spec: str | Path) -> list[Path]:
    """The shards of ``spec`` in order; every one must exist."""
    s = str(spec)
    if s.endswith(COMPRESSED):
        raise DatasetError(f"{s}: compressed shards are not read (their images have no byte range); decompress them "
                           "to .tar first")
    m = _BRACES.search(s)
    if m:
        lo, hi, width = int(m.group(1)), int(m.group(2)), len(m.group(1))
        if hi < lo or hi - lo > 1_000_000:
            raise DatasetError(f"{s}: the range {{{m.group(1)}..{m.group(2)}}} is empty or too large")
        files = [Path(s[:m.start()] + str(i).zfill(width) + s[m.end():]) for i in range(lo, hi + 1)]
    elif Path(s).is_dir():
        files = sorted(Path(s).glob("*.tar"))
    else:
        files = [Path(s)]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise DatasetError(f"{len(missing)} of {len(files)} shards are missing; first: {missing[0]}")
    return files


def _key_ext(name: str) -> tuple[str, str]:
    p = PurePosixPath(name)
    stem, dot, ext = p.name.partition(".")
    return str(p.parent / stem) if str(p.parent) != "." else stem, ext.lower() if dot else ""


def _read_small(tf: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> bytes:
    if member.size > TEXT_LIMIT:
        raise DatasetError(f"{where}: {member.size:,} bytes is more than a caption or metadata member may hold "
                           f"({TEXT_LIMIT:,})")
    f = tf.extractfile(member)
    return f.read(TEXT_LIMIT) if f is not None else b""


def _members(path: Path) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The regular members of one shard, header by header (the TarFile's member list is emptied as
    it goes, so a shard of millions of members costs no memory)."""
    try:
        tf = tarfile.open(path, mode="r:")
    except (tarfile.TarError, OSError) as e:
        raise DatasetError(f"{path}: not an uncompressed tar file ({type(e).__name__}: {e})") from None
    with tf:
        while True:
            try:
                m = tf.next()
            except tarfile.TarError as e:
                raise DatasetError(f"{path}: broken tar header ({e})") from None
            if m is None:
                return
            tf.members = []
            if m.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not m.issparse():
                yield tf, m


def _sample(path: Path, key: str, parts: dict) -> Row | None:
    """The row of one sample: ``parts`` maps an extension to its image's TarInfo or its text's bytes."""
    where = f"{path}:{key}"
    image = next((parts[e] for e in IMAGE_EXTS if isinstance(parts.get(e), tarfile.TarInfo)), None)
    if image is None:
        log.debug("%s: no image member; skipped", where)
        return None
    meta: dict = {}
    if "json" in parts:
        try:
            meta = json.loads(parts["json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise DatasetError(f"{where}.json: not valid JSON ({str(e)[:120]})") from None
        meta = meta if isinstance(meta, dict) else {"json": meta}
    if "txt" in parts:
        text = parts["txt"].decode("utf-8", errors="replace")
        captions = [ln.strip() for ln in text.splitlines() if ln.strip()]
    else:
        cell = meta.get("captions", meta.get("caption"))
        captions = [str(c).strip() for c in (cell if isinstance(cell, list) else [cell]) if c and str(c).strip()]
    split = meta.get("split")
    extra = {k: json_safe(v) for k, v in meta.items() if k not in ("caption", "captions", "split")}
    member = ImageMember(path, image.offset_data, image.size, image.name)
    return Row(image=member, captions=captions, split=str(split) if split else None,
               metadata={"key": key, **extra}, where=where)


def read_shards(spec: str | Path) -> Iterator[Row]:
    """One row per sample of every shard, in shard and member order."""
    for path in shard_files(spec):
        key, parts = None, {}
        for tf, m in _members(path):
            k, ext = _key_ext(m.name)
            if k != key:
                if key is not None and (row := _sample(path, key, parts)) is not None:
                    yield row
                key, parts = k, {}
            if ext in ("txt", "json"):
                parts.setdefault(ext, _read_small(tf, m, f"{path}:{m.name}"))
            elif ext in IMAGE_EXTS:
                parts.setdefault(ext, m)
        if key is not None and (row := _sample(path, key, parts)) is not None:
            yield row
