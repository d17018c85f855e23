"""The training loop. Read it top to bottom: set-up, resume, epochs of steps, validation, checkpoints.

What is minimised is the training objective's business (``training/losses/objective.py``: the
contrastive term, LTD/ITD reconstruction, their combination with λ, the sh → mh curriculum); the
checkpoint's contents are ``training/checkpoint.py``'s. This file only orders the work.

Determinism: the caption order of epoch e is a permutation seeded by (seed, e), and every random
choice inside step s (cached view, token dropout, augmentation) uses a generator seeded by
(seed, e, s). A resumed run therefore replays exactly the steps an uninterrupted run would take.

Data parallel (``ltd train --nproc N``, torchrun; :mod:`training.distributed`): every process runs
this loop on its part of each global batch (``train.batch_size`` stays the global batch); the view
and token-dropout draws are made for the global batch and sliced, so a process's rows get the draws
one process would give them. Rank 0 alone validates and writes (checkpoints, metrics.jsonl,
progress); the others follow its validation result.
"""
from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel

from training import distributed
from training.checkpoint import (
    Optimizers,
    TrainingProgress,
    init_from_checkpoint,
    load_checkpoint,
    restore_training,
    save_checkpoint,
    training_checkpoint,
)
from training.config import Config, dump_config
from training.data.global_batches import epoch_batches
from training.data.image_batches import AugmentedImageBatches, EpochPosition
from training.device import default_device, pick_device, to_device, using_device
from training.errors import UserFileExists, UserValueError
from training.losses.objective import TrainingObjective
from training.metrics_log import MetricsLog
from training.models.backbones import cpu_bf16_fast
from training.models.dual_encoder import DualEncoder, ModelDims, PretrainedParts, StepEncoders, build_model
from training.models.text_encoder import take_rows
from training.prepare import TrainingData, prepare
from training.progress import progress, set_progress

log = logging.getLogger(__name__)

Validator = Callable[[DualEncoder], dict]


@dataclass
class RunResult:
    run_dir: Path
    best_rsum: float
    best_epoch: int
    epochs: int
    seconds: float


def train(cfg: Config, run_dir: str | Path, *, validate: Validator | None = None, resume: bool = False,
          data: TrainingData | None = None) -> RunResult:
    """Train ``cfg`` into ``run_dir``: checkpoint.pt (resumable), best.pt (best val rsum), metrics.jsonl,
    config.yaml and, with a λ, lambda_trace.npz. ``validate(model) -> {"rsum": …}`` scores a model on
    the val split (None: every epoch counts as the best); ``data`` is :func:`prepare`'s result when
    the caller has it already; ``resume`` continues the run that ``run_dir`` holds. It runs on
    ``train.device``: the process's device while it runs (``training.device``)."""
    with using_device(pick_device(cfg.train.device)):
        return _train(cfg, Path(run_dir), validate, resume, data)


