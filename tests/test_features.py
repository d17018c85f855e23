"""Frozen-backbone feature cache: exact features, resume, bad files skipped, transform bugs fatal."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from training.data.images import Preprocess
from training.features import DONE, FAILED, TODO, ExtractionSpec, extract_features, lookup_features
from training.models.backbones import Backbone


class MeanColour(Backbone):
    """A tiny deterministic 'CNN': per-channel mean and max of the crop."""

    def __init__(self):
        super().__init__()
        self.name, self.features, self.weights_id, self.out_dim = "mean_colour", "pooled", "none", 6
        self.preprocess = Preprocess(size=16, resize=16)
        self.calls = 0

    def extract(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += len(images)
        return torch.cat([images.mean((2, 3)), images.amax((2, 3))], 1)


def _images(tmp_path, n=6):
    paths = []
    for i in range(n):
        p = tmp_path / f"img{i}.png"
        Image.new("RGB", (20, 24), (40 * i, 255 - 30 * i, 7 * i)).save(p)
        paths.append(p)
    return paths


def _expected(bb: MeanColour, path) -> np.ndarray:
    x = bb.preprocess(Image.open(path).convert("RGB"))[None]
    return bb.extract(x)[0].numpy()


def test_features_match_direct_extraction_and_are_cached(tmp_path):
    paths = _images(tmp_path)
    bb = MeanColour()
    store = extract_features(bb, paths, cache_dir=tmp_path / "cache", spec=ExtractionSpec(batch_size=4, workers=0))
    assert store.features.shape == (6, 1, 6) and not store.failed
    for i, p in enumerate(paths):
        np.testing.assert_allclose(store.features[i, 0], _expected(MeanColour(), p), atol=2e-3)  # float16
    calls = bb.calls
    again = extract_features(bb, paths, cache_dir=tmp_path / "cache", spec=ExtractionSpec(workers=0))
    assert bb.calls == calls and again.key == store.key  # nothing recomputed
    assert lookup_features(bb, paths, cache_dir=tmp_path / "cache").key == store.key
    assert lookup_features(bb, paths[:3], cache_dir=tmp_path / "cache") is None  # another image list


def test_resume_extracts_only_what_is_left(tmp_path):
    paths = _images(tmp_path)
    bb = MeanColour()
    store = extract_features(bb, paths, cache_dir=tmp_path / "c", spec=ExtractionSpec(workers=0))
    status = np.lib.format.open_memmap(store.path / "status.npy", mode="r+")
    status[4:] = TODO  # as if killed after four images
    status.flush()
    assert lookup_features(bb, paths, cache_dir=tmp_path / "c") is None
    bb.calls = 0
    extract_features(bb, paths, cache_dir=tmp_path / "c", spec=ExtractionSpec(workers=0))
    assert bb.calls == 2
    assert (np.load(store.path / "status.npy") == DONE).all()


def test_unreadable_files_are_skipped_and_listed(tmp_path):
    paths = _images(tmp_path, 4)
    (tmp_path / "img1.png").write_bytes(b"not an image")
    paths.append(tmp_path / "missing.jpg")
    store = extract_features(MeanColour(), paths, cache_dir=tmp_path / "c", spec=ExtractionSpec(workers=0))
    assert sorted(store.failed) == [1, 4]
    assert "not a recognised image" in store.failed[1] and "cannot open" in store.failed[4]
    assert (np.load(store.path / "status.npy")[[1, 4]] == FAILED).all()
    assert np.abs(store.features[[0, 2, 3]]).sum() > 0


def test_a_failing_transform_stops_the_run_instead_of_failing_every_image(tmp_path):
    paths = _images(tmp_path, 3)

    def broken(index, view):
        raise OverflowError("bug in the transform")

    with pytest.raises(OverflowError, match="bug in the transform"):
        extract_features(MeanColour(), paths, cache_dir=tmp_path / "c",
                         spec=ExtractionSpec(workers=0, transform=broken, transform_id="broken"))
    store_dirs = list((tmp_path / "c" / "features").iterdir())
    assert len(store_dirs) == 1 and not (store_dirs[0] / "failed.json").exists()


def test_transform_sees_python_int_indices_and_every_view(tmp_path):
    paths = _images(tmp_path, 3)
    seen = []

    def record(index, view):
        seen.append(type(index))
        return view

    extract_features(MeanColour(), paths, cache_dir=tmp_path / "c",
                     spec=ExtractionSpec(n_views=2, workers=0, transform=record, transform_id="record"))
    assert seen == [int] * 6


class _Contention:
    """Makes two threads meet at a cache entry's lock: ``hold()``, called inside the locked work, returns
    only once the other thread is waiting on the lock (training.fsio.exclusive logs that it waits), so the
    second thread provably arrives while the first computes. A start-up stagger let the first finish before
    the second began, and the test then passed without testing anything."""

    def __init__(self):
        import threading

        self.waiting = threading.Event()

    def emit(self, record) -> None:
        if "waiting for it" in record.getMessage():
            self.waiting.set()

    def hold(self) -> None:
        assert self.waiting.wait(30), "the second thread never waited on the lock"


def _side_by_side(run) -> _Contention:
    """``run(0)`` and ``run(1)`` in two threads at once; their work calls ``hold()`` of the returned object."""
    import logging
    import threading

    meet = _Contention()
    handler = logging.Handler()
    handler.emit = meet.emit
    log = logging.getLogger("training.fsio")
    log.addHandler(handler)
    old_level, log.level = log.level, logging.INFO
    try:
        threads = [threading.Thread(target=run, args=(k, meet)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    assert meet.waiting.is_set()
    return meet


def test_concurrent_extractions_of_one_cache_entry_do_the_work_once(tmp_path):
    """`ltd experiment --jobs 2` started two runs that both decoded all 8,000 Flickr8k images into the
    same folder at once. The second must wait for the first and then find nothing left to do."""

    paths = _images(tmp_path, n=12)

    class Held(MeanColour):
        meet = None

        def extract(self, images):
            self.meet.hold()  # until the other thread waits for the folder this one holds
            return super().extract(images)

    backbones, stores = [Held(), Held()], [None, None]

    def run(k, meet):
        backbones[k].meet = meet
        stores[k] = extract_features(backbones[k], paths, cache_dir=tmp_path / "c",
                                     spec=ExtractionSpec(batch_size=2, workers=0))

    _side_by_side(run)
    assert sum(b.calls for b in backbones) == len(paths)  # one of them extracted everything, the other nothing
    np.testing.assert_array_equal(np.asarray(stores[0].features), np.asarray(stores[1].features))
    assert (np.lib.format.open_memmap(stores[0].path / "status.npy", mode="r") == DONE).all()


def test_concurrent_runs_compute_the_ltd_targets_once(tmp_path, monkeypatch):
    """The same for the sentence-encoder targets: two grid runs started together computed the 30,000
    Flickr8k targets of the 420 MB mpnet model side by side. The second must read the first's file."""

    from training import targets

    monkeypatch.setattr(targets, "resolve_sentence_model", lambda path="": tmp_path)
    monkeypatch.setattr(targets, "model_identity", lambda path: {"model": "fake"})
    calls = []

    meets = []

    def fake_compute(texts, path, model_path, out, batch_size, *model_and_truncation):
        calls.append(1)
        meets[0].hold()  # until the other run waits for the targets this one computes
        emb = np.arange(len(texts) * 3, dtype=np.float32).reshape(len(texts), 3)
        targets.save_npy_atomic(out, emb)
        return emb

    monkeypatch.setattr(targets, "_compute", fake_compute)
    results = [None, None]

    def run(k, meet):
        meets[:] = [meet]
        results[k] = targets.compute_targets(["a dog", "two cats"], cache_dir=str(tmp_path / "c"))

    _side_by_side(run)
    assert len(calls) == 1
    np.testing.assert_array_equal(results[0], results[1])


