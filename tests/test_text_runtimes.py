"""Query encoder runtimes for a frozen sentence-transformers tower (training/models/text_runtimes.py):
the same embeddings as the torch reference, exported once, refused where they cannot run, and a
served model's queries are not remembered by the model (only the service's LRU caches them)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from search.encoding import QueryEncoder
from training.config import ModelConfig
from training.models import text_runtimes as tr
from training.models.runtimes import RuntimeUnavailable, installed
from training.models.text_encoder import SBERTTextEncoder
from training.targets import load_sentence_model

TEXTS = ["a dog runs through the tall grass", "two children play on a red slide at the park",
         "a man in a wetsuit surfs a big wave", "people", "a black and white dog jumps over a log " * 3]


@pytest.fixture(scope="module")
def st():
    return load_sentence_model("").eval()  # the packaged all-MiniLM-L6-v2


def fp32_reference(st, texts) -> torch.Tensor:
    with torch.no_grad():
        return st.encode(texts, convert_to_tensor=True, show_progress_bar=False).float()


def cosines(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.cosine_similarity(a, b).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["onnxruntime", "openvino"])
def test_fp32_runtimes_give_the_torch_embeddings(st, name, tmp_path, monkeypatch):
    if not installed(name):
        pytest.skip(f"{name} not installed")
    monkeypatch.setattr(tr, "cpu_bf16_fast", lambda: False)  # fp32 everywhere: compare at fp32 precision
    rt = tr.SentenceRuntime(st, name, cache_dir=tmp_path)
    assert rt.name == name and rt.precision == "fp32"
    got = rt(TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == torch.float32
    assert cosines(got, fp32_reference(st, TEXTS)).min() >= 0.99999
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)  # the model's Normalize


def test_openvino_bf16_is_as_close_as_torchs_bf16_path(st, tmp_path):
    if not (installed("openvino") and tr.cpu_bf16_fast()):
        pytest.skip("needs OpenVINO and a CPU with native bf16")
    ref = fp32_reference(st, TEXTS)
    ov = tr.SentenceRuntime(st, "openvino", cache_dir=tmp_path)
    assert ov.precision == "bf16"
    torch_bf16 = tr.torch_sentence_embeddings(st, TEXTS)
    assert cosines(ov(TEXTS), ref).min() >= 0.999 and cosines(torch_bf16, ref).min() >= 0.999


@pytest.mark.slow
def test_the_graph_is_exported_once_and_whole(st, tmp_path, monkeypatch):
    if not installed("onnxruntime"):
        pytest.skip("onnxruntime not installed")
    path = tr.export_sentence_onnx(st, tmp_path)
    assert path.parent == tmp_path / "engines" and path.stat().st_size > 1_000_000
    # no temp file left beside it: the engine and the record of its digest (checked before it is loaded)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".sha256"]
    calls = []
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: calls.append(a))
    assert tr.export_sentence_onnx(st, tmp_path) == path and tr.SentenceRuntime(st, "onnxruntime", cache_dir=tmp_path)
    assert calls == []


class _Pipeline(list):
    """A sentence-transformers pipeline's modules, and where the model is."""

    device = torch.device("cpu")


def fake_pipeline(*kinds: str, pooling: str = "mean", device: str = "cpu") -> list:
    mods = _Pipeline()
    for k in kinds:
        attrs = {"pooling_mode": pooling} if k == "Pooling" else {"auto_model": object()} if k == "Transformer" else {}
        mods.append(type(k, (), attrs)())
    mods.device = torch.device(device)
    return mods


def test_only_transformer_mean_pooling_pipelines_are_exported():
    assert tr.exportable(fake_pipeline("Transformer", "Pooling", "Normalize")) is None
    assert tr.exportable(fake_pipeline("Transformer", "Pooling")) is None
    assert "cls pooling" in tr.exportable(fake_pipeline("Transformer", "Pooling", pooling="cls"))
    why = tr.exportable(fake_pipeline("WordEmbeddings", "Pooling"))  # the Flickr-clean glove-mean model
    assert "WordEmbeddings → Pooling" in why


