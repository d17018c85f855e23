"""The captioner's training run: XE epochs (scheduled sampling), then SCST epochs (CIDEr-D +
α · self-retrieval reward), validation after every epoch, resumable checkpoints.

Determinism: the image order of every epoch and every random choice inside a step (captions drawn,
scheduled-sampling swaps, sampled captions, unlabelled negatives, dropout) come from generators
seeded by (seed, stage, epoch, step), so a resumed run replays exactly the steps an uninterrupted
run takes. ``metrics.jsonl`` rows: ``step`` (stage xe: loss, ss_prob; stage scst: cider, r_ret,
reward, baseline, their greedy counterparts, loss), ``epoch`` (seconds), ``val`` (CIDEr-D of greedy
captions on val, and self-retrieval R@1 among val images when a judge is loaded).

Data parallel (``ltd caption train --nproc N``, torchrun; :mod:`training.distributed`): the batches are
global and every process takes its share of each. XE and SCST losses are per process, weighted by its
share of the tokens, and the gradients averaged; in SCST each process samples and rewards its own images'
captions, but the judge ranks every caption against the images of the whole global batch (the other
processes' images, SR-PL negatives and distractors are drawn from the same generator on every process),
the candidates one process would use. Rank 0 alone validates and writes; the logged values are the
processes' means.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from training import distributed
from training.captioning import checkpoint as ckpt_io
from training.captioning.config import CaptionConfig
from training.captioning.data import FEAT_CHANNELS, CaptionData, default_device, prepare_captioning, regions
from training.captioning.decoding import sample
from training.captioning.inference import decode_regions, specials
from training.captioning.model import build_captioner
from training.captioning.negatives import NegativeSampler
from training.captioning.retrieval_reward import Judge, load_judge, unlabelled_ranks
from training.captioning.scst import SelfRetrievalReward, mean_of_others, scst_loss
from training.captioning.vocab import CaptionVocab, sequence_lengths
from training.captioning.xe import epoch_captions, feedback_probability, xe_loss
from training.checkpoint import sha256_file, versions
from training.config import ConfigError, dump_config
from training.errors import UserFileExists
from training.loop import MetricsLog

log = logging.getLogger(__name__)
STAGES = ("xe", "scst")


@dataclass
class CaptionRunResult:
    run_dir: Path
    best_cider: float
    best_epoch: int
    seconds: float


def step_seed(seed: int, stage: str, epoch: int, step: int) -> int:
    return int(np.random.default_rng([seed, STAGES.index(stage), epoch, step]).integers(2**62))


def _clip(params, value: float) -> None:
    if value > 0:
        for p in params:
            if p.grad is not None:
                p.grad.clamp_(-value, value)


class CaptionRun:
    """State of one run; ``fit`` runs the remaining epochs of both stages."""

    def __init__(self, cfg: CaptionConfig, run_dir: Path, *, resume: bool, data: CaptionData | None,
                 show_progress: bool):
        self.rank = distributed.current()
        self.cfg, self.run_dir, self.show = cfg, run_dir, show_progress and self.rank.main
        self.device = default_device(cfg.train.device)
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        self.ckpt_path, self.best_path = run_dir / "checkpoint.pt", run_dir / "best.pt"
        if self.ckpt_path.exists() and not resume:
            raise UserFileExists(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
        ckpt = ckpt_io.load_caption_checkpoint(self.ckpt_path) if resume and self.ckpt_path.exists() else None
        init = ckpt_io.load_caption_checkpoint(cfg.train.init_from) if cfg.train.init_from and ckpt is None else None
        source = ckpt or init
        vocab = CaptionVocab.from_dict(source["vocab"]) if source else None
        self.data = data or prepare_captioning(cfg, vocab=vocab, show_progress=self.show, device=str(self.device))
        if source is not None and source.get("labelled") != np.flatnonzero(self.data.labelled).tolist():
            raise ConfigError("the checkpoint was trained on another labelled subset (data.labelled_fraction or "
                              "train.seed differ)")
        torch.manual_seed(cfg.train.seed)
        v = self.data.vocab
        self.model = build_captioner(len(v), FEAT_CHANNELS, cfg.model, v.pad_id, v.bos_id).to(self.device)
        self.sp = specials(v)
        self.judge = self._load_judge()
        self.stage, self.epoch, self.step_in_epoch, self.global_step = "xe", 0, 0, 0
        self.best = {"cider": -1.0, "epoch": -1}
        if cfg.xe.epochs == 0 or init is not None:
            self.stage = "scst"
        self.optimizer = self._optimizer(self.stage)
        if init is not None:
            self.model.load_state_dict(init["model"])
            log.info("SCST starts from %s", cfg.train.init_from)
        if ckpt is not None:
            self.model.load_state_dict(ckpt["model"])
            self.stage, self.epoch, self.step_in_epoch = ckpt["stage"], ckpt["epoch"], ckpt["step_in_epoch"]
            self.global_step, self.best = ckpt["step"], ckpt["best"]
            self.optimizer = self._optimizer(self.stage)
            self.optimizer.load_state_dict(ckpt["optimizer"])
            log.info("resumed %s at stage %s epoch %d step %d", run_dir, self.stage, self.epoch, self.global_step)
        distributed.check_same_step(self.global_step)
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.rank.main:
            dump_config(cfg, run_dir / "config.yaml")
        self.mlog = MetricsLog(run_dir / "metrics.jsonl" if self.rank.main else None,
                               resume_step=self.global_step if ckpt is not None else None)
        self.fresh = ckpt is None
        self.reward = SelfRetrievalReward(self.data.train_cider, self.judge, eos_id=v.eos_id,
                                          cider_weight=cfg.scst.cider_weight,
                                          alpha=cfg.scst.alpha if cfg.needs_judge else 0.0,  # e.g. XE only: no judge
                                          loss=cfg.scst.retrieval_loss, margin=cfg.scst.margin, tau=cfg.scst.tau,
                                          cider_eos=cfg.scst.cider_eos)
        self.sampler, self.pool_rows = None, np.zeros(0, dtype=np.int64)

    # ---- set-up -------------------------------------------------------------------------------
    def _load_judge(self) -> Judge | None:
        path = self.cfg.train.retrieval
        if not path:
            return None
        return load_judge(path, self.data.dataset, self.data.vocab.words, cache_dir=self.cfg.data.cache_dir,
                          device=str(self.device), show_progress=self.show)

    def _optimizer(self, stage: str) -> torch.optim.Optimizer:
        lr = self.cfg.xe.lr if stage == "xe" else self.cfg.scst.lr
        return torch.optim.Adam(self.model.parameters(), lr=lr)

    def _negatives(self) -> None:
        """SR-PL: rank the unlabelled pool for every labelled caption once (the judge is frozen)."""
        d, s = self.data, self.cfg.scst
        if not self.cfg.uses_unlabelled or self.sampler is not None:
            return
        pool_local = np.flatnonzero(~d.labelled)
        self.pool_rows = d.train_rows[pool_local]
        per_image = d.train.image_to_captions
        caps = [c for i in d.labelled_images for c in per_image[i]]
        cap_img = np.concatenate([np.full(len(per_image[i]), j) for j, i in enumerate(d.labelled_images)])
        ranked = None
        if s.negatives != "random":
            emb = self.judge.model.embed_texts([d.train.captions[c].raw for c in caps])
            ranked = unlabelled_ranks(self.judge, emb, self.pool_rows, s.h_max)
        self.sampler = NegativeSampler(ranked, cap_img, len(pool_local), mode=s.negatives, h_min=s.h_min, h_max=s.h_max)
        log.info("SR-PL: %d labelled, %d unlabelled images; negatives %s [%d, %d]", len(d.labelled_images),
                 len(pool_local), s.negatives, s.h_min, s.h_max)

    # ---- steps --------------------------------------------------------------------------------
    def _xe_step(self, images: np.ndarray, caps: np.ndarray, ss: float, gen: torch.Generator) -> dict:
        """``images``, ``caps``: the global batch (this process trains on its share)."""
        d, shard = self.data, self.rank.shard(len(images))
        images, caps = images[shard.rows], caps[shard.rows]
        reg = regions(d.grid, d.train_rows[images]).to(self.device)
        targets = d.targets[caps.reshape(-1)].to(self.device)
        loss = xe_loss(self.model, reg, targets, caps.shape[1], ss, gen)
        if shard.world > 1:  # a mean over tokens: each process's weighs its share of them
            loss = distributed.mean_over_ranks(loss, shard, distributed.share_of((targets != d.vocab.pad_id).sum()))
        self._step(loss, self.cfg.xe.grad_clip)
        return {"loss": float(loss.detach()), "ss_prob": ss}

    def _step(self, loss: torch.Tensor, clip: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.average_gradients(self.model.parameters())
        _clip(self.model.parameters(), clip)
        self.optimizer.step()

    def _scst_step(self, lab: np.ndarray, rng: np.random.Generator, gen: torch.Generator) -> dict:
        """``lab``: the global batch (positions in the labelled list); this process samples and rewards
        its share's captions against the candidates of the whole batch. ``rng`` draws the same on every
        process (negatives, distractors), ``gen`` this process's samples."""
        d, s = self.data, self.cfg.scst
        shard = self.rank.shard(len(lab))
        mine = np.zeros(len(lab), dtype=bool)
        mine[shard.rows] = True
        rows_all, refs = d.train_rows[d.labelled_images[lab]], lab[mine].astype(np.int64)
        if self.sampler is not None:
            neg = self.sampler.sample(lab, rng)  # one unlabelled image per labelled one, for the global batch
            rows_all = np.concatenate([rows_all, self.pool_rows[neg]])
            refs = np.concatenate([refs, -np.ones(int(mine.sum()), np.int64)])  # unlabelled: no CIDEr
            mine = np.concatenate([mine, mine])
        rows = rows_all[mine]
        # the judge's candidates beyond this process's images: the other processes' and the distractors
        dis = self._distractors(rows_all, rng)
        extra = rows_all[~mine] if dis is None else np.concatenate([rows_all[~mine], dis])
        reg = regions(d.grid, rows).to(self.device)
        n, L, k = len(rows), d.vocab.max_len, s.samples
        greedy_ids = decode_regions(self.model, reg, d.vocab) if s.baseline == "greedy" else None
        self.model.train()
        ctx = self.model.encode(reg)
        if k > 1:  # k block-major copies: block j holds sample j of every image (the reward's layout)
            ctx = ctx.index(torch.arange(n, device=self.device).repeat(k))
        ids, lp, mask = sample(lambda w, st: self.model.step(w, ctx, st), self.model.init_state(n * k), n * k, L,
                               self.sp, temperature=s.temperature, generator=gen)
        ids = ids.cpu()
        terms = self.reward(ids if greedy_ids is None else torch.cat([ids, greedy_ids]), rows, refs,
                            extra if len(extra) else None)
        r_s = terms.total[: n * k].to(self.device)
        r_b = terms.total[n * k:].repeat(k).to(self.device) if greedy_ids is not None else mean_of_others(r_s, k)
        loss = scst_loss(lp, mask, r_s, r_b)
        if shard.world > 1:  # a mean over the sampled tokens: each process's weighs its share of them
            loss = distributed.mean_over_ranks(loss, shard, distributed.share_of(mask.sum()))
        self._step(loss, s.grad_clip)
        lab_m = torch.from_numpy(np.tile(refs >= 0, k))
        row = {"loss": float(loss.detach()), "reward": float(r_s.mean()), "baseline": float(r_b.mean()),
               "cider": float(terms.cider[: n * k][lab_m].mean()), "r_ret": float(terms.r_ret[: n * k].mean()),
               "sample_len": float(sequence_lengths(ids, d.vocab.eos_id).float().mean())}
        if greedy_ids is not None:
            row.update(cider_greedy=float(terms.cider[n * k:][lab_m[:n]].mean()),
                       r_ret_greedy=float(terms.r_ret[n * k:].mean()))
        if shard.world > 1:  # the processes' means (the loss is the global one already)
            means = distributed.mean_of_scalars({k: torch.tensor(v) for k, v in row.items() if k != "loss"}, shard)
            row.update({k: float(v) for k, v in means.items()})
        return row

    def _distractors(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        """``scst.distractors`` training images outside the batch, drawn per step, that only enlarge the
        judge's candidate pool (none without a retrieval reward; labelled images only unless SR-PL uses
        the unlabelled pool)."""
        n, d = self.cfg.scst.distractors, self.data
        if not n or not self.reward.uses_judge:
            return None
        # scst.negatives=none keeps the unlabelled images out of SCST entirely, distractors included
        pool = d.train_rows if self.cfg.uses_unlabelled else d.train_rows[d.labelled_images]
        others = np.setdiff1d(pool, rows)
        return rng.choice(others, size=min(n, len(others)), replace=False)

    # ---- epochs -------------------------------------------------------------------------------
    def _batches(self, stage: str, epoch: int) -> list[np.ndarray]:
        """Global batches. XE: local train indices of labelled images; SCST: positions in the labelled
        list (the CIDEr references' order). A last SCST batch of one image is dropped (no negatives), and
        under W processes a last batch of fewer than W images (a process would have none)."""
        d, rng = self.data, np.random.default_rng([self.cfg.train.seed, STAGES.index(stage), epoch])
        if stage == "xe":
            order, bs, smallest = rng.permutation(d.labelled_images), self.cfg.xe.batch_size, self.rank.world
        else:
            order, bs = rng.permutation(len(d.labelled_images)), self.cfg.scst.batch_size
            smallest = max(2, self.rank.world)
        return [b for b in (order[i : i + bs] for i in range(0, len(order), bs)) if len(b) >= smallest]

    def _epoch(self, stage: str, epoch: int, n_epochs: int) -> None:
        cfg, d = self.cfg, self.data
        batches = self._batches(stage, epoch)
        if stage == "xe":
            for g in self.optimizer.param_groups:
                g["lr"] = cfg.xe.lr * cfg.xe.lr_decay ** (epoch // cfg.xe.lr_decay_every)
            ss = feedback_probability(epoch, cfg.xe.ss_every, cfg.xe.ss_step, cfg.xe.ss_max)
            caps = epoch_captions(d.train.image_to_captions, np.concatenate(batches) if batches else np.zeros(0, int),
                                  cfg.xe.captions_per_image, np.random.default_rng([cfg.train.seed, 0, epoch, 1]))
            offsets = np.cumsum([0] + [len(b) for b in batches])
        else:
            self._negatives()
        t0 = time.time()
        bar = tqdm(total=len(batches), initial=self.step_in_epoch, desc=f"{stage} epoch {epoch + 1}/{n_epochs}",
                   unit="step", disable=not self.show, leave=False)
        for s in range(self.step_in_epoch, len(batches)):
            seed = step_seed(cfg.train.seed, stage, epoch, s)
            own = distributed.rank_seed(seed, self.rank.rank)  # samples and dropout: each process its own
            gen = torch.Generator().manual_seed(own)
            torch.manual_seed(own)  # dropout draws from the global generator
            self.model.train()
            if stage == "xe":
                row = self._xe_step(batches[s], caps[offsets[s] : offsets[s + 1]], ss, gen)
            else:
                row = self._scst_step(batches[s], np.random.default_rng(seed), gen)
            self.global_step += 1
            if self.global_step % cfg.train.log_every == 0 or s == len(batches) - 1:
                self.mlog.write(type="step", stage=stage, epoch=epoch + 1, step=self.global_step,
                                lr=self.optimizer.param_groups[0]["lr"], **row)
            every = cfg.train.checkpoint_every
            if every and self.global_step % every == 0 and s < len(batches) - 1:
                self.save(self.ckpt_path, stage, epoch, s + 1)
            bar.update(1)
            bar.set_postfix({k: f"{row[k]:.3f}" for k in ("loss", "cider", "r_ret") if k in row})
        bar.close()
        self.step_in_epoch = 0
        self.mlog.write(type="epoch", stage=stage, epoch=epoch + 1, step=self.global_step, seconds=time.time() - t0)

    @torch.no_grad()
    def validate(self, stage: str, epoch: int) -> dict:
        """Greedy captions of the val images: CIDEr-D (×100; the captioner's ids are a prefix of the
        CIDEr word ids, so no text round trip), unique captions, and self-retrieval R@1 among the val
        images when a judge is loaded. Rank 0 alone validates; the other processes get its CIDEr-D."""
        if not self.rank.main:
            return {"cider": distributed.broadcast_float(0.0)}
        d = self.data
        rows = d.val_rows[: self.cfg.train.val_max_images or None]
        ids = torch.cat([decode_regions(self.model, regions(d.grid, rows[i : i + 100]), d.vocab)
                         for i in range(0, len(rows), 100)])
        lengths = sequence_lengths(ids, d.vocab.eos_id)
        res = {"cider": float(d.val_cider.score(ids.numpy(), np.arange(len(rows)), lengths.numpy()).mean() * 100)}
        if self.judge is not None:
            sims = self.judge.similarities(self.judge.embed_ids(ids, lengths), torch.as_tensor(rows))
            own = sims.diagonal()
            res["self_R@1"] = float(100 * ((sims > own[:, None]).sum(1) == 0).float().mean())
        res["unique"] = float(100 * len(set(d.vocab.decode_batch(ids))) / max(1, len(rows)))
        self.mlog.write(type="val", stage=stage, epoch=epoch, step=self.global_step, **res)
        distributed.broadcast_float(res["cider"])  # what the other processes choose the best epoch by
        return res

    def save(self, path: Path, stage: str, epoch: int, step_in_epoch: int, resumable: bool = True) -> None:
        """``path`` (whole or absent), written by rank 0: every process holds the same state."""
        if not self.rank.main:
            return
        d = self.data
        judge = {"path": self.cfg.train.retrieval, "sha256": sha256_file(self.cfg.train.retrieval)[:16]} \
            if self.cfg.train.retrieval else None
        ckpt_io.save_caption_checkpoint(path, {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict() if resumable else None,
            "stage": stage, "epoch": epoch, "step_in_epoch": step_in_epoch, "step": self.global_step,
            "config": self.cfg.to_dict(), "vocab": d.vocab.to_dict(), "feat_dim": 1280,
            "feature_key": d.feature_key, "labelled": np.flatnonzero(d.labelled).tolist(), "best": dict(self.best),
            "judge": judge, "versions": versions(), "torch_rng": torch.get_rng_state(),
            "dataset": {"name": d.dataset.name, "json": str(d.dataset.json_path)}})

    def _xe_converged(self, epochs_done: int) -> bool:
        """Early stopping on val: ``xe.patience`` epochs in a row without a new best val CIDEr-D (the
        decision is a function of the checkpointed ``best``, so a resumed run makes the same one)."""
        patience = self.cfg.xe.patience
        if not patience or self.best.get("stage") != "xe" or epochs_done - self.best["epoch"] < patience:
            return False
        log.info("XE converged: no val CIDEr-D gain in %d epochs since epoch %d (%.1f)", patience,
                 self.best["epoch"], self.best["cider"])
        self.mlog.write(type="early_stop", stage="xe", epoch=epochs_done, step=self.global_step,
                        best_epoch=self.best["epoch"], best_cider=self.best["cider"])
        return True

    def _from_best_xe(self) -> None:
        """With early stopping, SCST starts from the best XE epoch (what ``train.init_from=XE/best.pt``
        does for a separate run), not from the epochs past it. Data parallel: rank 0 writes best.pt, so
        every process waits for it (the broadcast) before reading it."""
        if not (self.cfg.xe.patience and self.best.get("stage") == "xe"):
            return
        distributed.broadcast_float(0.0)  # a barrier: rank 0 has finished writing best.pt
        if self.best_path.exists():
            self.model.load_state_dict(ckpt_io.load_caption_checkpoint(self.best_path)["model"])
            log.info("SCST starts from the best XE epoch (%d, val CIDEr-D %.1f)", self.best["epoch"], self.best["cider"])

    def fit(self) -> None:
        cfg = self.cfg
        if self.fresh:
            r0 = self.validate(self.stage, 0)
            log.info("val CIDEr-D before training%s: %.1f", " (from train.init_from)" if self.cfg.train.init_from else "",
                     r0["cider"])
        plan = [("xe", cfg.xe.epochs), ("scst", cfg.scst.epochs)]
        for stage, n_epochs in plan[STAGES.index(self.stage):]:
            if stage != self.stage:  # XE finished: SCST starts with its own optimiser and learning rate
                self.stage, self.epoch, self.step_in_epoch = stage, 0, 0
                self._from_best_xe()
                self.optimizer = self._optimizer(stage)
            for epoch in range(self.epoch, n_epochs):
                if stage == "xe" and self._xe_converged(epoch):
                    break
                self._epoch(stage, epoch, n_epochs)
                res = self.validate(stage, epoch + 1)
                if res["cider"] > self.best["cider"]:
                    self.best = {"cider": res["cider"], "epoch": epoch + 1, "stage": stage}
                    self.save(self.best_path, stage, epoch + 1, 0, resumable=False)
                self.epoch = epoch + 1
                self.save(self.ckpt_path, stage, epoch + 1, 0)
                log.info("%s epoch %d/%d: val CIDEr-D %.1f%s", stage, epoch + 1, n_epochs, res["cider"],
                         "".join(f", {k} {v:.1f}" for k, v in res.items() if k != "cider"))
            self.epoch = n_epochs


def train_captioner(cfg: CaptionConfig, run_dir: str | Path, *, resume: bool = False, data: CaptionData | None = None,
                    show_progress: bool = True) -> CaptionRunResult:
    t0 = time.time()
    run = CaptionRun(cfg, Path(run_dir), resume=resume, data=data, show_progress=show_progress)
    run.fit()
    return CaptionRunResult(Path(run_dir), run.best["cider"], run.best["epoch"], time.time() - t0)