def _train(cfg: Config, run_dir: Path, validate: Validator | None, resume: bool,
           data: TrainingData | None) -> RunResult:
    t_start, tc, rank = time.time(), cfg.train, distributed.current()
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    if not rank.main:  # one voice: the main process shows the progress
        set_progress(False)
    ckpt = open_run_dir(run_dir, resume)  # every process reads the checkpoint (the run folder is shared)

    # ---- data, model, objective, optimiser -------------------------------------------------------
    random.seed(tc.seed), np.random.seed(tc.seed), torch.manual_seed(tc.seed)
    data = data or prepare(cfg)
    r = set_up(cfg, data, run_dir)

    # ---- resume ----------------------------------------------------------------------------------
    if ckpt is not None:
        r.at = restore_training(ckpt, r.model, r.optimizer, r.scheduler, r.scaler if r.scaler.is_enabled() else None)
        r.objective.load_checkpoint_state(ckpt)
        log.info("resumed %s at epoch %d step %d", run_dir, r.at.epoch, r.at.step)
    distributed.check_same_step(r.at.step)
    r.encoders = distributed.data_parallel(StepEncoders(r.model))
    if rank.main:
        dump_config(cfg, run_dir / "config.yaml")
    r.mlog = MetricsLog(run_dir / "metrics.jsonl" if rank.main else None,
                        resume_step=r.at.step if ckpt is not None else None)
    if ckpt is None and validate is not None:
        r0 = run_validation(r, validate, r.model, epoch=0)
        log.info("epoch 0 (untrained) val rsum %.1f", r0.get("rsum", float("nan")))

    # ---- epochs ----------------------------------------------------------------------------------
    r.model.train()
    for epoch in range(r.at.epoch, tc.epochs):
        unfreeze_backbone_if_due(r, epoch)
        batches = epoch_batches(tc.seed, epoch, len(data.train_texts), tc.batch_size, rank.world)
        swa_model = AveragedModel(r.model, use_buffers=True) if tc.swa else None
        t_epoch = time.time()
        sums, n_steps = run_epoch(r, epoch, batches, swa_model)
        secs = time.time() - t_epoch
        r.mlog.write(type="epoch", epoch=epoch + 1, step=r.at.step, seconds=secs,
                     **{f"mean_{k}": v / max(1, n_steps) for k, v in sums.items() if v})

        # ---- validation, best checkpoint, curriculum, checkpoint ---------------------------------
        weights = swa_model.module if swa_model is not None else r.model
        rsum = float(run_validation(r, validate, weights, epoch=epoch + 1).get("rsum", -1.0))
        rsum = distributed.broadcast_float(rsum)  # rank 0 validated: every process acts on its result
        improved = validate is None or rsum > r.at.best["rsum"]
        r.at.epoch, r.at.step_in_epoch = epoch + 1, 0
        r.objective.end_epoch(improved)  # the sh → mh curriculum counts the epochs without val gain
        if improved:
            r.at.best = {"rsum": rsum, "epoch": epoch + 1}
            if rank.main:
                save_checkpoint(run_dir / "best.pt", checkpoint_payload(r, weights, resumable=False))
        save_run_checkpoint(r)
        log.info("epoch %d/%d: %.1fs, loss %.4f, val rsum %.1f%s", epoch + 1, tc.epochs, secs,
                 sums["loss"] / max(1, n_steps), rsum, " (best)" if improved else "")
    return RunResult(run_dir=run_dir, best_rsum=r.at.best["rsum"], best_epoch=r.at.best["epoch"],
                     epochs=tc.epochs, seconds=time.time() - t_start)


# ---- set-up --------------------------------------------------------------------------------------
@dataclass
class Run:
    """What a run holds between its steps: the set-up, and where it stands (``at``)."""

    cfg: Config
    data: TrainingData
    run_dir: Path
    device: torch.device
    model: DualEncoder
    objective: TrainingObjective
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype | None  # the training step's autocast type (:func:`autocast_dtype`); None: float32
    backbone_params: list[torch.nn.Parameter]
    train_img: np.ndarray  # dataset image index of each training caption
    at: TrainingProgress = field(default_factory=TrainingProgress)
    mlog: MetricsLog | None = None
    rank: distributed.Rank = field(default_factory=distributed.Rank)  # this process's place (rank 0 of 1 alone)
    encoders: torch.nn.Module | None = None  # the step's forward (:class:`StepEncoders`), under DDP in a group

    def __post_init__(self) -> None:
        if self.encoders is None:  # a Run built by hand (benches, tests) steps without a process group
            self.encoders = StepEncoders(self.model)


