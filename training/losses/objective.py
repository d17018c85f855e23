"""The training objective: built once from the loss config, it is the only reader of that config.

    loss = combine(L_con, L_rec)    none | dual | constraint | replay    (:mod:`.constraint`)
    L_con  contrastive loss on the batch's embeddings                      (:mod:`.factory`)
    L_rec  LTD: 1 − cos(decoder(caption emb), sentence-model target)      (:mod:`.reconstruction`)
           ITD: token NLL of the caption under the decoder, mean or sum

``sh_mh`` is a curriculum: sum of hinges until the validation rsum has not improved for
``curriculum_patience`` epochs, then max of hinges (VSE++: hardest negatives only once the
embedding is roughly in place; from the start they collapse it).

The rest of training asks the objective what it needs instead of reading ``cfg.loss``:
:func:`objective_needs` tells the data pipeline whether LTD targets are needed and from which
sentence model, and the model builder which decoder to attach and which similarity retrieval ranks
by. A loop uses it like this::

    objective = TrainingObjective(cfg.loss, total_steps=n, vocab=vocab, max_caption_len=40)
    out = objective(img, txt, image_ids=ids, decoder=model.decoder, captions=texts, targets=t)
    out["loss"].backward(); optimizer.step()
    objective.step_done(out)              # λ's ascent step (constraint) / the replayed λ's index
    ...
    objective.end_epoch(improved)         # the curriculum counts epochs without val gain
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch.nn as nn
from torch import Tensor

from training import distributed
from training.config import LossConfig
from training.data.global_batches import Shard
from training.data.vocab import Vocab
from training.errors import UserValueError
from training.models.decoders import InputTokenDecoder

from .constraint import LambdaSettings, LossCombiner
from .factory import build_contrastive_loss, similarity_for
from .lambda_trace import read_lambda_trace, write_lambda_trace
from .reconstruction import ITDReconstructionLoss, LTDReconstructionLoss

log = logging.getLogger(__name__)


def build_combiner(loss_cfg: LossConfig, total_steps: int) -> LossCombiner:
    """The :class:`LossCombiner` for a ``LossConfig``; ``replay`` reads and checks its schedule."""
    schedule = None
    if loss_cfg.mode == "replay":
        schedule, src_eta = read_lambda_trace(loss_cfg.lambda_schedule)
        if not np.isclose(src_eta, loss_cfg.eta, rtol=0, atol=1e-12):
            raise UserValueError(f"the λ schedule was logged with η={src_eta}, this run has loss.eta={loss_cfg.eta}: "
                             "the replayed weights λ_t/η would differ; set loss.eta to the source run's")
        if len(schedule) < total_steps:
            raise UserValueError(f"the λ schedule {loss_cfg.lambda_schedule} has {len(schedule)} steps, this run needs "
                             f"{total_steps}: the source run must have the same batches and epochs")
        log.info("replaying λ from %s (%d steps, λ %.3g → %.3g, max %.3g)", loss_cfg.lambda_schedule,
                 len(schedule), schedule[0], schedule[total_steps - 1], schedule[:total_steps].max())
    lam = LambdaSettings(lambda_init=loss_cfg.lambda_init, lambda_lr=loss_cfg.lambda_lr,
                         lambda_momentum=loss_cfg.lambda_momentum, lambda_dampening=loss_cfg.lambda_dampening,
                         lambda_max=loss_cfg.lambda_max)
    return LossCombiner(loss_cfg.mode, beta=loss_cfg.beta, eta=loss_cfg.eta, lam=lam, schedule=schedule)


def first_contrastive(loss: LossConfig) -> str:
    """The contrastive loss of the first epoch (``sh_mh`` starts with sum of hinges)."""
    return "sh" if loss.contrastive == "sh_mh" else loss.contrastive


@dataclass(frozen=True)
class ObjectiveNeeds:
    """What the data pipeline and the model must provide for a loss config."""

    decoder: str | None  # "ltd" | "itd": the decoder the model attaches; None: no reconstruction
    target_model: str | None  # LTD targets from this sentence model ("" = the packaged MiniLM); None: none
    similarity: str  # "cosine" | "order": what the trained embeddings are ranked by
    ltd_targets: str = "caption"  # LTD's controls: "shuffled" / "same_image" targets (loss.ltd_targets)

    @property
    def tokens(self) -> bool:
        """ITD reconstructs the caption's tokens (the vocabulary's ids)."""
        return self.decoder == "itd"


def describe_loss(loss: LossConfig) -> dict:
    """The loss as a model's manifest and reports show it: contrastive loss, mode, and the decoder,
    η or β only where the mode uses them, and LTD's target model (what its targets saw matters)."""
    ltd = loss.mode != "none" and loss.decoder == "ltd"
    return {"contrastive": loss.contrastive, "mode": loss.mode,
            "decoder": loss.decoder if loss.mode != "none" else None,
            "eta": loss.eta if loss.mode in ("constraint", "replay") else None,
            "beta": loss.beta if loss.mode == "dual" else None,
            "targets": (loss.target_model or "all-MiniLM-L6-v2") if ltd else None}


