"""Where a server may read image files from: the folders the operator gave, never what a manifest says.

An index directory's manifest lists its image folders (``image_roots``), and a server serves an image
file only inside them (``IndexDir.image_file``). But the manifest is a file of the index directory: an
index copied from someone else can say ``"image_roots": ["/"]`` (with its hashes recomputed) and name any
image file on the machine. So the folders are also recorded *outside* the index, by the command that was
given them: ``ltd index`` adds the dataset's image folder, or the ``--images-dir`` it indexed, to a
record in a private folder of this user's cache (``CACHE/trust/image-roots.json``, keyed by the index
directory's real path). A server then serves image files only from folders that are both in the
manifest and allowed: inside the folders recorded for that index, or inside an ``--images-root`` the
operator gives at serve time (which replaces the record). An index nobody recorded serves search
results, but no image files, and says why in the log.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from training.env import default_cache_dir
from training.fsio import exclusive, private_folder, write_json_atomic

log = logging.getLogger(__name__)

RECORD = "image-roots.json"


def _record_path() -> Path:
    return private_folder(default_cache_dir() / "trust") / RECORD


def _read(path: Path) -> dict[str, list[str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): [str(r) for r in v] for k, v in data.items() if isinstance(v, list)}


def record(index_dir: str | Path, roots: Iterable[str | Path]) -> None:
    """Remember that the operator gave ``roots`` for ``index_dir`` (added to what was recorded before)."""
    roots = sorted({str(Path(r).resolve()) for r in roots if r})
    if not roots:
        return
    path = _record_path()
    key = str(Path(index_dir).resolve())
    with exclusive(path.with_name(RECORD + ".lock"), "the image-folder record"):
        data = _read(path)
        data[key] = sorted(set(data.get(key, [])) | set(roots))
        write_json_atomic(path, data, indent=1)


def recorded(index_dir: str | Path) -> list[Path]:
    """The folders recorded for ``index_dir`` (none when it was built elsewhere or by another user)."""
    return [Path(r) for r in _read(_record_path()).get(str(Path(index_dir).resolve()), [])]


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def allowed_roots(index_dir: str | Path, manifest_roots: Iterable[Path],
                  operator_roots: Iterable[str | Path] = ()) -> tuple[Path, ...]:
    """Where the manifest's folders and what the operator allowed (``operator_roots``, else the record
    for ``index_dir``) overlap: each manifest folder inside an allowed one, and each allowed folder inside
    a manifest one (a manifest that says "/" gets no more than it was allowed). A manifest folder outside
    everything allowed is dropped and named in the log."""
    allowed = [Path(os.path.realpath(r)) for r in operator_roots] or recorded(index_dir)
    manifest_roots = [Path(os.path.realpath(r)) for r in manifest_roots]
    kept = {r for r in manifest_roots if _inside(r, allowed)} | {a for a in allowed if _inside(a, manifest_roots)}
    dropped = [str(r) for r in manifest_roots if not _inside(r, allowed) and not any(_inside(a, [r]) for a in allowed)]
    kept = tuple(sorted(kept))
    if dropped:
        how = "the --images-root folders" if operator_roots else "the folders `ltd index` recorded for it"
        log.warning("%s: image folder(s) %s are not inside %s: no image file is served from them (serve with "
                    "--images-root DIR to allow a folder)", Path(index_dir).name, ", ".join(dropped), how)
    return kept
