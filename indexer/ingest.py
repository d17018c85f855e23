"""New items for a living index: files or uploaded bytes → embedded ``NewImage`` rows for the item store.

Used by the server's write routes and by ``ltd items add`` (and ``ltd index --append`` on a living
index): one code path, so what a server adds and what the CLI adds are the same rows. Uploaded bytes
arrive already checked (image type, pixel budget: search/media.py); they are stored under the index's
``items/`` folder by content before they are embedded from there. A folder's files are embedded where
they are. Each image gets the metadata a folder index knows (``file_metadata``) under whatever the
caller gives (the caller's fields win).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from indexer.build import load_model
from indexer.corpus import image_files, read_captions_file
from indexer.embed import embed_captions, embed_image_files
from indexer.file_meta import file_metadata
from indexer.index import IndexDirError, load_index_dir
from indexer.items import ItemStore, NewImage
from training.fsio import sha256_file
from training.models.dual_encoder import DualEncoder

log = logging.getLogger(__name__)

IMAGE_SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "GIF": ".gif", "BMP": ".bmp", "TIFF": ".tif"}  # stored uploads


@dataclass
class ItemInput:
    """One image to add: a file already on disk (``path``) or uploaded bytes (``data``, with the image
    format the upload check found), its captions and the caller's metadata."""

    path: Path | None = None
    data: bytes | None = None
    image_format: str | None = None
    filename: str | None = None
    captions: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)


def sha256_bytes(data: bytes) -> str:
    """The hex sha256 of uploaded bytes (an item's content id, the same as ``sha256_file`` of its file)."""
    return hashlib.sha256(data).hexdigest()


def prepare(model: DualEncoder, store: ItemStore, inputs: list[ItemInput], *, root: Path | None = None,
            workers: int | None = 0) -> tuple[list[NewImage], dict[int, str]]:
    """Embed ``inputs`` (and their captions) into store rows: (rows for the readable ones, in order;
    {input position: why it was skipped}). Uploads are written under ``items/`` first."""
    paths, digests = [], []
    for item in inputs:
        if item.data is not None:
            digest = sha256_bytes(item.data)
            path = store.store_file(digest, IMAGE_SUFFIX.get(item.image_format or "", ".img"), item.data)
        else:
            path = Path(item.path).resolve()
            digest = sha256_file(path)
        paths.append(path)
        digests.append(digest)
    vectors, failed = embed_image_files(model, paths, workers=workers)
    ok = [k for k in range(len(inputs)) if k not in failed]
    texts = [t for k in ok for t in inputs[k].captions]
    cap_vecs = embed_captions(model, texts) if texts else None
    rows, c = [], 0
    for j, k in enumerate(ok):
        item, path = inputs[k], paths[k]
        caps = []
        for text in item.captions:
            caps.append((text, text, cap_vecs[c]))
            c += 1
        known = file_metadata(path, root if item.data is None else None)
        rows.append(NewImage(vector=vectors[j], sha256=digests[k], path=str(path),
                             filename=item.filename or path.name, metadata={**known, **item.metadata}, captions=caps))
    return rows, failed


def append_living(index_dir: str | Path, checkpoint: str | Path, *, images_dir: str | Path | None = None,
                  captions_file: str | Path | None = None) -> dict:
    """``ltd index --append`` on a living index: the folder's new images (and a file's captions, as
    captions of no image) go into its item store, as ``ltd items add`` would add them; what is already
    there (by content, or the same caption text) is skipped."""
    ix = load_index_dir(index_dir, verify="counts")
    lm = load_model(checkpoint)
    if lm.sha256 != ix.manifest.get("checkpoint_sha256"):
        raise IndexDirError(f"{checkpoint} is not the checkpoint that built {index_dir}")
    store = ItemStore.open(ix)
    try:
        root = Path(images_dir).resolve() if images_dir else None
        files = [p for p in image_files(root) if p.resolve().is_relative_to(root)] if root else []
        rows, failed = prepare(lm.model, store, [ItemInput(path=p) for p in files], root=root, workers=None)
        seq, ids = store.add(rows) if rows else (store.last_seq(), [])
        texts = read_captions_file(Path(captions_file)) if captions_file else []
        known = store.caption_texts()
        texts = [t for t in dict.fromkeys(texts) if t not in known]
        if texts:
            seq = store.add_captions(list(zip(texts, texts, embed_captions(lm.model, texts))))
        return {"index": str(ix.path), "added_images": sum(a for _, a in ids), "already_there": sum(not a for _, a in ids),
                "added_captions": len(texts), "skipped": len(failed), "write": seq}
    finally:
        store.close()
