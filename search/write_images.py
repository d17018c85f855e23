"""What the write path does with an add's images, in the write embedder process (search/embed_process.py)
or on the server's write thread (``--write-in-process``): embed decoded images, store an upload under the
item store, and read a server-side folder's files under the uploads' budgets."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from indexer.file_meta import file_metadata
from indexer.ingest import IMAGE_SUFFIX, sha256_bytes
from indexer.items import store_upload
from search.errors import BadRequest, SearchError
from search.files import open_regular, sniff_image_type

log = logging.getLogger("ltd.writes")

WHY = 300  # characters: the most of why a folder's file was skipped that is kept (and sent, and answered)


def embed_images(model, images: list) -> np.ndarray:
    """(n, E) float32 embeddings of decoded images through ``model``'s image tower (the child's, and the
    write thread's with ``write_in_process``)."""
    if not images:
        return np.zeros((0, model.image.embed_dim), np.float32)
    with torch.inference_mode():
        x = model.image.prepare(images).to(model.device)
        return np.ascontiguousarray(model.image(x).float().cpu().numpy(), np.float32)


def save_upload(folder: Path, data: bytes) -> dict:
    """One upload stored under an item store's files folder (indexer/items.py ``store_upload``): its
    record, ``{"sha256", "path", "metadata"}`` (what a folder index knows of the file: file_metadata)."""
    digest = sha256_bytes(data)
    path = store_upload(folder, digest, IMAGE_SUFFIX.get(sniff_image_type(data) or "", ".img"), data)
    return {"sha256": digest, "path": str(path), "metadata": file_metadata(path)}


def read_image_files(decoder, paths: list[Path], min_side: int, root: Path, max_bytes: int) -> tuple[list, list[dict], dict[int, str]]:
    """A folder's files, each read (at most ``max_bytes``, only if the file opened lies under ``root``)
    and decoded as an upload would be, or skipped with why: (decoded images, their records ``{"sha256",
    "path", "metadata"}`` with the opened file's real path, {position: why skipped})."""
    images, records, skipped = [], [], {}
    for k, path in enumerate(map(Path, paths)):
        try:
            f, real = open_regular(path, path.name)  # a FIFO or a link out of the root swapped in since: refused
            with f:
                if not real.is_relative_to(root):
                    raise BadRequest("the file leads out of the ingest root")
                data = f.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise BadRequest(f"larger than the upload limit ({max_bytes:,} bytes)")
            images.append(decoder.decode(data, min_side))
            records.append({"sha256": sha256_bytes(data), "path": str(real), "metadata": file_metadata(path, root)})
        except Exception as e:  # noqa: BLE001 - an unreadable file is skipped, as `ltd index` skips it
            skipped[k] = (e.detail if isinstance(e, SearchError) else f"{type(e).__name__}: {e}")[:WHY]
            log.warning("skipped %s: %s", path.name, skipped[k])
    return images, records, skipped