def open_run_dir(run_dir: Path, resume: bool, load: Callable[[Path], dict] = load_checkpoint) -> dict | None:
    """The checkpoint to resume from (None: a new run), read with ``load`` (the captioner passes its own
    loader); refuses to overwrite a run without ``resume``."""
    ckpt_path = run_dir / "checkpoint.pt"
    if ckpt_path.exists() and not resume:
        raise UserFileExists(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    ckpt = load(ckpt_path) if resume and ckpt_path.exists() else None
    if resume and ckpt is None:
        log.warning("--resume: no checkpoint in %s, starting a new run", run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return ckpt


def set_up(cfg: Config, data: TrainingData, run_dir: Path) -> Run:
    """Model (seeded, on the process's device), its data-fitted parts, the objective, optimiser, LR
    schedule and AMP scaler."""
    tc, oc, device = cfg.train, cfg.optim, torch.device(default_device())
    target_dim = int(data.targets.shape[1]) if data.targets is not None else 0
    torch.manual_seed(tc.seed)
    model = build_model(cfg, data.vocab, dims=ModelDims(data.feat_dim, data.region_dim, target_dim),
                        parts=PretrainedParts(data.word_embeddings, data.backbone, data.clip)).to(device)
    train_img = data.train_image_index
    fit_to_training_data(model, data, train_img, cfg)
    if tc.init_from:  # after fitting: a pretrained model keeps its own statistics (FNE standardisation)
        init_from_checkpoint(model, tc.init_from)
    optimizer, backbone_params = build_optimizer(model, cfg)
    rank = distributed.current()
    steps_per_epoch = len(epoch_batches(tc.seed, 0, len(data.train_texts), tc.batch_size, rank.world))
    if not steps_per_epoch:
        raise UserValueError(f"train split has {len(data.train_texts)} captions: fewer than 2, nothing to train on")
    total_steps = steps_per_epoch * tc.epochs
    objective = TrainingObjective(cfg.loss, total_steps=total_steps, vocab=data.vocab,
                                  max_caption_len=cfg.data.max_caption_len, logit_scale=model.logit_scale)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(oc.warmup_steps, total_steps, oc.schedule, oc.min_lr_ratio))
    dtype = autocast_dtype(device.type, tc)
    if dtype is not None:
        log.info("training under %s autocast on %s", dtype, device.type)
    return Run(cfg=cfg, data=data, run_dir=run_dir, device=device, model=model, objective=objective,
               optimizer=optimizer, scheduler=scheduler,  # loss scaling for fp16 only (bf16 has fp32's range)
               scaler=torch.amp.GradScaler("cuda", enabled=dtype == torch.float16 and device.type == "cuda"),
               autocast_dtype=dtype, backbone_params=backbone_params, train_img=train_img, rank=rank)


def autocast_dtype(device_type: str, tc) -> torch.dtype | None:
    """The one place that decides the training step's autocast type: on CUDA ``train.amp`` with
    ``train.amp_dtype`` (fp16 | bf16); on the CPU bf16 when ``train.cpu_amp`` asks for it (``auto``:
    where the CPU has native bf16); else None (float32)."""
    if device_type == "cuda":
        return ({"fp16": torch.float16, "bf16": torch.bfloat16}[tc.amp_dtype]) if tc.amp else None
    if device_type == "cpu" and (tc.cpu_amp == "bf16" or (tc.cpu_amp == "auto" and cpu_bf16_fast())):
        return torch.bfloat16
    return None


def fit_to_training_data(model: DualEncoder, data: TrainingData, train_img: np.ndarray, cfg: Config) -> None:
    """What the model takes from its training data before the first step (no gradient involved)."""
    if model.image.fne is not None:  # FNE: standardisation statistics of the training images
        model.image.fne.fit(data.image_feats[np.unique(train_img)].mean(1))
    if hasattr(model.text, "embed_corpus"):
        # A frozen sentence encoder: embed every training caption once (disk-cached, like the val and
        # test captions later; shared with the LTD targets when texts, model and truncation agree), so
        # each step runs the projection head only.
        model.text.embed_corpus(data.train_texts)


def build_optimizer(model: DualEncoder, cfg: Config) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    """Adam(W) over the model; the backbone is its own group (lr × backbone_lr_scale), present from the
    start so that its optimiser state survives unfreezing and resume."""
    oc = cfg.optim
    backbone_params = list(model.image.backbone.parameters()) if model.image.backbone is not None else []
    bb_ids = {id(p) for p in backbone_params}
    groups = [{"params": [p for p in model.parameters() if id(p) not in bb_ids], "lr": oc.lr}]
    if backbone_params:
        groups.append({"params": backbone_params, "lr": oc.lr * cfg.model.backbone_lr_scale})
    opt_cls = torch.optim.AdamW if oc.optimizer == "adamw" else torch.optim.Adam
    # fused=True: one kernel for all parameters (3x faster optimiser steps on CPU than the default)
    return opt_cls(groups, lr=oc.lr, weight_decay=oc.weight_decay, fused=True), backbone_params


def lr_lambda(warmup: int, total: int, schedule: str, min_ratio: float) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to ``min_ratio`` (or constant)."""
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    return f


# ---- epochs of steps -----------------------------------------------------------------------------
def unfreeze_backbone_if_due(r: Run, epoch: int) -> None:
    m = r.cfg.model
    due = (not m.freeze_backbone) or (0 <= m.unfreeze_after_epoch <= epoch)
    if due and r.model.image.backbone is not None and r.model.image.frozen:
        log.info("epoch %d: fine-tuning the backbone end to end (lr x %g)", epoch + 1, m.backbone_lr_scale)
        r.model.image.frozen = False
        for p in r.backbone_params:
            p.requires_grad_(True)
        r.encoders = distributed.data_parallel(StepEncoders(r.model))  # DDP's parameter set is fixed


def image_batches(r: Run, epoch: int, batches: list[np.ndarray]) -> Iterator[torch.Tensor] | None:
    """End to end: augmented image batches from the files, from this epoch's next step on (two worker
    processes decode ahead), with the shortcuts drawn when the run has them. None while the backbone
    is frozen (its features are cached)."""
    if r.model.image.frozen:
        return None
    paths, bb = [im.path for im in r.data.dataset.images], r.model.image.backbone
    parts = [r.train_img[b][r.rank.shard(len(b)).rows] for b in batches]  # this process's images only
    at = EpochPosition(r.cfg.train.seed, epoch, r.at.step_in_epoch,
                       stream=(r.rank.world, r.rank.rank) if r.rank.world > 1 else ())
    ds = AugmentedImageBatches(paths, bb.preprocess, parts, at, augment=bb.train_augment,
                               transform=r.data.image_transform)
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=2))


def run_epoch(r: Run, epoch: int, batches: list[np.ndarray],
              swa_model: AveragedModel | None) -> tuple[dict[str, float], int]:
    """The steps of one epoch from ``r.at.step_in_epoch`` on; returns the sums of the loss terms and
    the number of steps taken. Logs every ``log_every`` steps, checkpoints every ``checkpoint_every``."""
    tc = r.cfg.train
    swa_at = set()  # SWA: 5 snapshots from the last 10 % of the epoch
    if swa_model is not None:
        swa_at = set(np.round(np.linspace(0.9 * len(batches), len(batches) - 1, 5)).astype(int).tolist())
    images = image_batches(r, epoch, batches)
    bar = progress(len(batches), initial=r.at.step_in_epoch, desc=f"epoch {epoch + 1}/{tc.epochs}", unit="step",
                   leave=False)
    sums, n_steps = {"loss": 0.0, "l_con": 0.0, "l_rec": 0.0}, 0
    for s in range(r.at.step_in_epoch, len(batches)):
        step_seed = int(np.random.default_rng([tc.seed, epoch, s]).integers(2**62))
        gen = torch.Generator().manual_seed(step_seed)
        torch.manual_seed(distributed.rank_seed(step_seed, r.rank.rank))  # dropout layers draw from the global generator
        out, gnorm = train_step(r, batches[s], gen, images)
        r.at.step, r.at.step_in_epoch = r.at.step + 1, s + 1
        n_steps += 1
        for k in sums:
            if k in out and out[k] is not None:
                sums[k] += float(out[k].detach())
        if swa_model is not None and s in swa_at:
            swa_model.update_parameters(r.model)
        if r.at.step % tc.log_every == 0 or s == len(batches) - 1:
            r.mlog.write(**step_row(epoch, r.at.step, out, r.scheduler.get_last_lr()[0], gnorm,
                                    r.objective.contrastive_name))
        if tc.checkpoint_every and r.at.step % tc.checkpoint_every == 0 and s < len(batches) - 1:
            save_run_checkpoint(r)
        bar.update(1)
        bar.set_postfix(loss=f"{float(out['loss'].detach()):.3f}",
                        **({"lam": f"{float(out['lambda']):.2f}"} if "lambda" in out else {}))
    bar.close()
    return sums, n_steps


def train_step(r: Run, idx: np.ndarray, gen: torch.Generator,
               images: Iterator[torch.Tensor] | None) -> tuple[dict[str, torch.Tensor], float]:
    """One optimiser step on the captions ``idx`` (and their images); returns the objective's terms
    and the gradient norm before clipping. Random choices draw from ``gen``."""
    model, device, data = r.model, r.device, r.data
    n, shard = len(idx), r.rank.shard(len(idx))
    rows = shard.rows  # this process's part of the global batch (all of it alone)
    img_ids = torch.as_tensor(r.train_img[idx])[rows]
    with torch.autocast(device.type, dtype=r.autocast_dtype or torch.bfloat16, enabled=r.autocast_dtype is not None):
        pixels = feats = None
        if images is not None:
            pixels = next(images).to(device, non_blocking=True)
        else:
            f = data.image_feats[img_ids]  # (b, V, D) cached views, on the CPU
            if r.cfg.train.multi_view and f.shape[1] > 1:  # one random view per image, drawn for the global batch
                f = f[torch.arange(len(f)), torch.randint(f.shape[1], (n,), generator=gen)[rows]]
            else:
                f = f.mean(1)
            feats = f.to(device, non_blocking=True)
        texts = [data.train_texts[i] for i in idx]
        tokens = take_rows(model.text.prepare(texts, train=True, generator=gen), rows, n)
        img_emb, txt_emb = r.encoders(pixels, feats, to_device(tokens, device))
        out = r.objective(img_emb, txt_emb, image_ids=img_ids.to(device), decoder=model.decoder,
                          captions=texts[rows], targets=data.targets[idx[rows]] if data.targets is not None else None,
                          shard=shard)
    r.optimizer.zero_grad(set_to_none=True)
    r.scaler.scale(out["loss"]).backward()
    r.scaler.unscale_(r.optimizer)
    params = [p for g in r.optimizer.param_groups for p in g["params"] if p.grad is not None]
    clip = r.cfg.optim.grad_clip
    gnorm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
    r.scaler.step(r.optimizer)
    r.scaler.update()
    r.scheduler.step()
    r.objective.step_done(out)  # after the model's step: λ's own ascent step
    return out, float(gnorm)


def step_row(epoch: int, step: int, out: dict[str, torch.Tensor], lr: float, grad_norm: float,
             contrastive: str) -> dict:
    """A metrics.jsonl line for a step (keys in a fixed order: readers and plots rely on the names)."""
    row = {"type": "step", "epoch": epoch + 1, "step": step, "loss": float(out["loss"].detach()),
           "l_con": float(out["l_con"].detach()), "lr": lr, "grad_norm": grad_norm, "contrastive": contrastive}
    if "con_tau" in out:  # a model's own learnt temperature (CLIP's logit scale) moves; loss.tau stays put
        row["tau"] = float(out["con_tau"])
    if "l_rec" in out:
        row["l_rec"] = float(out["l_rec"].detach())
    if "lambda" in out:
        row["lambda"], row["gap"] = float(out["lambda"]), float(out["gap"])
    return row


# ---- validation and checkpoints ------------------------------------------------------------------
def run_validation(r: Run, validate: Validator | None, weights: DualEncoder, epoch: int) -> dict:
    """``validate(weights)`` in eval mode without gradients, logged as a ``val`` line ({} without one, and
    on every process but rank 0: the others wait for its result, :func:`distributed.broadcast_float`)."""
    if validate is None or not r.rank.main:
        return {}
    weights.eval()
    with torch.no_grad():
        res = validate(weights)
    weights.train()
    r.mlog.write(type="val", epoch=epoch, step=r.at.step, **res)
    return res


def checkpoint_payload(r: Run, weights: DualEncoder, resumable: bool = True) -> dict:
    opt = Optimizers(r.optimizer, r.scheduler, r.scaler) if resumable else None
    return training_checkpoint(r.cfg, r.data, weights, r.at, r.objective.checkpoint_state(), optimizers=opt)


def save_run_checkpoint(r: Run) -> None:
    """checkpoint.pt at the current position, and the λ trace beside it (both whole or absent; rank 0
    writes, every process holds the same state)."""
    if not r.rank.main:
        return
    save_checkpoint(r.run_dir / "checkpoint.pt", checkpoint_payload(r, r.model))
    r.objective.save_trace(r.run_dir)
