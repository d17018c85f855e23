"""Every named choice of the configs, defined once as a ``Literal`` type.

The config sections use these types (so a bad value is refused with the list of valid ones), and the
code that dispatches on a choice reads its list from here with :func:`names` (the loss factory, the
λ combiner, the backbone builder), so a new choice is added in one place.
"""
from __future__ import annotations

from typing import Any, Literal, get_args

# ---- retrieval model (ModelConfig) ----
Backbone = Literal["efficientnet_lite0", "resnet50", "resnet152", "precomputed", "clip"]  # clip: model.clip_path
ImageFeatures = Literal["pooled", "fne", "grid"]  # last block | full-network embedding | grid cells (regions)
ImageEncoder = Literal["head", "vsrn", "tern"]
Head = Literal["mlp", "linear"]
TextEncoder = Literal["gru", "sbert", "tern", "clip"]
TextPool = Literal["mean", "max"]
Crops = Literal[1, 2, 10]  # centre | centre + flip | ten-crop

# ---- retrieval losses (LossConfig) ----
ContrastiveLoss = Literal["infonce", "triplet", "mh", "sh", "ifm", "order"]  # what the loss factory builds
Contrastive = Literal[ContrastiveLoss, "sh_mh"]  # the config adds the sh → mh curriculum
Similarity = Literal["cosine", "order"]
CombineMode = Literal["none", "dual", "constraint", "replay"]
Decoder = Literal["ltd", "itd"]
ItdReduction = Literal["mean", "sum"]
LtdSide = Literal["text", "image", "both"]
LtdTargets = Literal["caption", "shuffled", "same_image"]

# ---- optimisation and running ----
Optimizer = Literal["adam", "adamw"]
Schedule = Literal["cosine", "constant"]
Device = Literal["auto", "cpu", "cuda"]
CpuAmp = Literal["fp32", "bf16", "auto"]
AmpDtype = Literal["fp16", "bf16"]

# ---- captioning (CaptionConfig) ----
RetrievalLoss = Literal["vse_max", "vse_sum", "softmax"]
Negatives = Literal["moderate", "random", "hardest", "none"]
SamplingNegatives = Literal["moderate", "random", "hardest"]  # "none" keeps the unlabelled images out
ScstBaseline = Literal["greedy", "mean"]

# ---- serving ----
VerifyIndex = Literal["hash", "counts"]
TextRuntime = Literal["auto", "torch", "onnxruntime", "openvino"]  # a frozen sentence-transformers query tower


def names(choice: Any) -> tuple:
    """The values of a ``Literal`` choice, in order: ``names(CombineMode)`` → ("none", "dual", …)."""
    return get_args(choice)
