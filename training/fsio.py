"""Crash-safe file writes: every file this project writes is whole or absent.

One pattern, used everywhere: write to a temporary name in the same folder (``.NAME.tmp<pid>.<thread>``),
flush and fsync it, ``os.replace`` it over the final name (atomic on POSIX), then fsync the folder
so the rename itself survives a power cut. A process killed at any point leaves either the old file
or the new one, plus at most an orphaned temporary that the next write to the same folder removes
(``remove_stale_temps``: only temporaries whose writing process is gone).

Private folders (``private_folder``: 0700, this user's, not a link, writable by nobody else) hold what
must not be planted by another local user: the UI's uploads and thumbnails, exported engine files.

This module sits at the bottom of the import graph (``training``), so every layer can use it.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_TMP_RE = re.compile(r"^\..+\.tmp(\d+)(\..*)?$")


def temp_name(path: Path) -> Path:
    """The temporary sibling this thread of this process writes ``path`` through (two threads writing
    the same file, two requests uploading the same image, never share one)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def is_stale_temp(path: Path) -> bool:
    """A temporary left by a process that no longer runs (so nothing will ever rename it)."""
    m = _TMP_RE.match(path.name)
    return bool(m) and not _pid_alive(int(m.group(1)))


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete the temporaries that killed writers left in ``folder`` (files and folders); returns them."""
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        if is_stale_temp(p):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def private_folder(path: str | Path) -> Path:
    """``path`` as a folder only this user can use: created 0700 (parents too); an existing one must
    be a real folder (not a link) owned by this user that nobody else can write to (its read bits
    for others are then removed). PermissionError otherwise."""
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} is not a private folder of this user (a link, someone else's, or writable "
                              "by others); remove it or name another")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def private_folder_or_temp(preferred: str | Path, prefix: str) -> Path:
    """``preferred`` made private, or (when it cannot be) a fresh private temporary folder."""
    try:
        return private_folder(preferred)
    except OSError as e:
        folder = Path(tempfile.mkdtemp(prefix=prefix))  # 0700, a random name
        logging.getLogger(__name__).warning("%s; using %s instead", e, folder)
        return folder


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of a file's bytes, read now (no cache: a file rewritten in place gets its new digest).
    The one file digest of the project: manifests, checkpoints, weights, judges."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fsync_dir(folder: str | Path) -> None:
    """Make renames and unlinks in ``folder`` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write ``path`` through; on success it replaces ``path``.

    For writers that want a file name (``torch.save``, ``faiss.write_index``, ``np.save`` on an
    open file). On an exception the temporary is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: str | Path, data: bytes, *, durable: bool = True) -> Path:
    with atomic_path(path, durable=durable) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, *, durable: bool = True) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def write_json_atomic(path: str | Path, obj: object, *, durable: bool = True, **dump_kwargs) -> Path:
    """JSON through a temporary file and a rename: readers never see half a file."""
    return atomic_write_text(path, json.dumps(obj, **dump_kwargs), durable=durable)


def save_npy_atomic(path: str | Path, array, *, durable: bool = True) -> Path:
    with atomic_path(path, durable=durable) as tmp:
        with open(tmp, "wb") as f:  # an open file: np.save would otherwise append ".npy" to the name
            np.save(f, np.asarray(array), allow_pickle=False)
    return Path(path)


@contextlib.contextmanager
def exclusive(lock_file: str | Path, what: str = "") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing) for the block: one process at
    a time computes a cache entry, the others wait and then find it done. The kernel releases the lock
    when its holder dies, so a killed process never leaves it stuck."""
    with open(lock_file, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.getLogger(__name__).info("another process is computing %s: waiting for it", what or lock_file)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