def objective_needs(loss: LossConfig) -> ObjectiveNeeds:
    """Answer, from the loss config alone, what training must provide (cheap: reads no file)."""
    decoder = None if loss.mode == "none" else loss.decoder
    return ObjectiveNeeds(decoder=decoder, target_model=loss.target_model if decoder == "ltd" else None,
                          similarity=similarity_for(first_contrastive(loss)),
                          ltd_targets=loss.ltd_targets if decoder == "ltd" else "caption")


class TrainingObjective(nn.Module):
    """Contrastive term + reconstruction term, combined (with λ's ascent) and scheduled (curriculum).

    ``forward`` returns named terms: ``loss`` (to minimise), detached ``l_con``, ``l_rec`` (with a
    decoder), ``lambda`` and ``gap`` (constraint, replay), the reconstruction's diagnostics
    (``rec_cos_sim`` for LTD; ``rec_perplexity``, ``rec_n_tokens`` for ITD) and the contrastive
    loss's scalar ones (``con_<name>``, e.g. ``con_tau``, ``con_l_i2t``). Its state
    (:meth:`checkpoint_state`) is what a checkpoint needs to continue it exactly: λ with its
    optimizer and trace, and the curriculum's stage.
    """

    def __init__(self, loss: LossConfig, *, total_steps: int, vocab: Vocab | None = None,
                 max_caption_len: int = 40, logit_scale: nn.Parameter | None = None) -> None:
        super().__init__()
        self.cfg, self.needs = loss, objective_needs(loss)
        self.logit_scale = logit_scale  # the model's pretrained temperature (CLIP), used instead of loss.tau
        self.contrastive_name = first_contrastive(loss)
        self.contrastive = self._contrastive(self.contrastive_name)
        self.stale_epochs = 0  # epochs since validation last improved (the curriculum's clock)
        self.reconstruction: nn.Module | None = None
        if self.needs.decoder == "ltd":
            self.reconstruction = LTDReconstructionLoss()
        elif self.needs.decoder == "itd":
            if vocab is None:
                raise ValueError("ITD reconstructs caption tokens: the objective needs the vocabulary")
            self.reconstruction = ITDReconstructionLoss(pad_id=vocab.pad_id, reduction=loss.itd_reduction)
        self.vocab, self.max_caption_len = vocab, max_caption_len
        self.combiner = build_combiner(loss, total_steps)  # replay: reads and checks the logged λ schedule

    def _contrastive(self, name: str) -> nn.Module:
        loss = build_contrastive_loss(name, tau=self.cfg.tau, margin=self.cfg.margin, epsilon=self.cfg.ifm_epsilon)
        if self.logit_scale is not None and hasattr(loss, "temperature"):
            loss.temperature.share(self.logit_scale)
        return loss

    # -- one step ----------------------------------------------------------------------------
    def forward(self, img: Tensor, txt: Tensor, *, image_ids: Tensor | None = None,
                decoder: nn.Module | None = None, captions: list[str] | None = None,
                targets: Tensor | None = None, shard: Shard | None = None) -> dict[str, Tensor]:
        """Terms of one batch: ``img``/``txt`` (B, E) embeddings (any dtype; the losses run in
        float32), ``decoder`` the model's reconstruction decoder, ``captions`` the batch's texts
        (ITD) and ``targets`` (B, T) the LTD targets of those captions.

        ``shard``: under data parallelism, where these rows sit in the global batch. The contrastive
        loss is then the global batch's (every rank's embeddings gathered, gradients to this rank's
        rows, scaled ×W against DDP's averaging); the reconstruction is this rank's, and its value the
        all-reduced global mean (:mod:`training.distributed`) — so every returned value, λ's update
        included, is the same on every rank and equal to one process's on the whole batch."""
        shard = shard or Shard.of(img.shape[0])
        g_ids = None if image_ids is None else distributed.gather_rows(image_ids, shard)
        con = self.contrastive(distributed.gather_rows(img.float(), shard), distributed.gather_rows(txt.float(), shard),
                               image_ids=g_ids)
        con["loss"] = distributed.scale_gradient(con["loss"], shard.world)
        rec = None if self.reconstruction is None else self._reconstruct(txt, decoder, captions, targets, img)
        if rec is not None and shard.world > 1:
            # a mean over tokens (ITD's default) weighs each rank by its tokens, a mean over captions by its rows
            share = distributed.share_of(rec["n_tokens"]) if self.needs.tokens and self.cfg.itd_reduction == "mean" \
                else None
            rec = {"loss": distributed.mean_over_ranks(rec["loss"], shard, share),
                   **distributed.mean_of_scalars({k: v for k, v in rec.items() if k != "loss"}, shard)}
        out = self.combiner(con["loss"], None if rec is None else rec["loss"])
        for prefix, terms in (("con", con), ("rec", rec or {})):  # the losses' own scalar diagnostics
            out.update({f"{prefix}_{k}": v for k, v in terms.items() if k != "loss" and v.dim() == 0})
        return out

    def _reconstruct(self, txt: Tensor, decoder: nn.Module | None, captions: list[str] | None,
                     targets: Tensor | None, img: Tensor | None = None) -> dict[str, Tensor]:
        if decoder is None:
            raise ValueError(f"loss.decoder={self.needs.decoder}: the model has no decoder to reconstruct with")
        if self.needs.decoder == "ltd":
            if targets is None:
                raise ValueError("LTD needs the captions' targets")
            targets = targets.to(txt.device)
            side = self.cfg.ltd_side
            if side == "text":
                return self.reconstruction(decoder(txt).float(), targets)
            # image / both: the same decoder reads the caption's target from its image's embedding (a
            # control: does holding caption content on the image side restore what shortcuts break?)
            rec_img = self.reconstruction(decoder(img).float(), targets)
            if side == "image":
                return rec_img
            rec_txt = self.reconstruction(decoder(txt).float(), targets)
            return {k: (rec_img[k] + rec_txt[k]) / 2 for k in rec_txt}
        if captions is None:
            raise ValueError("ITD needs the captions")
        ids = [self.vocab.encode_text(t)[: self.max_caption_len] for t in captions]
        inp, tgt = InputTokenDecoder.teacher_forcing(ids, self.vocab.bos_id, self.vocab.eos_id, self.max_caption_len)
        logits = decoder(txt, {"itd_in": inp.to(txt.device)})
        return self.reconstruction(logits.float(), tgt.to(txt.device))

    def step_done(self, out: dict[str, Tensor]) -> None:
        """After the model's optimizer step: λ's ascent step and projection (constraint), the
        record of the λ applied (constraint, replay); nothing otherwise."""
        if "l_rec" in out:
            self.combiner.update(out["l_rec"])
        if self.logit_scale is not None and hasattr(self.contrastive, "temperature"):
            self.contrastive.temperature.project_()  # keep 1/τ ≤ 100, as CLIP's training does

    # -- epochs -------------------------------------------------------------------------------
    def end_epoch(self, improved: bool) -> bool:
        """Count the epochs without validation gain; ``sh_mh`` switches to max of hinges once they
        reach ``curriculum_patience``. Returns whether it switched."""
        self.stale_epochs = 0 if improved else self.stale_epochs + 1
        c = self.cfg
        if not (c.contrastive == "sh_mh" and self.contrastive_name == "sh" and c.curriculum_patience > 0
                and self.stale_epochs >= c.curriculum_patience):
            return False
        self.contrastive_name, self.stale_epochs = "mh", 0
        self.contrastive = self._contrastive("mh")
        log.info("curriculum: val stopped improving, switching sum-of-hinges → max-of-hinges")
        return True

    # -- logging and checkpoints --------------------------------------------------------------------
    @property
    def lambda_trace(self) -> np.ndarray:
        """float32 (steps,): the λ applied at every step so far (empty without constraint/replay)."""
        return self.combiner.lambda_trace

    def save_trace(self, run_dir: str | Path) -> None:
        """``lambda_trace.npz`` next to the checkpoint (a replay run's source); only constraint/replay."""
        if self.cfg.mode in ("constraint", "replay"):
            write_lambda_trace(run_dir, self.combiner.lambda_trace, self.cfg.eta)

    def checkpoint_state(self) -> dict:
        """The checkpoint's ``constraint``, ``contrastive`` and ``stale_epochs`` entries."""
        return {"constraint": self.combiner.state_dict(), "stale_epochs": self.stale_epochs,
                "contrastive": self.contrastive_name}

    def load_checkpoint_state(self, ckpt: dict) -> None:
        self.combiner.load_state_dict(ckpt["constraint"])
        self.stale_epochs = ckpt.get("stale_epochs", 0)
        name = ckpt.get("contrastive", self.contrastive_name)
        if name != self.contrastive_name:
            self.contrastive_name, self.contrastive = name, self._contrastive(name)

    def extra_repr(self) -> str:
        return f"contrastive={self.contrastive_name!r}, mode={self.cfg.mode!r}, decoder={self.needs.decoder!r}"
