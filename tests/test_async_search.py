"""The event-loop path of text search (``SearchService.search_text_async``, what POST /api/search/text runs):
the same answers as ``search_text``; the loop keeps running while the encoder works (on the batcher
thread, never the loop's); errors reach the caller and the next query is served; the query cache is
used; and the server-process settings that came with it (engine threads, frozen garbage collector)."""
from __future__ import annotations

import asyncio
import gc
import threading
import time

import numpy as np
import pytest
import torch

from search.encoding import serving_threads
from search.errors import BadRequest
from tests.conftest import pair_settings


def same_hits(a, b) -> None:
    assert [h.id for h in a.hits] == [h.id for h in b.hits]
    np.testing.assert_allclose([h.score for h in a.hits], [h.score for h in b.hits], rtol=0, atol=1e-6)
    assert (a.query, a.ground_truth_ids, a.metrics, a.cutoffs) == (b.query, b.ground_truth_ids, b.metrics, b.cutoffs)


@pytest.mark.parametrize("batching", [True, False])
def test_async_search_answers_as_the_thread_path(tiny_index_pair, batching):
    svc = pair_settings(tiny_index_pair, text_batching=batching, text_cache=0).search_service()
    svc.registry.load()
    try:
        for query in ("a red circle", "  two   blue squares "):
            for k in (1, 5):
                same_hits(asyncio.run(svc.search_text_async("ltd", query=query, k=k)), svc.search_text("ltd", query=query, k=k))
        cid = svc.registry.get("bl").index.captions.ids[3]
        same_hits(asyncio.run(svc.search_text_async("bl", caption_id=cid, k=5)), svc.search_text("bl", caption_id=cid, k=5))
        with pytest.raises(BadRequest):
            asyncio.run(svc.search_text_async("ltd", query=" \t ", k=5))
        with pytest.raises(BadRequest):
            asyncio.run(svc.search_text_async("ltd", query="a dog", k=0))
    finally:
        svc.close()


class SlowEncoder:
    """Wraps QueryEncoder.encode_batch: records the thread of each call, sleeps, and fails on ``fail_on``."""

    def __init__(self, encode_batch, delay: float = 0.3, fail_on: str = ""):
        self.encode_batch, self.delay, self.fail_on = encode_batch, delay, fail_on
        self.threads: list[str] = []

    def __call__(self, entry, texts):
        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay)
        if self.fail_on in texts:
            raise ValueError(f"cannot encode {self.fail_on}")
        return self.encode_batch(entry, texts)


def test_the_loop_runs_while_the_encoder_works_and_errors_reach_the_caller(tiny_index_pair):
    svc = pair_settings(tiny_index_pair, text_cache=16).search_service()
    svc.registry.load()
    slow = SlowEncoder(svc.encoder.encode_batch, fail_on="a broken query")
    svc.encoder.encode_batch = slow
    try:
        async def scenario():
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            t = asyncio.create_task(ticker())
            loop_thread = threading.current_thread().name
            t0 = time.perf_counter()
            first = await svc.search_text_async("ltd", query="a red circle", k=3)
            took = time.perf_counter() - t0
            with pytest.raises(ValueError, match="cannot encode"):
                await svc.search_text_async("ltd", query="a broken query", k=3)
            again = await svc.search_text_async("ltd", query="a green triangle", k=3)  # served after the error
            t.cancel()
            return first, again, ticks, took, loop_thread

        first, again, ticks, took, loop_thread = asyncio.run(scenario())
        assert took >= slow.delay and ticks >= 20  # ~0.9 s of encoding: the loop kept ticking every 10 ms
        assert slow.threads and all(name.startswith("ltd-text-batcher") for name in slow.threads)
        assert loop_thread not in slow.threads
        assert len(first.hits) == 3 and len(again.hits) == 3
        calls = len(slow.threads)
        hits = svc.encoder.hits
        cached = asyncio.run(svc.search_text_async("ltd", query="a red circle", k=3))  # from the query cache
        assert len(slow.threads) == calls and svc.encoder.hits == hits + 1
        same_hits(cached, first)
    finally:
        svc.close()


def test_many_concurrent_async_queries_are_batched_and_each_gets_its_own_answer(tiny_index_pair):
    svc = pair_settings(tiny_index_pair, text_cache=0).search_service()
    svc.registry.load()
    queries = [f"{n} {c} {s}" for n in ("one", "two") for c in ("red", "blue", "green") for s in ("circles", "squares")]
    try:
        want = {q: svc.search_text("ltd", query=q, k=4) for q in queries}
        calls0 = svc.encoder.info()["encoder_calls"]

        async def all_at_once():
            return await asyncio.gather(*(svc.search_text_async("ltd", query=q, k=4) for q in queries))

        got = asyncio.run(all_at_once())
        for q, r in zip(queries, got, strict=True):
            same_hits(r, want[q])
        assert svc.encoder.info()["encoder_calls"] - calls0 < len(queries)  # at least some went together
    finally:
        svc.close()


def test_serving_threads_leave_a_core_for_the_request_path():
    assert serving_threads(3) == 3
    assert serving_threads(0) == max(1, torch.get_num_threads() - 1)


def test_freeze_when_loaded_freezes_once_the_models_are_in(pair_service):
    from app.api.main import freeze_when_loaded

    assert pair_service.registry.ready.is_set()
    try:
        freeze_when_loaded(pair_service)
        t0 = time.monotonic()
        while gc.get_freeze_count() == 0:
            assert time.monotonic() - t0 < 30
            time.sleep(0.01)
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("limit, on_loop", [(1 << 21, True), (0, False)])
def test_a_large_side_is_ranked_off_the_loop(pair_service, monkeypatch, limit, on_loop):
    import search.service as service_module

    threads = []
    real_rank = service_module.rank

    def recording_rank(*a, **kw):
        threads.append(threading.current_thread().name)
        return real_rank(*a, **kw)

    monkeypatch.setattr(service_module, "RANK_ON_LOOP", limit)
    monkeypatch.setattr(service_module, "rank", recording_rank)

    async def search():
        return threading.current_thread().name, await pair_service.search_text_async("ltd", query="a blue square", k=3)

    loop_thread, r = asyncio.run(search())
    assert len(r.hits) == 3 and len(threads) == 1
    assert (threads[0] == loop_thread) is on_loop


def test_a_caller_that_stops_waiting_leaves_no_error_and_the_next_query_is_served(tiny_index_pair, caplog):
    svc = pair_settings(tiny_index_pair, text_cache=0).search_service()
    svc.registry.load()
    slow = SlowEncoder(svc.encoder.encode_batch, delay=0.3)
    svc.encoder.encode_batch = slow
    try:
        async def scenario():
            gone = asyncio.create_task(svc.search_text_async("ltd", query="a client that leaves", k=3))
            await asyncio.sleep(0.05)  # the encoder is working on it
            gone.cancel()  # what the server does when the client disconnects
            with pytest.raises(asyncio.CancelledError):
                await gone
            await asyncio.sleep(0.4)  # the encoder finishes the abandoned query meanwhile
            return await svc.search_text_async("ltd", query="the next client", k=3)

        with caplog.at_level("ERROR"):
            r = asyncio.run(scenario())
        assert len(r.hits) == 3 and len(slow.threads) == 2
        assert not [rec for rec in caplog.records if rec.levelname in ("ERROR", "CRITICAL")]
    finally:
        svc.close()
