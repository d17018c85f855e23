"""The self-retrieval reward: a generated caption as a text→image query against the images of the
batch, scored by a frozen retrieval dual encoder (a project checkpoint, the "judge").

r_ret(c_i) = −L_ret(c_i), with L_ret one of (s = the judge's similarity, i = the caption's image):
- ``vse_max``: VSE++ max of hinges, max_{j≠i} [m − s(I_i, c) + s(I_j, c)]₊ (the paper's choice);
- ``vse_sum``: VSE0 sum of hinges, Σ_{j≠i} [m − s(I_i, c) + s(I_j, c)]₊;
- ``softmax``: InfoNCE, −log softmax_j(s(I_j, c) / τ)_i.

The judge never trains: its image embeddings are computed once for every dataset image from the
feature cache it was trained on, and generated captions go straight from captioner ids to the
judge's ids through a lookup table (no strings) when its caption encoder is the GRU.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from training import choices
from training.checkpoint import load_checkpoint, model_from_checkpoint
from training.device import to_device
from training.errors import UserValueError
from training.losses import similarity_fn
from training.models.dual_encoder import DualEncoder
from training.models.text_encoder import GRUTextEncoder
from training.prepare import image_features

log = logging.getLogger(__name__)

LOSSES = choices.names(choices.RetrievalLoss)


def retrieval_loss(sims: torch.Tensor, own: torch.Tensor, kind: str = "vse_max", *, margin: float = 0.2,
                   tau: float = 0.1, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(Q,) loss of each caption query. ``sims`` (Q, N): caption q against every candidate image;
    ``own`` (Q,): the index of the caption's image among the N; ``valid`` (Q, N) bool: candidates a
    query may see (default all)."""
    q, n = sims.shape
    rows = torch.arange(q, device=sims.device)
    pos = sims[rows, own]
    is_own = torch.zeros_like(sims, dtype=torch.bool)
    is_own[rows, own] = True
    neg_ok = ~is_own if valid is None else (~is_own & valid)
    if kind == "softmax":
        logits = (sims / tau).masked_fill(~(neg_ok | is_own), float("-inf"))
        return -torch.log_softmax(logits, 1)[rows, own]
    hinge = (margin - pos[:, None] + sims).clamp_min(0).masked_fill(~neg_ok, 0.0)
    if kind == "vse_max":
        return hinge.max(1).values
    if kind == "vse_sum":
        return hinge.sum(1)
    raise ValueError(f"unknown retrieval loss {kind!r}; choose one of: {', '.join(LOSSES)}")


class Judge:
    """A frozen dual encoder with the embeddings of every dataset image (rows = dataset image order)."""

    def __init__(self, model: DualEncoder, image_embeddings: torch.Tensor, caption_words: list[str],
                 source: str = ""):
        self.model = model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.images = image_embeddings.float()
        self.source = source
        self.caption_words = caption_words
        text = model.text
        self.fast = isinstance(text, GRUTextEncoder)
        if self.fast:
            jv = text.vocab
            self.lookup = torch.tensor([jv.index.get(w, jv.unk_id) for w in caption_words], dtype=torch.long)
            self.max_len = text.max_len

    @torch.no_grad()
    def embed_ids(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, L) captioner word ids with their lengths (words before <eos>) → (B, E) caption embeddings."""
        if self.fast:
            tok = self.lookup[ids.clamp_min(0).cpu()]
            ln = lengths.cpu().clamp(1, min(self.max_len, ids.shape[1]))
            tok = tok[:, : int(ln.max())]
            tok = tok.masked_fill(torch.arange(tok.shape[1])[None] >= ln[:, None], self.model.text.vocab.pad_id)
            batch = {"tokens": tok, "lengths": ln}
        else:
            texts = [" ".join(self.caption_words[i] for i in row[: int(n)]) for row, n in zip(ids.tolist(), lengths.tolist())]
            batch = self.model.text.prepare(texts)
        return self.model.encode_text(to_device(batch, self.model.device)).float().cpu()

    @torch.no_grad()
    def similarities(self, caption_emb: torch.Tensor, image_rows: torch.Tensor) -> torch.Tensor:
        """(Q, N) similarity of each caption to the images ``image_rows`` (dataset image indices)."""
        img = self.images[image_rows]
        if self.model.similarity == "cosine":
            return caption_emb @ img.T
        return similarity_fn(self.model.similarity)(img, caption_emb).T


def load_judge(checkpoint: str | Path, dataset, caption_words: list[str], *, cache_dir: str = "") -> Judge:
    """Rebuild a retrieval checkpoint (loaded with weights_only=True, on the process's device) and embed
    every image of ``dataset`` with it, from the feature cache of the backbone settings it was trained with."""
    ckpt = load_checkpoint(checkpoint)
    model, _, jcfg = model_from_checkpoint(ckpt)
    jcfg.data.cache_dir = cache_dir or jcfg.data.cache_dir
    if jcfg.data.shortcuts != "none":
        raise UserValueError(f"{checkpoint}: a judge trained with synthetic shortcuts ({jcfg.data.shortcuts}) "
                         "scores the shortcut, not the caption; use one trained with data.shortcuts=none")
    backbone = getattr(model.image, "backbone", None)
    store, _ = image_features(jcfg, dataset, backbone)
    feats = store.mean_view()
    with torch.no_grad():
        emb = torch.cat([model.encode_image_features(feats[i : i + 2048].to(model.device)).float().cpu()
                         for i in range(0, len(feats), 2048)])
    if store.failed:
        log.warning("judge: %d images had no readable file; their embeddings are meaningless", len(store.failed))
    return Judge(model, emb, caption_words, source=str(checkpoint))


def unlabelled_ranks(judge: Judge, caption_emb: torch.Tensor, pool_rows: np.ndarray, top: int,
                     chunk: int = 2048) -> np.ndarray:
    """(Q, top) pool positions of the ``top`` images most similar to each caption (best first)."""
    top = min(top, len(pool_rows))
    out = []
    rows = torch.as_tensor(pool_rows)
    for i in range(0, len(caption_emb), chunk):
        s = judge.similarities(caption_emb[i : i + chunk], rows)
        out.append(s.topk(top, dim=1).indices.numpy())
    return np.concatenate(out) if out else np.zeros((0, top), dtype=np.int64)
