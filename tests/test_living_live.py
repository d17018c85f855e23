"""The living index on a live `ltd serve --writable`: real HTTP, other processes writing the same index.

- 50 images added over REST (multipart, two requests): each is its own top image → image hit at once
  (read-your-writes), with no restart;
- 10 of them removed: none is ever answered again by any route (search, similar, compare, explain,
  images, thumbnails, items, examples);
- an edit and a filter apply at once;
- `ltd index --append`, `ltd items add` and `ltd index --compact` in other processes while the server
  serves: the server picks the new items and the new generation up by itself (hot reload), and no
  request of a client querying all the while fails;
- the server SIGKILLed while an add is in flight: after a restart every acknowledged write is there and
  the killed add is all there or all absent (every step of every write: tests/test_living_crash.py).

All traffic goes to 127.0.0.1. The same routes in process: tests/test_living_index.py.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from test_living_index import png

from bench import _server as live
from indexer import image_roots
from indexer.index import read_manifest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served(tiny_index_pair, tmp_path_factory):
    """Writable copies of both tiny indexes, served by a real `ltd serve --writable`: (client, ltd dir, tmp)."""
    tmp = tmp_path_factory.mktemp("living-live")
    dirs = {}
    for name in ("bl", "ltd"):
        dirs[name] = shutil.copytree(tiny_index_pair[name], tmp / name)
        image_roots.record(dirs[name], read_manifest(dirs[name])["image_roots"])  # as `ltd index` would have
    args = ["--model", f"bl={dirs['bl']}", "--model", f"ltd={dirs['ltd']}", "--writable", "--no-ui"]
    with live.serving(args, tmp / "serve.log") as (_, base), httpx.Client(base_url=base, timeout=60) as c:
        yield c, dirs["ltd"], tmp


def _add(c: httpx.Client, seeds: list[int], items: list[dict] | None = None) -> list[int]:
    files = [("file", (f"p{s}.png", png(s), "image/png")) for s in seeds]
    r = c.post("/api/models/ltd/items", files=files, data={"items": json.dumps(items)} if items else {})
    assert r.status_code == 201, r.text
    return [it["id"] for it in r.json()["items"]]


def _answered(c: httpx.Client, ids: list[int]) -> set[int]:
    """Every one of ``ids`` that some route answers or serves."""
    seen: set[int] = set()
    for q in ("a photo", "a red square", "noise"):
        seen |= {h["id"] for h in c.post("/api/search/text", json={"model": "ltd", "query": q, "k": 500}).json()["results"]}
        cmp = c.post("/api/compare", json={"query": q, "models": ["bl", "ltd"], "k": 500}).json()
        seen |= {h["id"] for h in cmp["results"][1]["results"]}
        vec = c.post("/api/search/similar", json={"model": "ltd", "image_id": ids[-1], "k": 500})
        if vec.status_code == 200:
            seen |= {h["id"] for h in vec.json()["results"]}
    for i in ids:
        for path in (f"/api/images/{i}?model=ltd", f"/api/images/{i}/thumbnail?model=ltd", f"/api/models/ltd/items/{i}"):
            if c.get(path).status_code == 200:
                seen.add(i)
        for route, body in (("/api/search/similar", {"model": "ltd", "image_id": i, "k": 3}),
                            ("/api/search/image", {"model": "ltd", "image_id": i, "k": 3}),
                            ("/api/explain", {"query": "a photo", "image_id": i, "models": ["ltd"]})):
            if c.post(route, json=body).status_code == 200:
                seen.add(i)
    seen |= {it["id"] for it in c.get("/api/models/ltd/items", params={"limit": 1000}).json()["items"]}
    for seed in range(5):
        r = c.get("/api/examples", params={"model": "ltd", "n": 100, "seed": seed})
        assert r.status_code == 200, r.text
        seen |= {ex["image_id"] for ex in r.json() if ex["image_id"] is not None}
    return seen & set(ids)


def _wait_for(check, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    return check()


def _ltd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_fifty_added_are_found_and_ten_removed_never_again(served):
    c, _, _ = served
    ids = _add(c, list(range(100, 132))) + _add(c, list(range(132, 150)))
    assert len(set(ids)) == 50
    for i in ids:  # read-your-writes: each is its own top hit the moment its add returned
        assert c.post("/api/search/similar", json={"model": "ltd", "image_id": i, "k": 1}).json()["results"][0]["id"] == i
    gone = ids[:10]
    for i in gone:
        assert c.delete(f"/api/models/ltd/items/{i}").json() == {"id": i, "removed": True}
    assert _answered(c, ids) == set(ids[10:])


def test_an_edit_and_a_filter_apply_at_once(served):
    c, _, _ = served
    ids = _add(c, list(range(200, 206)), [{"metadata": {"trip": "rome" if k < 3 else "oslo"}} for k in range(6)])
    rome = {"field": "trip", "eq": "rome"}
    hits = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 100, "filter": rome}).json()
    assert {h["id"] for h in hits["results"]} == set(ids[:3])
    assert c.patch(f"/api/models/ltd/items/{ids[5]}", json={"metadata": {"trip": "rome"}}).status_code == 200
    hits = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 100, "filter": rome}).json()
    assert {h["id"] for h in hits["results"]} == {*ids[:3], ids[5]}


class _Traffic(threading.Thread):
    """Queries in a loop from another thread until stopped: every status that was not 200, recorded."""

    def __init__(self, base: str):
        super().__init__(daemon=True)
        self.base, self.stop, self.bad, self.n = base, threading.Event(), [], 0

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as c:
            while not self.stop.is_set():
                for body in ({"model": "ltd", "query": "a photo", "k": 20}, {"model": "bl", "query": "a dog", "k": 5}):
                    r = c.post("/api/search/text", json=body)
                    self.n += 1
                    if r.status_code != 200:
                        self.bad.append((r.status_code, r.text[:200]))


def _folder(tmp: Path, name: str, seeds: range) -> Path:
    folder = tmp / name
    folder.mkdir()
    for s in seeds:
        (folder / f"{name}-{s}.png").write_bytes(png(s))
    return folder


def _total(c: httpx.Client) -> int:
    return c.get("/api/models/ltd/items", params={"limit": 1}).json()["total"]


def test_other_processes_append_write_and_compact_while_it_serves(served):
    c, index, tmp = served
    traffic = _Traffic(str(c.base_url))
    traffic.start()
    try:
        before = _total(c)
        out = _ltd("index", "--append", "--out", str(index), "--images-dir", str(_folder(tmp, "appended", range(300, 304))))
        assert out.returncode == 0, out.stderr[-2000:]
        # the server was not told: it sees the other process's write by itself (search/registry.py watch)
        assert _wait_for(lambda: _total(c) == before + 4)
        out = _ltd("items", "add", "--index", str(index), "--images-dir", str(_folder(tmp, "added", range(310, 313))),
                   "--no-progress")
        assert out.returncode == 0, out.stderr[-2000:]
        assert _wait_for(lambda: _total(c) == before + 7)
        names = {it["id"]: it["filename"] for it in c.get("/api/models/ltd/items", params={"limit": 1000}).json()["items"]}
        new = [i for i, f in names.items() if f.startswith(("appended-", "added-"))]
        assert len(new) == 7
        gen = c.post("/api/search/text", json={"model": "ltd", "query": "a photo"}).json()["generation"]
        out = _ltd("index", "--compact", "--out", str(index))
        assert out.returncode == 0, out.stderr[-2000:]
        assert _wait_for(lambda: c.post("/api/search/text", json={"model": "ltd", "query": "a photo"}
                                        ).json()["generation"] > gen)
        for i in new:  # the same items, the same answers, from the new generation's files
            hit = c.post("/api/search/similar", json={"model": "ltd", "image_id": i, "k": 1}).json()["results"][0]
            assert hit["id"] == i
    finally:
        traffic.stop.set()
        traffic.join(60)
    assert traffic.n > 10 and not traffic.bad, traffic.bad[:3]  # no request failed while it all happened
    assert c.get("/api/health").json()["status"] == "ok"


def test_a_server_killed_mid_add_restarts_with_every_acknowledged_write(tiny_index_pair, tmp_path):
    """SIGKILL of the real server while an add of 30 images is in flight, after 5 were acknowledged: after
    a restart on the same folder the 5 are there and the 30 are all there or all absent (one transaction)."""
    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    image_roots.record(index, read_manifest(index)["image_roots"])
    args = ["--model", f"ltd={index}", "--writable", "--no-ui"]
    proc, base = live.start(args, tmp_path / "serve1.log")
    try:
        with httpx.Client(base_url=base, timeout=60) as c:
            acked = _add(c, list(range(400, 405)))
            files = [("file", (f"k{s}.png", png(s), "image/png")) for s in range(410, 440)]
            sender = threading.Thread(target=lambda: _post_quietly(base, files), daemon=True)
            sender.start()
            time.sleep(0.5)  # the add is being received, decoded or embedded
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    with live.serving(args, tmp_path / "serve2.log") as (_, base), httpx.Client(base_url=base, timeout=60) as c:
        names = [it["filename"] for it in c.get("/api/models/ltd/items", params={"limit": 1000}).json()["items"]]
        assert {f"p{s}.png" for s in range(400, 405)} <= set(names)
        killed = {n for n in names if n.startswith("k")}
        assert len(killed) in (0, 30), sorted(killed)
        for i in acked:
            assert c.post("/api/search/similar", json={"model": "ltd", "image_id": i, "k": 1}).json()["results"][0]["id"] == i


def _post_quietly(base: str, files: list) -> None:
    try:
        httpx.post(base + "/api/models/ltd/items", files=files, timeout=30)
    except httpx.HTTPError:
        pass  # the server was killed under it