@pytest.fixture(scope="module")
def frozen_minilm():
    """Two frozen all-MiniLM-L6-v2 caption encoders (the packaged model): 40-word and 5-word truncation."""
    from training.config import ModelConfig
    from training.models.text_encoder import SBERTTextEncoder
    from training.targets import resolve_sentence_model

    path, shape = str(resolve_sentence_model("")), ModelConfig(embed_dim=8, sbert_train_layers=0, text_head="linear")
    return lambda cache, max_len=40: SBERTTextEncoder(path, shape, max_len=max_len, cache_dir=str(cache))


@pytest.mark.slow
def test_frozen_caption_encoder_embeds_a_corpus_once_across_runs(tmp_path, frozen_minilm, monkeypatch):
    """A corpus (val/test split, an index's captions) goes through the disk cache: a second encoder (the
    next run) reads it without running the model and gets the embeddings the model gives; queries (fewer
    than CORPUS_MIN new texts) never write a file; the truncation is part of the key."""
    from training.models import text_encoder

    corpus = [f"{i} dogs run across a field number {i % 7}" for i in range(text_encoder.CORPUS_MIN + 10)]
    first = frozen_minilm(tmp_path)
    first.embed_corpus(corpus[:20])  # a query-sized batch: memory only
    assert not (tmp_path / "targets").exists()
    first.embed_corpus(corpus + corpus[:5])  # duplicates embedded once
    files = sorted((tmp_path / "targets").glob("*.npy"))
    assert len(files) == 1 and np.load(files[0]).shape[0] == len(corpus)
    direct = frozen_minilm(tmp_path / "other")._frozen_embeddings(corpus[:64])  # the model, no cache
    second = frozen_minilm(tmp_path)
    monkeypatch.setattr(second.st, "encode", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-encoded")))
    second.embed_corpus(corpus)
    cached = second._frozen_embeddings(corpus[:64])
    cos = torch.nn.functional.cosine_similarity(cached, direct)
    assert cos.min() > 0.999
    short = frozen_minilm(tmp_path, max_len=5)  # truncates at 12 word pieces: its own cache entry
    short.embed_corpus(corpus)
    assert len(list((tmp_path / "targets").glob("*.npy"))) == 2


def test_frozen_memory_bound_keeps_the_batch_whole(tmp_path, frozen_minilm, monkeypatch):
    """Reaching the memory bound clears the memory; the batch that reached it is still returned whole."""
    from training.models import text_encoder

    enc = frozen_minilm(tmp_path)
    monkeypatch.setattr(text_encoder, "MEMORY_MAX", 3)
    a = enc._frozen_embeddings(["a cat", "a dog"])
    b = enc._frozen_embeddings(["a cat", "a bird", "a horse"])  # "a cat" was remembered; 2 new reach the bound
    assert b.shape[0] == 3
    torch.testing.assert_close(b[0], a[0])
