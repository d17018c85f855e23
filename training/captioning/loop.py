"""The captioner's training loop, in the retrieval loop's shape (``training/loop.py``): read it top to
bottom: set-up, resume, the stages' epochs of steps, validation, checkpoints. A run is XE epochs
(scheduled sampling), then SCST epochs (CIDEr-D + α · self-retrieval reward); ``train.init_from``
starts SCST from an earlier run's weights instead. The steps themselves are
``training/captioning/steps.py``'s; device choice, progress output, the run folder, the metrics log and
the checkpoint writer are the retrieval loop's.

Determinism: the image order of every epoch and every random choice inside a step (captions drawn,
scheduled-sampling swaps, sampled captions, unlabelled negatives, dropout) come from generators
seeded by (seed, stage, epoch, step), so a resumed run replays exactly the steps an uninterrupted
run takes. ``metrics.jsonl`` rows: ``step`` (stage xe: loss, ss_prob; stage scst: cider, r_ret,
reward, baseline, their greedy counterparts, loss), ``epoch`` (seconds), ``val`` (CIDEr-D of greedy
captions on val, and self-retrieval R@1 among val images when a judge is loaded).

Data parallel (``ltd caption train --nproc N``, torchrun; :mod:`training.distributed`): the batches are
global and every process takes its share of each (see ``steps.py``). Rank 0 alone validates and
writes; the others follow its validation result.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training import distributed
from training.captioning import checkpoint as ckpt_io
from training.captioning.checkpoint import CaptionProgress
from training.captioning.config import CaptionConfig
from training.captioning.data import FEAT_CHANNELS, CaptionData, prepare_captioning, regions
from training.captioning.inference import decode_regions, specials
from training.captioning.model import TopDownCaptioner, build_captioner
from training.captioning.retrieval_reward import load_judge
from training.captioning.run import CaptionRun
from training.captioning.scst import RewardSpec, SelfRetrievalReward
from training.captioning.steps import scst_step, set_up_negatives, xe_step
from training.captioning.vocab import CaptionVocab, sequence_lengths
from training.captioning.xe import epoch_captions, feedback_probability
from training.config import dump_config
from training.device import default_device, pick_device, using_device
from training.loop import open_run_dir
from training.metrics_log import MetricsLog
from training.progress import progress, set_progress

log = logging.getLogger(__name__)
STAGES = ("xe", "scst")


@dataclass
class CaptionRunResult:
    run_dir: Path
    best_cider: float
    best_epoch: int
    seconds: float


def train_captioner(cfg: CaptionConfig, run_dir: str | Path, *, resume: bool = False,
                    data: CaptionData | None = None) -> CaptionRunResult:
    """Train ``cfg`` into ``run_dir``: checkpoint.pt (resumable), best.pt (best val CIDEr-D),
    metrics.jsonl and config.yaml. ``data`` is :func:`prepare_captioning`'s result when the caller has
    it already; ``resume`` continues the run that ``run_dir`` holds. It runs on ``train.device``: the
    process's device while it runs (``training.device``)."""
    with using_device(pick_device(cfg.train.device)):
        return _train(cfg, Path(run_dir), resume, data)


