"""The training loop. Read it top to bottom: set-up, resume, epochs of steps, validation, checkpoints.

Determinism: the caption order of epoch e is a permutation seeded by (seed, e), and every random
choice inside step s (cached view, token dropout, augmentation) uses a generator seeded by
(seed, e, s). A resumed run therefore replays exactly the steps an uninterrupted run would take.
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel
from tqdm.auto import tqdm

from training.checkpoint import load_checkpoint, model_state, rng_state, save_checkpoint, versions
from training.config import Config, dump_config
from training.losses import build_contrastive_loss, cosine_reconstruction_loss, token_nll_loss
from training.losses.lambda_trace import build_combiner, write_lambda_trace
from training.models.decoders import InputTokenDecoder
from training.models.dual_encoder import DualEncoder, build_model
from training.models.text_encoder import move_batch
from training.prepare import TrainingData, prepare

log = logging.getLogger(__name__)

Validator = Callable[[DualEncoder], dict]


@dataclass
class RunResult:
    run_dir: Path
    best_rsum: float
    best_epoch: int
    epochs: int
    seconds: float


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def epoch_batches(seed: int, epoch: int, n: int, batch_size: int) -> list[np.ndarray]:
    """Every caption once per epoch; a final batch smaller than 2 is dropped (no negatives)."""
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return [b for b in (perm[i : i + batch_size] for i in range(0, n, batch_size)) if len(b) >= 2]


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


class MetricsLog:
    """metrics.jsonl: one JSON object per line. On resume, lines past the checkpoint are dropped."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
            # a val line at the checkpoint step belongs to the finished epoch and is kept
            path.write_text("".join(ln + "\n" for ln in keep))

    def write(self, **row) -> None:
        clean = {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in row.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")


class _ImageBatches(torch.utils.data.Dataset):
    """End-to-end training: one item = one batch of augmented images (random resized crop + flip)."""

    def __init__(self, paths: list[Path], pre, batches: list[np.ndarray], seed: int, epoch: int, skip: int):
        self.paths, self.pre, self.batches, self.seed, self.epoch, self.skip = paths, pre, batches, seed, epoch, skip

    def __len__(self) -> int:
        return len(self.batches) - self.skip

    def __getitem__(self, i: int) -> torch.Tensor:
        from training.data.images import load_image
        s = i + self.skip
        rng = np.random.default_rng([self.seed, self.epoch, s, 7])
        out = []
        for idx in self.batches[s]:
            img = load_image(self.paths[idx])
            w, h = img.size
            scale, ratio = rng.uniform(0.5, 1.0), math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw = min(w, int(round(math.sqrt(scale * w * h * ratio))))
            ch = min(h, int(round(math.sqrt(scale * w * h / ratio))))
            x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            img = img.crop((x0, y0, x0 + cw, y0 + ch)).resize((self.pre.size, self.pre.size))
            if rng.random() < 0.5:
                img = img.transpose(0)  # FLIP_LEFT_RIGHT
            out.append(self.pre.to_tensor(img))
        return torch.stack(out)


def train(cfg: Config, run_dir: str | Path, *, validate: Validator | None = None, resume: bool = False,
          data: TrainingData | None = None, show_progress: bool = True) -> RunResult:
    run_dir = Path(run_dir)
    t_start = time.time()
    tc, oc, lc = cfg.train, cfg.optim, cfg.loss
    device = pick_device(tc.device)
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    ckpt_path, best_path = run_dir / "checkpoint.pt", run_dir / "best.pt"
    if ckpt_path.exists() and not resume:
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    ckpt = load_checkpoint(ckpt_path) if resume and ckpt_path.exists() else None
    if resume and ckpt is None:
        log.warning("--resume: no checkpoint in %s, starting a new run", run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    # ---- data, model, losses, optimiser -------------------------------------------------------
    random.seed(tc.seed), np.random.seed(tc.seed), torch.manual_seed(tc.seed)
    data = data or prepare(cfg, show_progress=show_progress, device=str(device))
    target_dim = int(data.targets.shape[1]) if data.targets is not None else 0
    torch.manual_seed(tc.seed)
    model = build_model(cfg, data.vocab, feat_dim=data.feat_dim, target_dim=target_dim,
                        word_embeddings=data.word_embeddings, backbone=data.backbone).to(device)
    train_img = data.train_image_index
    feats = data.image_feats  # (N_all, V, D) on the CPU; batches are gathered then moved
    if model.image.fne is not None:
        model.image.fne.fit(feats[np.unique(train_img)].mean(1))
    if getattr(model.text, "frozen", False):
        # A frozen sentence encoder: embed every training caption once (disk-cached; the same cache
        # as LTD targets when the texts and model agree), so each step runs the projection head only.
        from training.targets import compute_targets
        emb = compute_targets(data.train_texts, cfg.model.sbert_path, cache_dir=cfg.data.cache_dir,
                              show_progress=show_progress)
        model.text.remember(data.train_texts, torch.from_numpy(emb))
    contrastive_name = "sh" if lc.contrastive == "sh_mh" else lc.contrastive
    contrastive = build_contrastive_loss(contrastive_name, tau=lc.tau, margin=lc.margin, epsilon=lc.ifm_epsilon)
    backbone_params = list(model.image.backbone.parameters()) if model.image.backbone is not None else []
    bb_ids = {id(p) for p in backbone_params}
    other = [p for p in model.parameters() if id(p) not in bb_ids]
    groups = [{"params": other, "lr": oc.lr}]
    if backbone_params:  # present from the start so optimiser state survives unfreezing and resume
        groups.append({"params": backbone_params, "lr": oc.lr * cfg.model.backbone_lr_scale})
    opt_cls = torch.optim.AdamW if oc.optimizer == "adamw" else torch.optim.Adam
    # fused=True: one kernel for all parameters (3x faster optimiser steps on CPU than the default)
    optimizer = opt_cls(groups, lr=oc.lr, weight_decay=oc.weight_decay, fused=True)
    batches0 = epoch_batches(tc.seed, 0, len(data.train_texts), tc.batch_size)
    if not batches0:
        raise ValueError(f"train split has {len(data.train_texts)} captions: fewer than 2, nothing to train on")
    steps_per_epoch = len(batches0)
    total_steps = steps_per_epoch * tc.epochs
    combiner = build_combiner(lc, total_steps)  # replay: reads and checks the logged λ schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(oc.warmup_steps, total_steps, oc.schedule, oc.min_lr_ratio))
    use_amp = device.type == "cuda" and tc.amp
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)

    # ---- resume ----------------------------------------------------------------------------------
    epoch, step_in_epoch, global_step = 0, 0, 0
    best = {"rsum": -1.0, "epoch": -1}
    stale_epochs = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"], strict=False)
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        combiner.load_state_dict(ckpt["constraint"])
        epoch, step_in_epoch, global_step = ckpt["epoch"], ckpt["step_in_epoch"], ckpt["step"]
        best, stale_epochs = ckpt["best"], ckpt.get("stale_epochs", 0)
        contrastive_name = ckpt.get("contrastive", contrastive_name)
        contrastive = build_contrastive_loss(contrastive_name, tau=lc.tau, margin=lc.margin, epsilon=lc.ifm_epsilon)
        if "scaler" in ckpt and use_amp:
            scaler.load_state_dict(ckpt["scaler"])
        log.info("resumed %s at epoch %d step %d", run_dir, epoch, global_step)
    dump_config(cfg, run_dir / "config.yaml")
    mlog = MetricsLog(run_dir / "metrics.jsonl", resume_step=global_step if ckpt is not None else None)

    def payload(next_epoch: int, next_step: int, weights: DualEncoder, resumable: bool = True) -> dict:
        trained = not cfg.model.freeze_backbone or 0 <= cfg.model.unfreeze_after_epoch < next_epoch
        state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "scaler": scaler.state_dict()} if resumable else {"optimizer": None, "scheduler": None}
        excluded = weights.frozen_prefixes(backbone_trained=trained)
        return {"model": model_state(weights, excluded), "excluded_prefixes": excluded, **state,
                "constraint": combiner.state_dict(),
                "epoch": next_epoch, "step_in_epoch": next_step, "step": global_step, "config": cfg.to_dict(),
                "vocab": data.vocab.to_dict(), "versions": versions(), "rng": rng_state(), "best": best,
                "stale_epochs": stale_epochs, "contrastive": contrastive_name, "target_dim": target_dim,
                "feat_dim": data.feat_dim, "word_dim": int(getattr(model.text, "embed").weight.shape[1])
                if hasattr(model.text, "embed") else cfg.model.word_dim, "backbone_in_state": trained,
                "backbone_trained": trained, "feature_key": data.feature_key, "dataset": {
                    "name": data.dataset.name, "json": str(data.dataset.json_path)}}

    def save_trace() -> None:
        """λ of every step so far, next to the checkpoint (a replay run's source)."""
        if lc.mode in ("constraint", "replay"):
            write_lambda_trace(run_dir, combiner.lambda_trace, lc.eta)

    def run_validation(weights: DualEncoder, ep: int) -> dict:
        if validate is None:
            return {}
        weights.eval()
        with torch.no_grad():
            res = validate(weights)
        weights.train()
        mlog.write(type="val", epoch=ep, step=global_step, **res)
        return res

    if ckpt is None and validate is not None:
        r0 = run_validation(model, 0)
        log.info("epoch 0 (untrained) val rsum %.1f", r0.get("rsum", float("nan")))

    # ---- epochs ----------------------------------------------------------------------------------
    model.train()
    for epoch in range(epoch, tc.epochs):
        unfrozen = (not cfg.model.freeze_backbone) or (0 <= cfg.model.unfreeze_after_epoch <= epoch)
        if unfrozen and model.image.backbone is not None and model.image.frozen:
            log.info("epoch %d: fine-tuning the backbone end to end (lr x %g)", epoch + 1, cfg.model.backbone_lr_scale)
            model.image.frozen = False
            for p in backbone_params:
                p.requires_grad_(True)
        batches = epoch_batches(tc.seed, epoch, len(data.train_texts), tc.batch_size)
        swa_at = set(np.round(np.linspace(0.9 * len(batches), len(batches) - 1, 5)).astype(int).tolist()) if tc.swa else set()
        swa_model = AveragedModel(model, use_buffers=True) if tc.swa else None
        image_iter = None
        if not model.image.frozen:
            ds_paths = [im.path for im in data.dataset.images]
            image_iter = iter(torch.utils.data.DataLoader(
                _ImageBatches(ds_paths, model.image.backbone.preprocess, [train_img[b] for b in batches], tc.seed,
                              epoch, step_in_epoch), batch_size=None, num_workers=2, prefetch_factor=2))
        t_epoch = time.time()
        bar = tqdm(total=len(batches), initial=step_in_epoch, desc=f"epoch {epoch + 1}/{tc.epochs}", unit="step",
                   disable=not show_progress, leave=False)
        sums = {"loss": 0.0, "l_con": 0.0, "l_rec": 0.0}
        n_steps = 0
        for s in range(step_in_epoch, len(batches)):
            idx = batches[s]
            step_seed = int(np.random.default_rng([tc.seed, epoch, s]).integers(2**62))
            gen = torch.Generator().manual_seed(step_seed)
            torch.manual_seed(step_seed)  # dropout layers draw from the global generator
            img_ids = torch.as_tensor(train_img[idx])
            with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
                if image_iter is not None:
                    img_emb = model.image(next(image_iter).to(device, non_blocking=True))
                else:
                    f = feats[img_ids]  # (B, V, D)
                    if tc.multi_view and f.shape[1] > 1:
                        f = f[torch.arange(len(idx)), torch.randint(f.shape[1], (len(idx),), generator=gen)]
                    else:
                        f = f.mean(1)
                    img_emb = model.encode_image_features(f.to(device, non_blocking=True))
                texts = [data.train_texts[i] for i in idx]
                txt_emb = model.encode_text(move_batch(model.text.prepare(texts, train=True, generator=gen), device))
                con = contrastive(img_emb.float(), txt_emb.float(), image_ids=img_ids.to(device))
                l_rec = None
                if model.decoder is not None and lc.decoder == "ltd":
                    l_rec = cosine_reconstruction_loss(model.decoder(txt_emb).float(), data.targets[idx].to(device))
                elif model.decoder is not None:
                    ids = [data.vocab.encode_text(t)[: cfg.data.max_caption_len] for t in texts]
                    inp, tgt = InputTokenDecoder.teacher_forcing(ids, data.vocab.bos_id, data.vocab.eos_id,
                                                                 cfg.data.max_caption_len)
                    logits = model.decoder(txt_emb, {"itd_in": inp.to(device)})
                    l_rec = token_nll_loss(logits.float(), tgt.to(device), reduction=lc.itd_reduction)
                out = combiner(con["loss"], l_rec)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(out["loss"]).backward()
            scaler.unscale_(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            gnorm = torch.nn.utils.clip_grad_norm_(params, oc.grad_clip if oc.grad_clip > 0 else float("inf"))
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            if l_rec is not None:
                combiner.update(l_rec.detach())
            global_step += 1
            n_steps += 1
            for k in sums:
                if k in out and out[k] is not None:
                    sums[k] += float(out[k].detach())
            if swa_model is not None and s in swa_at:
                swa_model.update_parameters(model)
            if global_step % tc.log_every == 0 or s == len(batches) - 1:
                row = {"type": "step", "epoch": epoch + 1, "step": global_step, "loss": float(out["loss"].detach()),
                       "l_con": float(out["l_con"].detach()), "lr": scheduler.get_last_lr()[0], "grad_norm": float(gnorm),
                       "contrastive": contrastive_name}
                if l_rec is not None:
                    row["l_rec"] = float(l_rec.detach())
                if "lambda" in out:
                    row["lambda"], row["gap"] = float(out["lambda"]), float(out["gap"])
                mlog.write(**row)
            if tc.checkpoint_every and global_step % tc.checkpoint_every == 0 and s < len(batches) - 1:
                save_checkpoint(ckpt_path, payload(epoch, s + 1, model))
                save_trace()
            bar.update(1)
            bar.set_postfix(loss=f"{float(out['loss'].detach()):.3f}", **({"lam": f"{float(out['lambda']):.2f}"}
                                                                    if "lambda" in out else {}))
        bar.close()
        step_in_epoch = 0
        secs = time.time() - t_epoch
        mlog.write(type="epoch", epoch=epoch + 1, step=global_step, seconds=secs,
                   **{f"mean_{k}": v / max(1, n_steps) for k, v in sums.items() if v})
        # ---- validation, best checkpoint, curriculum ---------------------------------------------
        eval_model = swa_model.module if swa_model is not None else model
        res = run_validation(eval_model, epoch + 1)
        rsum = float(res.get("rsum", -1.0))
        improved = validate is None or rsum > best["rsum"]
        if improved:
            best = {"rsum": rsum, "epoch": epoch + 1}
            stale_epochs = 0
            save_checkpoint(best_path, payload(epoch + 1, 0, eval_model, resumable=False))
        else:
            stale_epochs += 1
        if (lc.contrastive == "sh_mh" and contrastive_name == "sh" and lc.curriculum_patience > 0
                and stale_epochs >= lc.curriculum_patience):
            contrastive_name, stale_epochs = "mh", 0
            contrastive = build_contrastive_loss("mh", tau=lc.tau, margin=lc.margin, epsilon=lc.ifm_epsilon)
            log.info("curriculum: val stopped improving, switching sum-of-hinges → max-of-hinges")
        save_checkpoint(ckpt_path, payload(epoch + 1, 0, model))
        save_trace()
        log.info("epoch %d/%d: %.1fs, loss %.4f, val rsum %.1f%s", epoch + 1, tc.epochs, secs,
                 sums["loss"] / max(1, n_steps), rsum, " (best)" if improved else "")
    return RunResult(run_dir=run_dir, best_rsum=best["rsum"], best_epoch=best["epoch"], epochs=tc.epochs,
                     seconds=time.time() - t_start)
