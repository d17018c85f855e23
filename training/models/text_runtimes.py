"""Inference runtimes for a frozen sentence-transformers caption tower (the query encoder of a served model).

A served model whose caption encoder is a *frozen* sentence-transformers model (``text_encoder: sbert``,
``sbert_train_layers: 0``; the Flickr8k demo's models) spends three quarters of a search request in that
transformer (BENCHMARKS.md, "REST API load"). Its weights are the published model's, so the transformer
and its pooling can be exported once to ONNX and run by a faster engine; the trained projection head
stays in torch. Runtimes:

- ``torch``: ``SentenceTransformer.encode`` (bf16 autocast on a CPU with native bf16), the reference;
- ``onnxruntime``: ONNX Runtime, fp32 (agrees with torch's fp32 path to cosine ≥ 0.99999);
- ``openvino``: OpenVINO, fp32, or bf16 on a CPU with native bf16 (the same level of difference from
  fp32 as torch's bf16 autocast: cosine ≈ 0.99998).

``auto`` (the default of ``ltd serve``) picks by measurement (BENCHMARKS.md, "Query encoder runtimes"):
on CUDA ``torch``; on a CPU with native bf16 ``openvino`` when installed (about 2× torch's bf16 path at
batches of 8–16 on a 2-core Xeon with AMX); otherwise ``onnxruntime`` when installed (3× torch at one
query, level at 8), else ``torch``. Only the pipeline Transformer → mean Pooling → (Normalize) is
exported; any other pipeline (e.g. the Flickr-clean ``glove-mean`` model) stays on torch, and says so.
The ONNX file is written once, atomically, under ``CACHE/engines/``, keyed by a digest of the weights,
the sequence limit and the torch version; nothing is downloaded.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from training.choices import TextRuntime, names
from training.models.backbones import cpu_bf16_fast
from training.models.runtimes import (
    RuntimeUnavailable,
    compile_openvino,
    import_openvino,
    installed,
    onnx_once,
    ort_session,
    weights_digest,
)

log = logging.getLogger(__name__)

TEXT_RUNTIMES = names(TextRuntime)
INPUTS = ("input_ids", "attention_mask")
SEQ_BUCKET = 8      # OpenVINO: token lengths rounded up to a multiple of this (see ``padded``)
WARM_BATCH = 16     # … and every batch size up to this at every bucket up to WARM_TOKENS, run once at load
WARM_TOKENS = 48    # (Flickr8k's test captions: at most 37 MiniLM word pieces)


def exportable(st) -> str | None:
    """Why the sentence model ``st`` cannot be exported (None when it can): only Transformer → mean
    Pooling → optional Normalize, the layout of all-MiniLM-L6-v2 and all-mpnet-base-v2."""
    kinds = [type(m).__name__ for m in st]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return f"pipeline {' → '.join(kinds)} (only Transformer → Pooling → Normalize is exported)"
    pooling = st[1]
    mode = getattr(pooling, "pooling_mode", None) or pooling.get_pooling_mode_str()
    if mode != "mean":
        return f"{mode} pooling (only mean pooling is exported)"
    if getattr(st[0], "auto_model", None) is None:
        return "no transformer module"
    return None


def tokens(st, texts: list[str]) -> dict:
    """The model's own tokenisation (its tokenizer and sequence limit): ``preprocess`` in
    sentence-transformers ≥ 6, ``tokenize`` before."""
    return (st.preprocess if hasattr(st, "preprocess") else st.tokenize)(texts)


class MeanPooled(nn.Module):
    """The exported graph: the transformer's last hidden states, averaged over the real tokens."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp_min(1e-9)


def export_sentence_onnx(st, cache_dir: str | Path = "") -> Path:
    """The sentence model's transformer + mean pooling as ONNX (batch and length dynamic), once."""
    graph = MeanPooled(st[0].auto_model).eval()
    example = tokens(st, ["a dog runs on the grass", "two people"])
    axes = {k: {0: "batch", 1: "tokens"} for k in INPUTS} | {"y": {0: "batch"}}
    return onnx_once(f"sentence_{weights_digest(graph)}_len{st.max_seq_length}", graph, tuple(example[k] for k in INPUTS),
                     list(INPUTS), axes, cache_dir, "the caption encoder")


def _onnxruntime(path: Path, threads: int) -> Callable[[dict], np.ndarray]:
    # no busy-waiting between calls: in a server the request threads need those cores (OMP_WAIT_POLICY=PASSIVE
    # for torch, likewise); alone it costs ~1.4 ms at one query, nothing at 8+ (measured on the 2-core Xeon)
    sess = ort_session(path, spinning=False, threads=threads)
    return lambda feed: sess.run(None, feed)[0]