def _train(cfg: CaptionConfig, run_dir: Path, resume: bool, data: CaptionData | None) -> CaptionRunResult:
    t_start, tc, rank = time.time(), cfg.train, distributed.current()
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    if not rank.main:  # one voice: the main process shows the progress
        set_progress(False)
    ckpt = open_run_dir(run_dir, resume, load=ckpt_io.load_caption_checkpoint)
    init = ckpt_io.load_caption_checkpoint(tc.init_from) if tc.init_from and ckpt is None else None

    # ---- data (the vocabulary of the weights it continues), model, judge, reward, optimiser ----------
    source = ckpt or init
    vocab = CaptionVocab.from_dict(source["vocab"]) if source else None
    data = data or prepare_captioning(cfg, vocab=vocab)
    ckpt_io.check_same_labelled(source, data)
    r = set_up(cfg, data, run_dir)

    # ---- SCST from train.init_from, or resume ----------------------------------------------------
    if init is not None:
        r.model.load_state_dict(init["model"])
        log.info("SCST starts from %s", tc.init_from)
    if ckpt is not None:
        r.at = ckpt_io.restore_caption_training(ckpt, r.model)
        r.optimizer = stage_optimizer(cfg, r.model, r.at.stage)
        r.optimizer.load_state_dict(ckpt["optimizer"])
        log.info("resumed %s at stage %s epoch %d step %d", run_dir, r.at.stage, r.at.epoch, r.at.step)
    distributed.check_same_step(r.at.step)
    if rank.main:
        dump_config(cfg, run_dir / "config.yaml")
    r.mlog = MetricsLog(run_dir / "metrics.jsonl" if rank.main else None,
                        resume_step=r.at.step if ckpt is not None else None)
    if ckpt is None:
        r0 = run_validation(r, epoch=0)
        log.info("val CIDEr-D before training%s: %.1f", " (from train.init_from)" if tc.init_from else "", r0["cider"])

    # ---- the stages' epochs ----------------------------------------------------------------------
    plan = [("xe", cfg.xe.epochs), ("scst", cfg.scst.epochs)]
    for stage, n_epochs in plan[STAGES.index(r.at.stage):]:
        if stage != r.at.stage:  # XE finished: SCST starts with its own optimiser and learning rate
            start_scst(r)
        for epoch in range(r.at.epoch, n_epochs):
            if stage == "xe" and xe_converged(r, epoch):
                break
            t_epoch = time.time()
            run_epoch(r, epoch, n_epochs)
            r.mlog.write(type="epoch", stage=stage, epoch=epoch + 1, step=r.at.step, seconds=time.time() - t_epoch)

            # ---- validation, best checkpoint, checkpoint -------------------------------------------
            res = run_validation(r, epoch=epoch + 1)
            r.at.epoch, r.at.step_in_epoch = epoch + 1, 0
            if res["cider"] > r.at.best["cider"]:
                r.at.best = {"cider": res["cider"], "epoch": epoch + 1, "stage": stage}
                save_run_checkpoint(r, r.run_dir / "best.pt", resumable=False)
            save_run_checkpoint(r, r.run_dir / "checkpoint.pt")
            log.info("%s epoch %d/%d: val CIDEr-D %.1f%s", stage, epoch + 1, n_epochs, res["cider"],
                     "".join(f", {k} {v:.1f}" for k, v in res.items() if k != "cider"))
        r.at.epoch = n_epochs
    return CaptionRunResult(run_dir, r.at.best["cider"], r.at.best["epoch"], time.time() - t_start)


# ---- set-up --------------------------------------------------------------------------------------
def set_up(cfg: CaptionConfig, data: CaptionData, run_dir: Path) -> CaptionRun:
    """Model (seeded, on the process's device), judge, reward and the first stage's optimiser: XE's, or
    SCST's when there are no XE epochs or ``train.init_from`` gives the weights SCST starts from."""
    torch.manual_seed(cfg.train.seed)
    device = torch.device(default_device())
    v = data.vocab
    model = build_captioner(len(v), FEAT_CHANNELS, cfg.model, v.pad_id, v.bos_id).to(device)
    judge = None
    if cfg.train.retrieval:
        judge = load_judge(cfg.train.retrieval, data.dataset, v.words, cache_dir=cfg.data.cache_dir)
    stage = "scst" if cfg.xe.epochs == 0 or cfg.train.init_from else "xe"
    s = cfg.scst
    spec = RewardSpec(cider_weight=s.cider_weight, alpha=s.alpha if cfg.needs_judge else 0.0,  # e.g. XE only: no judge
                      retrieval_loss=s.retrieval_loss, margin=s.margin, tau=s.tau, cider_eos=s.cider_eos)
    reward = SelfRetrievalReward(data.train_cider, judge, eos_id=v.eos_id, spec=spec)
    return CaptionRun(cfg=cfg, data=data, run_dir=run_dir, device=device, model=model,
                      optimizer=stage_optimizer(cfg, model, stage), judge=judge, reward=reward, specials=specials(v),
                      at=CaptionProgress(stage=stage), rank=distributed.current())


def stage_optimizer(cfg: CaptionConfig, model: TopDownCaptioner, stage: str) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=cfg.xe.lr if stage == "xe" else cfg.scst.lr)


