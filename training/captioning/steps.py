"""The captioner's optimiser steps, one per stage: XE (teacher forcing with scheduled sampling) and SCST
(sampled captions rewarded with CIDEr-D + α · self-retrieval), and what an SCST step draws besides
its batch (SR-PL's unlabelled negatives, the judge's distractor images).

Data parallel: every step gets the *global* batch and trains on this process's share of it. XE and
SCST losses are per process, weighted by its share of the tokens, and the gradients averaged; in SCST
each process samples and rewards its own images' captions, but the judge ranks every caption against
the images of the whole global batch (the other processes' images, SR-PL negatives and distractors
are drawn from ``rng``, which draws the same on every process). The logged values are the processes'
means.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from training import distributed
from training.captioning.data import regions
from training.captioning.decoding import sample
from training.captioning.inference import decode_regions
from training.captioning.negatives import NegativeSampler
from training.captioning.retrieval_reward import unlabelled_ranks
from training.captioning.run import CaptionRun
from training.captioning.scst import mean_of_others, scst_loss
from training.captioning.vocab import sequence_lengths
from training.captioning.xe import xe_loss

log = logging.getLogger(__name__)


def xe_step(r: CaptionRun, images: np.ndarray, caps: np.ndarray, ss: float, gen: torch.Generator) -> dict:
    """One XE step; ``images`` (local train indices), ``caps`` (their captions, one row per image):
    the global batch. Scheduled sampling swaps words with probability ``ss``, drawing from ``gen``."""
    d, shard = r.data, r.rank.shard(len(images))
    images, caps = images[shard.rows], caps[shard.rows]
    reg = regions(d.grid, d.train_rows[images]).to(r.device)
    targets = d.targets[caps.reshape(-1)].to(r.device)
    loss = xe_loss(r.model, reg, targets, caps.shape[1], ss, gen)
    if shard.world > 1:  # a mean over tokens: each process's weighs its share of them
        loss = distributed.mean_over_ranks(loss, shard, distributed.share_of((targets != d.vocab.pad_id).sum()))
    optimizer_step(r, loss, r.cfg.xe.grad_clip)
    return {"loss": float(loss.detach()), "ss_prob": ss}


def scst_step(r: CaptionRun, lab: np.ndarray, rng: np.random.Generator, gen: torch.Generator) -> dict:
    """One SCST step; ``lab``: the global batch (positions in the labelled list). This process samples
    and rewards its share's captions against the candidates of the whole batch; ``rng`` draws the same
    on every process (negatives, distractors), ``gen`` this process's samples."""
    d, s, device = r.data, r.cfg.scst, r.device
    shard = r.rank.shard(len(lab))
    mine = np.zeros(len(lab), dtype=bool)
    mine[shard.rows] = True
    rows_all, refs = d.train_rows[d.labelled_images[lab]], lab[mine].astype(np.int64)
    if r.negatives is not None:
        neg = r.negatives.sample(lab, rng)  # one unlabelled image per labelled one, for the global batch
        rows_all = np.concatenate([rows_all, r.pool_rows[neg]])
        refs = np.concatenate([refs, -np.ones(int(mine.sum()), np.int64)])  # unlabelled: no CIDEr
        mine = np.concatenate([mine, mine])
    rows = rows_all[mine]
    # the judge's candidates beyond this process's images: the other processes' and the distractors
    dis = distractors(r, rows_all, rng)
    extra = rows_all[~mine] if dis is None else np.concatenate([rows_all[~mine], dis])
    reg = regions(d.grid, rows).to(device)
    n, L, k = len(rows), d.vocab.max_len, s.samples
    greedy_ids = decode_regions(r.model, reg, d.vocab) if s.baseline == "greedy" else None
    r.model.train()
    ctx = r.model.encode(reg)
    if k > 1:  # k block-major copies: block j holds sample j of every image (the reward's layout)
        ctx = ctx.index(torch.arange(n, device=device).repeat(k))
    ids, lp, mask = sample(lambda w, st: r.model.step(w, ctx, st), r.model.init_state(n * k), n * k, L,
                           r.specials, temperature=s.temperature, generator=gen)
    ids = ids.cpu()
    terms = r.reward(ids if greedy_ids is None else torch.cat([ids, greedy_ids]), rows, refs,
                     extra if len(extra) else None)
    r_s = terms.total[: n * k].to(device)
    r_b = terms.total[n * k:].repeat(k).to(device) if greedy_ids is not None else mean_of_others(r_s, k)
    loss = scst_loss(lp, mask, r_s, r_b)
    if shard.world > 1:  # a mean over the sampled tokens: each process's weighs its share of them
        loss = distributed.mean_over_ranks(loss, shard, distributed.share_of(mask.sum()))
    optimizer_step(r, loss, s.grad_clip)
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


def optimizer_step(r: CaptionRun, loss: torch.Tensor, clip: float) -> None:
    """Backward, the processes' gradients averaged, each gradient clamped to ±``clip`` (the self-critical
    code's clipping by value; 0: none), one optimiser step."""
    r.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    distributed.average_gradients(r.model.parameters())
    if clip > 0:
        for p in r.model.parameters():
            if p.grad is not None:
                p.grad.clamp_(-clip, clip)
    r.optimizer.step()


def distractors(r: CaptionRun, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """``scst.distractors`` training images outside the batch, drawn per step, that only enlarge the
    judge's candidate pool (none without a retrieval reward; labelled images only unless SR-PL uses
    the unlabelled pool)."""
    n, d = r.cfg.scst.distractors, r.data
    if not n or not r.reward.uses_judge:
        return None
    # scst.negatives=none keeps the unlabelled images out of SCST entirely, distractors included
    pool = d.train_rows if r.cfg.uses_unlabelled else d.train_rows[d.labelled_images]
    others = np.setdiff1d(pool, rows)
    return rng.choice(others, size=min(n, len(others)), replace=False)


def set_up_negatives(r: CaptionRun) -> None:
    """SR-PL: rank the unlabelled pool for every labelled caption once (the judge is frozen); the
    sampler then draws each step's negatives from those ranks. Nothing without SR-PL, or once done."""
    d, s = r.data, r.cfg.scst
    if not r.cfg.uses_unlabelled or r.negatives is not None:
        return
    pool_local = np.flatnonzero(~d.labelled)
    r.pool_rows = d.train_rows[pool_local]
    per_image = d.train.image_to_captions
    caps = [c for i in d.labelled_images for c in per_image[i]]
    cap_img = np.concatenate([np.full(len(per_image[i]), j) for j, i in enumerate(d.labelled_images)])
    ranked = None
    if s.negatives != "random":
        emb = r.judge.model.embed_texts([d.train.captions[c].raw for c in caps])
        ranked = unlabelled_ranks(r.judge, emb, r.pool_rows, s.h_max)
    r.negatives = NegativeSampler(ranked, cap_img, len(pool_local), mode=s.negatives, h_min=s.h_min, h_max=s.h_max)
    log.info("SR-PL: %d labelled, %d unlabelled images; negatives %s [%d, %d]", len(d.labelled_images),
             len(pool_local), s.negatives, s.h_min, s.h_max)
