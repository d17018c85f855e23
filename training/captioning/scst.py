"""Self-critical sequence training (Rennie et al. 2017) with the self-retrieval reward (Liu et al. 2018).

The paper draws one sample per image and uses the reward of the greedy caption of the same image as
the baseline, so the advantage is r(sample) − r(greedy) and no value network is needed. With
``samples`` K ≥ 2 per image the baseline can instead be the mean reward of the image's other K − 1
samples (``mean_of_others``; Luo 2020, "A better variant of self-critical sequence training"): still
independent of the sample it is subtracted from, so the gradient stays unbiased, and no greedy
decoding is needed. The loss is REINFORCE's
−(r − b) · Σ_t log π(w_t), averaged over the sampled tokens (<eos> included), as the self-critical
code does.

Reward per caption: ``cider_weight`` · CIDEr-D (labelled images only; with ``cider_eos`` the end token
counts as a word, as in the self-critical reference code: ``training/captioning/cider.py``) + ``alpha`` · r_ret, with
r_ret = −L_ret of the caption as a query against all images of the batch (labelled and unlabelled),
plus ``distractors`` random training images that take part in the retrieval reward only (a small
batch of images with several samples each keeps a judge's candidate pool as large as the paper's
batch).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from training.captioning.cider import CiderD, lengths_with_end
from training.captioning.retrieval_reward import Judge, retrieval_loss
from training.captioning.vocab import sequence_lengths


def scst_loss(logprobs: torch.Tensor, mask: torch.Tensor, reward: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a baseline: −Σ (r − b) log π(w_t) over the masked tokens / number of tokens."""
    adv = (reward - baseline).detach().to(logprobs.dtype)
    m = mask.to(logprobs.dtype)
    return -(adv[:, None] * logprobs * m).sum() / m.sum().clamp_min(1.0)


def mean_of_others(reward: torch.Tensor, k: int) -> torch.Tensor:
    """Baseline for K block-major samples per image (``reward`` (K·n,), block j holds sample j of every
    image): for each sample, the mean reward of the same image's other K − 1 samples."""
    if k < 2:
        raise ValueError("the mean-of-others baseline needs at least 2 samples per image")
    r = reward.reshape(k, -1)
    return ((r.sum(0, keepdim=True) - r) / (k - 1)).reshape(-1)


@dataclass
class RewardTerms:
    total: torch.Tensor  # (B,)
    cider: torch.Tensor  # (B,) 0 for unlabelled images
    r_ret: torch.Tensor  # (B,) 0 when there is no judge


@dataclass(frozen=True)
class RewardSpec:
    """How :class:`SelfRetrievalReward` weighs and computes its terms (the ``scst`` settings): r =
    ``cider_weight`` · CIDEr-D + ``alpha`` · r_ret, with r_ret = −L_ret (``retrieval_loss``: a kind of
    :func:`retrieval_loss`, with its ``margin`` and temperature ``tau``); ``cider_eos``: score a caption's
    emitted <eos> as a word (the CIDEr references must then end in <eos> too: ``cider.with_end``)."""

    cider_weight: float = 1.0
    alpha: float = 0.0
    retrieval_loss: str = "vse_max"
    margin: float = 0.2
    tau: float = 0.1
    cider_eos: bool = False


class SelfRetrievalReward:
    """r(c) for the captions of a batch: CIDEr-D against the references of labelled images plus the
    judge's retrieval reward among the batch's images."""

    def __init__(self, cider: CiderD | None, judge: Judge | None, *, eos_id: int, spec: RewardSpec | None = None):
        """``spec``: the terms' weights and the retrieval loss (None: the defaults of :class:`RewardSpec`,
        CIDEr-D alone)."""
        spec = spec if spec is not None else RewardSpec()
        if spec.alpha > 0 and judge is None:
            raise ValueError("a retrieval reward (alpha > 0) needs a judge")
        self.cider, self.judge, self.eos_id, self.cider_eos = cider, judge, eos_id, spec.cider_eos
        self.cider_weight, self.alpha, self.loss_kind = spec.cider_weight, spec.alpha, spec.retrieval_loss
        self.margin, self.tau = spec.margin, spec.tau

    @property
    def uses_judge(self) -> bool:
        """Whether the reward has a retrieval term (and so reads candidate images at all)."""
        return self.judge is not None and self.alpha > 0

    def __call__(self, ids: torch.Tensor, image_rows: np.ndarray, cider_refs: np.ndarray,
                 distractor_rows: np.ndarray | None = None) -> RewardTerms:
        """``ids`` (Q, L) captions; ``image_rows`` (B,) dataset rows of the batch images, and the
        captions are ``k = Q / B`` blocks of B (e.g. samples then greedy), block-row i for image i;
        ``cider_refs`` (B,): each image's index in the CIDEr references, −1 for unlabelled images;
        ``distractor_rows``: more candidate images for the retrieval reward only (no captions)."""
        q, b = ids.shape[0], len(image_rows)
        lengths = sequence_lengths(ids, self.eos_id)
        img = np.tile(np.arange(b), q // b)
        cider = torch.zeros(q)
        refs = np.tile(cider_refs, q // b)
        lab = refs >= 0
        if self.cider is not None and self.cider_weight > 0 and lab.any():
            arr, n_tok = ids.cpu().numpy(), lengths.cpu().numpy()
            if self.cider_eos:
                n_tok = lengths_with_end(arr, n_tok)
            scores = self.cider.score(arr[lab], refs[lab], n_tok[lab])
            cider[torch.from_numpy(lab)] = torch.from_numpy(scores).float()
        r_ret = torch.zeros(q)
        if self.uses_judge:
            emb = self.judge.embed_ids(ids, lengths)
            cand = image_rows if distractor_rows is None else np.concatenate([image_rows, distractor_rows])
            sims = self.judge.similarities(emb, torch.as_tensor(cand))
            r_ret = -retrieval_loss(sims, torch.as_tensor(img), self.loss_kind, margin=self.margin, tau=self.tau)
        return RewardTerms(self.cider_weight * cider + self.alpha * r_ret, cider, r_ret)
