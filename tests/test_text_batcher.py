"""search/encoding.py's TextBatcher: a lone query is encoded on its caller's thread; queries that arrive
while the encoder is busy go together in one call from the batcher thread; errors reach their callers
and the batcher keeps serving."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from search.encoding import TextBatcher


class Recorder:
    """An encoder that records (thread name, texts) per call; ``gate`` holds the first call open."""

    def __init__(self, fail_on: str = ""):
        self.calls: list[tuple[str, list[str]]] = []
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()
        self.fail_on = fail_on

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append((threading.current_thread().name, list(texts)))
        self.entered.set()
        self.gate.wait(10)
        if self.fail_on in texts:
            raise ValueError(f"cannot encode {self.fail_on}")
        return np.array([[len(t), hash(t) % 1000] for t in texts], dtype=np.float32)


def wait_for(cond, timeout: float = 10.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout
        time.sleep(0.005)


def test_a_lone_query_is_encoded_on_the_callers_thread():
    enc = Recorder()
    b = TextBatcher(enc, name="t")
    np.testing.assert_array_equal(b.encode("a dog"), [5, hash("a dog") % 1000])
    assert enc.calls == [(threading.current_thread().name, ["a dog"])]
    assert (b.calls, b.items) == (1, 1)
    b.close()


def test_queries_arriving_while_busy_go_together_from_the_batcher_thread():
    enc = Recorder()
    b = TextBatcher(enc, name="t")
    enc.gate.clear()  # the first (inline) call holds the encoder
    out: dict[str, np.ndarray] = {}
    first = threading.Thread(target=lambda: out.__setitem__("first", b.encode("first")), name="req-0")
    first.start()
    assert enc.entered.wait(10)
    texts = [f"query {i}" for i in range(6)] + ["query 0"]  # a duplicate is encoded once
    others = [threading.Thread(target=lambda t=t, i=i: out.__setitem__(f"{t}#{i}", b.encode(t)), name=f"req-{i + 1}")
              for i, t in enumerate(texts)]
    for t in others:
        t.start()
    wait_for(lambda: len(b._pending) == len(texts))
    enc.gate.set()
    for t in [first, *others]:
        t.join(10)
    assert enc.calls[0] == ("req-0", ["first"])
    assert enc.calls[1:] == [("ltd-text-batcher-t", [f"query {i}" for i in range(6)])]
    for i, t in enumerate(texts):
        np.testing.assert_array_equal(out[f"{t}#{i}"], [len(t), hash(t) % 1000])
    assert (b.calls, b.items) == (2, 1 + len(texts))
    b.close()


def test_errors_reach_their_callers_and_the_batcher_keeps_serving():
    enc = Recorder(fail_on="bad")
    b = TextBatcher(enc, name="t")
    with pytest.raises(ValueError, match="cannot encode bad"):
        b.encode("bad")  # inline
    with pytest.raises(ValueError, match="cannot encode bad"):
        b.submit("bad").result(10)  # through the batcher thread
    assert b.encode("good").shape == (2,) and b.submit("fine").result(10).shape == (2,)
    b.close()
