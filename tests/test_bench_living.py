"""The helpers of bench/filtered_search.py and bench/living_add.py: the truth they score against, the
shares they deal out, and what they count as "during the add"."""
from __future__ import annotations

import time

import numpy as np
import pytest

from bench import filtered_search, living_add


def test_tags_deal_exact_shares_independent_of_the_order():
    t = filtered_search.tags(100_000)
    counts = filtered_search.tag_counts(100_000)
    assert {v: int((t == v).sum()) for v in counts} == counts
    assert counts["half"] == 50_000 and counts["tenth"] == 100 and counts["seven"] == 7
    assert sum(counts.values()) == 100_000
    assert (t[:50_000] == "half").mean() == pytest.approx(0.5, abs=0.02)  # dealt out, not in runs


def test_truth_is_the_brute_force_top_k_of_the_rows_with_ties_by_row():
    rng = np.random.default_rng(0)
    xb = rng.normal(size=(3000, 8)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)  # a row's own vector is its best match
    xb[2000] = xb[10]  # a tie: the lower row comes first
    xq = np.concatenate([xb[10:11], rng.normal(size=(4, 8)).astype(np.float32)])
    rows = np.sort(rng.choice(3000, 900, replace=False))
    rows = np.union1d(rows, [10, 2000])
    got = filtered_search.truth_topk(xb, rows, xq, 5, chunk=128)  # several chunks
    for q, g in zip(xq, got):
        s = xb[rows] @ q
        want = rows[np.lexsort((rows, -s))][:5]
        np.testing.assert_array_equal(g, want)
    assert list(got[0][:2]) == [10, 2000]
    short = filtered_search.truth_topk(xb, rows[:3], xq, 5)
    assert (short[:, 3:] == -1).all() and (short[:, :3] >= 0).all()


def test_during_the_add_counts_only_requests_sent_inside_it():
    t0 = 1000.0
    res = {"during": {"start": [t0 - 1, t0 + 1, t0 + 2, t0 + 11], "ms": [1.0, 50.0, 70.0, 2.0], "errors": {}},
           "idle_before": {"ms": [10.0] * 50, "errors": {}}, "idle_after": {"ms": [20.0] * 50, "errors": {"HTTP 500": 1}},
           "add": {"t0": t0, "t1": t0 + 10, "wall_s": 10.0, "ids": 100, "errors": {}},
           "offline": {"images": 100, "wall_s": 20.0, "after_load_s": 12.5}}
    s = living_add.summarise(res)
    assert s["during"]["requests"] == 2 and s["during"]["max_ms"] == 70.0
    assert s["idle"]["requests"] == 100 and s["search_errors"] == 1
    assert s["add_rate"] == 10.0 and s["offline_rate"] == 5.0 and s["throughput"] == 2.0
    assert s["offline_rate_after_load"] == 8.0


def test_offline_time_is_read_from_the_model_load_line():
    now = time.time()
    line = time.strftime("%H:%M:%S", time.localtime(now - 42)) + " I ltd.index: loading the model from x …"
    assert living_add.after_model_load("starting\n" + line + "\n{}", now) == pytest.approx(42, abs=1.01)
    assert living_add.after_model_load("no such line", now) is None
