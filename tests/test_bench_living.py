"""The helpers of bench/filtered_search.py and bench/living_add.py: the truth they score against, the
shares they deal out, and what they count as "during the add"."""
from __future__ import annotations

import os
import time
from pathlib import Path

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


def test_a_server_childs_cpu_is_counted_apart_from_the_server():
    import subprocess
    import sys

    from bench import _server

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        deadline = time.time() + 20
        while _server.children_cpu_seconds(os.getpid()) < 0.25 and time.time() < deadline:
            time.sleep(0.05)
        assert _server.children_cpu_seconds(os.getpid()) >= 0.25
        assert _server.cpu_seconds(os.getpid()) >= _server.cpu_seconds_of(os.getpid()) + 0.25
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="reads Linux's /proc")
def test_a_server_childs_nice_and_policy_are_read_from_proc():
    """Read by a parent of its own (the test process may have other children: servers, clusters)."""
    import subprocess
    import sys

    child = ("import os, sys, threading, time\nos.nice(3)\nos.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))\n"
             "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\nprint('up', flush=True)\n"
             "time.sleep(30)")
    parent = ("import os, subprocess, sys\nfrom bench import _server\nprint(_server.children_priority(os.getpid()))\n"
              f"c = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True)\n"
              "assert c.stdout.readline() == 'up\\n'\nprint(_server.children_priority(os.getpid()))\nc.kill()\nc.wait()")
    out = subprocess.run([sys.executable, "-c", parent], cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["none", f"nice {os.nice(0) + 3}, batch"]


@pytest.mark.parametrize("in_process", [False, True])
def test_a_block_says_its_mode_engine_and_the_cpu_each_side_used(in_process):
    t0 = 1000.0
    res = {"during": {"start": [t0 + 1], "ms": [5.0], "errors": {}},
           "idle_before": {"ms": [4.0] * 10, "errors": {}}, "idle_after": {"ms": [4.0] * 10, "errors": {}},
           "add": {"t0": t0, "t1": t0 + 10, "wall_s": 10.0, "ids": 100, "errors": {}, "total_after": 200,
                   "request_p50_s": 0.3, "server_cpu_s": 12.0, "embedder_cpu_s": 0.0 if in_process else 0.5},
           "offline": {"images": 100, "wall_s": 2.0, "after_load_s": None, "cpu_s": 3.0},
           "machine": "m", "date": "d", "command": "python bench/living_add.py", "nice": 0, "load1_start": 0.1,
           "load1_end": 0.2, "base_images": 100, "concurrency": 8, "torch_threads": 0, "runtime": "openvino",
           "write_in_process": in_process, "embedder_priority": "none" if in_process else "nice 5, batch"}
    text = living_add.render(res, living_add.summarise(res))
    assert "Image runtime: openvino" in text
    assert ("Write embedder: nice 5, batch." in text) is not in_process
    assert ("--write-in-process`" in text.splitlines()[0]) is in_process
    assert "| CPU of offline `ltd index` (the whole command) | 3.0 s (30.0 ms per image) |" in text
    assert ("in the server's" in text) is in_process
    assert in_process or "12.0 s; 0.5 s (5.0 ms per image)" in text


def test_a_load_child_whose_bench_died_stops(tmp_path):
    """A bench killed mid-run (its stop file never written) must not leave its load client running."""
    import json
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a loopback port nothing listens on: every search fails fast
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = {"port": port, "model": "ltd", "k": 10, "concurrency": 2, "texts": ["a dog"], "seed": 0,
            "limit": 10**9}
    parent = ("import sys, json; from pathlib import Path; from bench.living_add import Load; "
              f"l = Load(Path({str(tmp_path)!r}), 'orphan', json.loads({json.dumps(json.dumps(spec))})); "
              "print(l.proc.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, cwd=living_add.ROOT,
                         timeout=60)
    child = int(out.stdout.split()[0])
    deadline = time.time() + 30
    while time.time() < deadline and Path(f"/proc/{child}").exists() and \
            Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.1)
    alive = Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    if alive:
        os.kill(child, 9)
    assert not alive, "the orphaned load client kept running"