def _openvino(path: Path, threads: int, bf16: bool) -> Callable[[dict], np.ndarray]:
    ov = import_openvino()
    core = ov.Core()
    # LATENCY: one stream: queries arrive as one (micro-)batch from one batcher thread. Not pinned to cores:
    # pinned, the encoder's thread waits for its core while the event loop or a request thread runs there
    compiled = compile_openvino(core, core.read_model(str(path)), {
        "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32", "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False})
    out = compiled.output(0)
    local = threading.local()  # an infer request serves one call at a time: one per calling thread

    def run(feed: dict) -> np.ndarray:
        request = getattr(local, "request", None)
        if request is None:
            request = local.request = compiled.create_infer_request()
        request.infer(padded(feed))
        return np.array(request.get_tensor(out).data, copy=True)

    started = time.perf_counter()
    for tokens_ in range(SEQ_BUCKET, WARM_TOKENS + 1, SEQ_BUCKET):
        for batch in range(1, WARM_BATCH + 1):
            run({k: np.ones((batch, tokens_), np.int64) for k in INPUTS})
    log.info("OpenVINO caption encoder warmed for %d shapes in %.1f s", WARM_BATCH * WARM_TOKENS // SEQ_BUCKET,
             time.perf_counter() - started)
    return run


def padded(feed: dict) -> dict:
    """Token arrays padded (attention 0) to a multiple of SEQ_BUCKET columns. OpenVINO's CPU plugin prepares
    its kernels per input shape: a shape seen for the first time costs about 2× (+10–15 ms at a batch of
    8 on the 2-core Xeon), and free-length captions × batch sizes would keep producing new ones. The
    padding is masked out of attention and of the mean pooling: the embeddings do not change."""
    n = feed["input_ids"].shape[1]
    extra = -n % SEQ_BUCKET
    if not extra:
        return feed
    return {k: np.pad(v, ((0, 0), (0, extra))) for k, v in feed.items()}  # mask 0 there: the ids do not matter


def resolve_text_runtime(name: str, st) -> tuple[str, str]:
    """(runtime, why) for ``name`` running the sentence model ``st`` where it is (``st.device``). ``auto``
    falls back to torch with the reason; a runtime asked for by name that cannot run raises
    RuntimeUnavailable."""
    if name not in TEXT_RUNTIMES:
        raise RuntimeUnavailable(f"text runtime {name!r}: choose one of {', '.join(TEXT_RUNTIMES)}")
    if name == "torch":
        return "torch", "asked for"
    reason = exportable(st)
    if st.device.type != "cpu":
        reason = reason or f"the model runs on {st.device.type}"
    if name != "auto":
        if reason:
            raise RuntimeUnavailable(f"text runtime {name}: {reason}")
        if not installed(name):
            raise RuntimeUnavailable(f"text runtime {name} is not installed (pip install '.[fast]')")
        return name, "asked for"
    if reason:
        return "torch", reason
    if cpu_bf16_fast() and installed("openvino"):
        return "openvino", "CPU with native bf16"
    for candidate in ("onnxruntime", "openvino"):
        if installed(candidate):
            return candidate, "installed"
    return "torch", "neither onnxruntime nor openvino is installed"


class SentenceRuntime:
    """texts → (n, D) float32 sentence embeddings of a frozen sentence-transformers model, with one runtime.

    Unlike ``SBERTTextEncoder.prepare`` it remembers nothing: a server's query cache is the service's
    bounded LRU, switchable, and counted in /metrics."""

    def __init__(self, st, name: str = "auto", *, cache_dir: str | Path = "", bf16: bool = True, threads: int = 0):
        """``bf16=False`` keeps torch's path in fp32 (an int8-quantised tower cannot take bf16 inputs);
        ``threads``: of the ONNX Runtime / OpenVINO engine (0: torch's thread count)."""
        self.st = st
        self.device = next(st.parameters()).device
        self.name, self.why = resolve_text_runtime(name, st)
        self.normalize = type(st[-1]).__name__ == "Normalize"
        self._run: Callable[[dict], np.ndarray] | None = None
        self.bf16, self.threads = False, 0  # threads: the engine's (0 for torch's own path)
        if self.name != "torch":
            path = export_sentence_onnx(st, cache_dir)
            threads = threads or max(1, torch.get_num_threads())
            ov_bf16 = self.name == "openvino" and cpu_bf16_fast()
            self._run = _onnxruntime(path, threads) if self.name == "onnxruntime" else _openvino(path, threads, ov_bf16)
            self.threads = threads
            self.precision = "bf16" if ov_bf16 else "fp32"
        else:
            self.bf16 = bf16 and self.device.type == "cpu" and cpu_bf16_fast()
            self.precision = "bf16" if self.bf16 else "fp32"

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        texts = list(texts)
        if self._run is None:
            return torch_sentence_embeddings(self.st, texts, bf16=self.bf16)
        feed = tokens(self.st, texts)
        y = torch.from_numpy(self._run({k: feed[k].numpy().astype(np.int64, copy=False) for k in INPUTS}))
        return nn.functional.normalize(y, dim=-1) if self.normalize else y


@torch.no_grad()
def torch_sentence_embeddings(st, texts: list[str], bf16: bool = True) -> torch.Tensor:
    """The reference: ``st.encode`` on its device, bf16 autocast on a CPU with native bf16 (unless ``bf16``
    is False)."""
    dev = next(st.parameters()).device
    ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if bf16 and dev.type == "cpu" and cpu_bf16_fast()
           else torch.autocast(dev.type, enabled=False))
    with ctx:
        return st.encode(texts, batch_size=64, convert_to_tensor=True, show_progress_bar=False).float().cpu()
