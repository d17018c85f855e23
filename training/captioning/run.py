"""What a captioner run holds between its steps (:class:`CaptionRun`), in a module of its own so that
``loop.py`` (which builds it) and ``steps.py`` (whose steps take it) both import it at their top
without importing each other."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from training import distributed
from training.captioning.checkpoint import CaptionProgress
from training.captioning.config import CaptionConfig
from training.captioning.data import CaptionData
from training.captioning.decoding import Specials
from training.captioning.model import TopDownCaptioner
from training.captioning.negatives import NegativeSampler
from training.captioning.retrieval_reward import Judge
from training.captioning.scst import SelfRetrievalReward
from training.metrics_log import MetricsLog


@dataclass
class CaptionRun:
    """What a captioner run holds between its steps: the set-up, and where it stands (``at``)."""

    cfg: CaptionConfig
    data: CaptionData
    run_dir: Path
    device: torch.device
    model: TopDownCaptioner
    optimizer: torch.optim.Optimizer  # the current stage's (each stage starts its own)
    judge: Judge | None  # the frozen retrieval model of the self-retrieval reward (train.retrieval)
    reward: SelfRetrievalReward
    specials: Specials  # the vocabulary's special ids, for sampling
    at: CaptionProgress = field(default_factory=CaptionProgress)
    mlog: MetricsLog = field(default_factory=lambda: MetricsLog(None, None))  # a run built by hand logs nowhere
    rank: distributed.Rank = field(default_factory=distributed.Rank)  # this process's place (rank 0 of 1 alone)
    negatives: NegativeSampler | None = None  # SR-PL's unlabelled negatives (:func:`set_up_negatives`)
    pool_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # their dataset rows