# ---- stages --------------------------------------------------------------------------------------
def xe_converged(r: CaptionRun, epochs_done: int) -> bool:
    """Early stopping on val: ``xe.patience`` epochs in a row without a new best val CIDEr-D (the
    decision is a function of the checkpointed ``best``, so a resumed run makes the same one)."""
    patience, best = r.cfg.xe.patience, r.at.best
    if not patience or best.get("stage") != "xe" or epochs_done - best["epoch"] < patience:
        return False
    log.info("XE converged: no val CIDEr-D gain in %d epochs since epoch %d (%.1f)", patience, best["epoch"],
             best["cider"])
    r.mlog.write(type="early_stop", stage="xe", epoch=epochs_done, step=r.at.step, best_epoch=best["epoch"],
                 best_cider=best["cider"])
    return True


def start_scst(r: CaptionRun) -> None:
    """SCST's first epoch, with its own optimiser. With XE early stopping SCST starts from the best XE
    epoch (what ``train.init_from=XE/best.pt`` does for a separate run), not from the epochs past it.
    Data parallel: rank 0 writes best.pt, so every process waits for it (the broadcast) before reading it."""
    r.at.stage, r.at.epoch, r.at.step_in_epoch = "scst", 0, 0
    best_path = r.run_dir / "best.pt"
    if r.cfg.xe.patience and r.at.best.get("stage") == "xe":
        distributed.broadcast_float(0.0)  # a barrier: rank 0 has finished writing best.pt
        if best_path.exists():
            r.model.load_state_dict(ckpt_io.load_caption_checkpoint(best_path)["model"])
            log.info("SCST starts from the best XE epoch (%d, val CIDEr-D %.1f)", r.at.best["epoch"],
                     r.at.best["cider"])
    r.optimizer = stage_optimizer(r.cfg, r.model, "scst")


# ---- epochs of steps -----------------------------------------------------------------------------
def step_seed(seed: int, stage: str, epoch: int, step: int) -> int:
    return int(np.random.default_rng([seed, STAGES.index(stage), epoch, step]).integers(2**62))


def epoch_batches(r: CaptionRun, stage: str, epoch: int) -> list[np.ndarray]:
    """Global batches. XE: local train indices of labelled images; SCST: positions in the labelled
    list (the CIDEr references' order). A last SCST batch of one image is dropped (no negatives), and
    under W processes a last batch of fewer than W images (a process would have none)."""
    d, rng = r.data, np.random.default_rng([r.cfg.train.seed, STAGES.index(stage), epoch])
    if stage == "xe":
        order, bs, smallest = rng.permutation(d.labelled_images), r.cfg.xe.batch_size, r.rank.world
    else:
        order, bs = rng.permutation(len(d.labelled_images)), r.cfg.scst.batch_size
        smallest = max(2, r.rank.world)
    return [b for b in (order[i : i + bs] for i in range(0, len(order), bs)) if len(b) >= smallest]


@dataclass
class XEEpoch:
    """What an XE epoch fixes before its steps: the captions each image trains on, and the scheduled-
    sampling probability."""

    captions: np.ndarray  # (images of the epoch's batches, captions_per_image), batch after batch
    offsets: np.ndarray  # batch s's rows of ``captions``: offsets[s]:offsets[s + 1]
    ss_prob: float