def test_auto_falls_back_to_torch_and_a_named_runtime_is_refused(monkeypatch):
    glove_like = fake_pipeline("WordEmbeddings", "Pooling")
    assert tr.resolve_text_runtime("auto", glove_like)[0] == "torch"
    with pytest.raises(RuntimeUnavailable, match="WordEmbeddings"):
        tr.resolve_text_runtime("openvino", glove_like)
    with pytest.raises(RuntimeUnavailable, match="choose one of"):
        tr.resolve_text_runtime("tensorrt", glove_like)
    minilm_like = fake_pipeline("Transformer", "Pooling", "Normalize")
    on_gpu = fake_pipeline("Transformer", "Pooling", "Normalize", device="cuda")
    assert tr.resolve_text_runtime("auto", on_gpu) == ("torch", "the model runs on cuda")
    monkeypatch.setattr(tr, "installed", lambda name: False)
    assert tr.resolve_text_runtime("auto", minilm_like)[0] == "torch"
    with pytest.raises(RuntimeUnavailable, match="not installed"):
        tr.resolve_text_runtime("onnxruntime", minilm_like)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["torch", "auto", "int8"])
def test_served_queries_match_the_model_and_are_not_remembered_by_it(runtime):
    """The query path of a frozen-tower model equals the model's own text encoder, and leaves the model's
    frozen-embedding memory alone: before, every query stayed there, a second cache that `--no-text-cache`
    did not switch off (bench/api_load.py's sequential row read it)."""
    torch.manual_seed(0)
    text = SBERTTextEncoder("", ModelConfig(embed_dim=32, sbert_train_layers=0)).eval()
    entry = SimpleNamespace(name="m", model=SimpleNamespace(text=text, device=torch.device("cpu")))
    quantize = runtime == "int8"  # int8 weights cannot take bf16 inputs: that path runs in fp32
    enc = QueryEncoder(cache_size=0, batching=False, runtime="auto" if quantize else runtime, quantize=quantize)
    enc.attach(entry)
    got = torch.from_numpy(np.stack([enc.encode(entry, t) for t in TEXTS] + [enc.encode(entry, TEXTS[0])]))
    assert text._memory == {}
    auto = tr.resolve_text_runtime("auto", text.st)[0]
    assert enc.info()["runtimes"]["m"]["runtime"] == ("torch" if runtime in ("torch", "int8") else auto)
    with torch.no_grad():
        ref = text(text.prepare(TEXTS + TEXTS[:1]))
    # bf16-level agreement at worst; int8 weights are approximate (BENCHMARKS.md, "Query encoder runtimes")
    assert cosines(got, ref).min() >= (0.8 if quantize else 0.999)


def test_the_runtime_bench_counts_cpu_time_per_query(monkeypatch):
    """bench/text_runtimes.py: wall ms per call and process CPU ms per query (what an engine that spins
    costs a server), and the CPU column in the written table. The clocks are the test's: an encoder call
    takes 3 ms of wall time and 2 ms of CPU, whatever the batch, so the answer is exact."""
    from types import SimpleNamespace as NS

    from bench import text_runtimes as bench

    clock = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(bench, "time", NS(perf_counter=lambda: clock["wall"], process_time=lambda: clock["cpu"]))

    class Busy:  # 3 ms of wall and 2 ms of CPU per call
        def prepare(self, texts):
            return texts

        def __call__(self, batch):
            clock["wall"] += 0.003
            clock["cpu"] += 0.002
            return torch.zeros(len(batch), 4)

    wall, cpu = bench.ms_per_batch(Busy(), [f"t{i}" for i in range(64)], bs=8, n=5)
    assert wall == pytest.approx(3.0) and cpu == pytest.approx(0.25)  # 2 ms over 8 queries: 0.25 CPU ms each
    r = {"timing": {"torch fp32": {8: 2.0}, "openvino bf16, 2 threads": {8: 1.0}},
         "cpu": {"torch fp32": 0.25, "openvino bf16, 2 threads": 0.31},
         "quality": {n: {"cos_min": 1.0, "cos_mean": 1.0, "rsum": 100.0} for n in ("torch fp32", "openvino bf16, 2 threads")},
         "n_texts": 64, "n_images": 8}
    table = bench.render(r, NS(batches=[8], rounds=1, index="ix"), "cmd", 0.0)
    assert "CPU ms / query at 8" in table and "| openvino bf16, 2 threads | 1.00 | 2.00× | 0.31 |" in table
