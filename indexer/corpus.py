"""A user's own corpus: a folder of images (subfolders included) and/or a text file of captions.

Light on purpose (no torch, no FAISS), so that `ltd index` can check its inputs in a fraction of a
second, before any model loads. Accepted images: by extension (below), then by decoding; files that
do not decode are skipped and listed in the manifest. Captions: one per non-empty line, UTF-8.
"""
from __future__ import annotations

from pathlib import Path

from training.errors import UserFileNotFound, UserValueError

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}


def check_corpus_inputs(images_dir: str | Path | None, captions_file: str | Path | None, *,
                        images_flag: str = "--images-dir") -> None:
    """Fail before any model loads: the folder and the captions file must exist and hold something
    (``images_flag``: how the command names the folder, for the message)."""
    if not images_dir and not captions_file:
        raise UserValueError("a corpus index needs --images-dir and/or --captions-file")
    if images_dir:
        folder = Path(images_dir)
        if not folder.is_dir():
            raise UserFileNotFound(f"{images_flag}: folder not found: {folder}")
        if not any(p.is_file() and p.suffix.lower() in IMAGE_EXTS for p in folder.rglob("*")):
            raise UserValueError(f"{images_flag}: no image files ({', '.join(sorted(IMAGE_EXTS))}) under {folder}")
    if captions_file:
        path = Path(captions_file)
        if not path.is_file():
            raise UserFileNotFound(f"--captions-file: file not found: {path}")


def image_files(folder: Path) -> list[Path]:
    """The images under ``folder`` (subfolders included), by extension, in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTS)


def read_captions_file(path: Path) -> list[str]:
    """One caption per non-empty line (UTF-8; undecodable bytes replaced)."""
    return [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