def start_xe_epoch(r: CaptionRun, epoch: int, batches: list[np.ndarray]) -> XEEpoch:
    """The epoch's learning rate (× ``lr_decay`` every ``lr_decay_every`` epochs), feedback probability
    and captions (drawn from a generator seeded by (seed, epoch))."""
    cfg = r.cfg
    for g in r.optimizer.param_groups:
        g["lr"] = cfg.xe.lr * cfg.xe.lr_decay ** (epoch // cfg.xe.lr_decay_every)
    ss = feedback_probability(epoch, cfg.xe.ss_every, cfg.xe.ss_step, cfg.xe.ss_max)
    caps = epoch_captions(r.data.train.image_to_captions, np.concatenate(batches) if batches else np.zeros(0, int),
                          cfg.xe.captions_per_image, np.random.default_rng([cfg.train.seed, 0, epoch, 1]))
    return XEEpoch(caps, np.cumsum([0] + [len(b) for b in batches]), ss)


def run_epoch(r: CaptionRun, epoch: int, n_epochs: int) -> None:
    """The steps of one epoch of the current stage from ``r.at.step_in_epoch`` on. Logs every
    ``log_every`` steps, checkpoints every ``checkpoint_every``."""
    tc, stage = r.cfg.train, r.at.stage
    batches = epoch_batches(r, stage, epoch)
    xe = start_xe_epoch(r, epoch, batches) if stage == "xe" else None
    if stage == "scst":
        set_up_negatives(r)
    bar = progress(len(batches), initial=r.at.step_in_epoch, desc=f"{stage} epoch {epoch + 1}/{n_epochs}",
                   unit="step", leave=False)
    for s in range(r.at.step_in_epoch, len(batches)):
        seed = step_seed(tc.seed, stage, epoch, s)
        own = distributed.rank_seed(seed, r.rank.rank)  # samples and dropout: each process its own
        gen = torch.Generator().manual_seed(own)
        torch.manual_seed(own)  # dropout draws from the global generator
        row = train_step(r, batches, s, xe, seed, gen)
        r.at.step, r.at.step_in_epoch = r.at.step + 1, s + 1
        if r.at.step % tc.log_every == 0 or s == len(batches) - 1:
            r.mlog.write(type="step", stage=stage, epoch=epoch + 1, step=r.at.step,
                         lr=r.optimizer.param_groups[0]["lr"], **row)
        if tc.checkpoint_every and r.at.step % tc.checkpoint_every == 0 and s < len(batches) - 1:
            save_run_checkpoint(r, r.run_dir / "checkpoint.pt")
        bar.update(1)
        bar.set_postfix(**{k: f"{row[k]:.3f}" for k in ("loss", "cider", "r_ret") if k in row})
    bar.close()


def train_step(r: CaptionRun, batches: list[np.ndarray], s: int, xe: XEEpoch | None, seed: int,
               gen: torch.Generator) -> dict:
    """Step ``s`` of the epoch in the current stage; returns its metrics row. ``gen`` (this process's)
    draws the step's samples and swaps; SCST's shared draws come from a generator seeded by ``seed``."""
    r.model.train()
    if xe is not None:
        return xe_step(r, batches[s], xe.captions[xe.offsets[s] : xe.offsets[s + 1]], xe.ss_prob, gen)
    return scst_step(r, batches[s], np.random.default_rng(seed), gen)


# ---- validation and checkpoints ------------------------------------------------------------------
@torch.no_grad()
def run_validation(r: CaptionRun, epoch: int) -> dict:
    """Greedy captions of the val images: CIDEr-D (×100; the captioner's ids are a prefix of the
    CIDEr word ids, so no text round trip), unique captions, and self-retrieval R@1 among the val
    images when a judge is loaded; logged as a ``val`` line. Rank 0 alone validates; the other
    processes get its CIDEr-D."""
    if not r.rank.main:
        return {"cider": distributed.broadcast_float(0.0)}
    d = r.data
    rows = d.val_rows[: r.cfg.train.val_max_images or None]
    ids = torch.cat([decode_regions(r.model, regions(d.grid, rows[i : i + 100]), d.vocab)
                     for i in range(0, len(rows), 100)])
    lengths = sequence_lengths(ids, d.vocab.eos_id)
    res = {"cider": float(d.val_cider.score(ids.numpy(), np.arange(len(rows)), lengths.numpy()).mean() * 100)}
    if r.judge is not None:
        sims = r.judge.similarities(r.judge.embed_ids(ids, lengths), torch.as_tensor(rows))
        own = sims.diagonal()
        res["self_R@1"] = float(100 * ((sims > own[:, None]).sum(1) == 0).float().mean())
    res["unique"] = float(100 * len(set(d.vocab.decode_batch(ids))) / max(1, len(rows)))
    r.mlog.write(type="val", stage=r.at.stage, epoch=epoch, step=r.at.step, **res)
    distributed.broadcast_float(res["cider"])  # what the other processes choose the best epoch by
    return res


def save_run_checkpoint(r: CaptionRun, path: Path, resumable: bool = True) -> None:
    """``path`` at the current position (whole or absent), written by rank 0: every process holds the
    same state."""
    if r.rank.main:
        payload = ckpt_io.caption_checkpoint(r.cfg, r.data, r.model, r.at, r.optimizer if resumable else None)
        ckpt_io.save_caption_checkpoint(path, payload)
