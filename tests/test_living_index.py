"""The living index through the REST API, in process: add, find, filter, page, edit, remove, compact.

Each test copies the tiny LTD index into its own folder (so writes never touch the shared fixture) and
serves it writable. The live-server version (real `ltd serve`, real HTTP, kills) is in
tests/test_living_live.py; the store's crash safety in tests/test_living_crash.py.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient
from PIL import Image

from app.api.main import create_app
from indexer import image_roots
from indexer.index import read_manifest
from search.service import SearchConfig


def png(seed: int, size: int = 64) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def living(tiny_index_pair, tmp_path):
    """A writable copy of the tiny LTD index, served in process: (client, index dir)."""
    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    image_roots.record(index, read_manifest(index)["image_roots"])  # as `ltd index` would have
    settings = pair_settings(tiny_index_pair, models={"ltd": str(index)}, writable=True)
    with TestClient(create_app(settings)) as c:
        yield c, index


def add(c: TestClient, seeds: list[int], items: list[dict] | None = None) -> list[int]:
    files = [("file", (f"p{s}.png", png(s))) for s in seeds]
    data = {"items": json.dumps(items)} if items else {}
    r = c.post("/api/models/ltd/items", files=files, data=data)
    assert r.status_code == 201, r.text
    return [it["id"] for it in r.json()["items"]]


def every_route_ids(c: TestClient, ids: list[int]) -> set[int]:
    """Every image id any route answers for these ids (search, similar, compare-less single model,
    images, thumbnails, items, examples)."""
    seen = set()
    for q in ("a photo", "a red square", "something"):
        seen |= {h["id"] for h in c.post("/api/search/text", json={"model": "ltd", "query": q, "k": 200}).json()["results"]}
    for i in ids:
        for path in (f"/api/images/{i}?model=ltd", f"/api/images/{i}/thumbnail?model=ltd", f"/api/models/ltd/items/{i}"):
            if c.get(path).status_code == 200:
                seen.add(i)
        r = c.post("/api/search/similar", json={"model": "ltd", "image_id": i, "k": 5})
        if r.status_code == 200:
            seen.add(i)
    page = c.get("/api/models/ltd/items", params={"limit": 1000}).json()
    seen |= {it["id"] for it in page["items"]}
    for seed in range(5):
        r = c.get("/api/examples", params={"model": "ltd", "n": 100, "seed": seed})
        assert r.status_code == 200, r.text
        seen |= {ex["image_id"] for ex in r.json() if ex["image_id"] is not None}
    return seen & set(ids)


def test_added_images_are_found_by_themselves_and_removed_ones_never_again(living):
    c, _ = living
    ids = add(c, list(range(12)))
    assert len(set(ids)) == 12
    for i in ids:  # read-your-writes: each is its own top image → image hit
        hits = c.post("/api/search/similar", json={"model": "ltd", "image_id": i, "k": 3}).json()["results"]
        assert hits[0]["id"] == i
    assert add(c, [3]) == [ids[3]]  # the same bytes again: idempotent, same id
    gone = ids[:4]
    for i in gone:
        assert c.delete(f"/api/models/ltd/items/{i}").json() == {"id": i, "removed": True}
    assert every_route_ids(c, ids) == set(ids[4:])
    assert c.delete(f"/api/models/ltd/items/{gone[0]}").status_code == 404


def test_metadata_filters_restrict_every_query_and_edits_apply_at_once(living):
    c, _ = living
    ids = add(c, list(range(20, 30)), [{"captions": [f"picture number {k}"], "metadata": {"album": "a" if k < 5 else "b",
                                                                                          "rank": k}} for k in range(10)])
    flt = {"field": "album", "eq": "a"}
    for route, body in (("/api/search/text", {"query": "a picture"}), ("/api/search/similar", {"image_id": ids[7]})):
        hits = c.post(route, json={"model": "ltd", "k": 50, "filter": flt, **body}).json()["results"]
        assert {h["id"] for h in hits} == set(ids[:5])  # every match, nothing else
    caps = c.post("/api/search/image", json={"model": "ltd", "image_id": ids[0], "k": 50, "filter": flt}).json()
    assert {h["image_id"] for h in caps["results"]} == set(ids[:5])
    rng = {"and": [{"field": "rank", "gte": 3, "lt": 7}, {"not": {"field": "album", "eq": "b"}}]}
    assert {h["id"] for h in c.post("/api/search/text", json={"model": "ltd", "query": "x", "k": 50, "filter": rng}
                                    ).json()["results"]} == set(ids[3:5])
    r = c.patch(f"/api/models/ltd/items/{ids[9]}", json={"metadata": {"album": "a"}})
    assert r.status_code == 200 and r.json()["metadata"]["album"] == "a" and r.json()["metadata"]["rank"] == 9
    assert c.get("/api/models/ltd/items", params={"filter": json.dumps(flt)}).json()["total"] == 6
    words = c.post("/api/search/text", json={"model": "ltd", "query": "x", "k": 50, "filter": {"text": "number 7"}}).json()
    assert [h["id"] for h in words["results"]] == [ids[7]]
    r = c.patch(f"/api/models/ltd/items/{ids[7]}", json={"captions": ["a lighthouse at dusk"]})
    assert [cap["text"] for cap in r.json()["captions"]] == ["a lighthouse at dusk"]
    assert c.post("/api/search/text", json={"model": "ltd", "query": "x", "filter": {"text": "lighthouse"}}
                  ).json()["results"][0]["id"] == ids[7]


def test_pages_follow_one_stable_order(living):
    c, _ = living
    add(c, list(range(40, 50)))
    whole = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 15}).json()["results"]
    seen, cursor = [], None
    while True:
        r = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 4, "cursor": cursor}).json()
        seen += [(h["id"], h["rank"]) for h in r["results"]]
        cursor = r["next_cursor"]
        if cursor is None or len(seen) >= 15:
            break
    assert [i for i, _ in seen[:15]] == [h["id"] for h in whole] and [r for _, r in seen[:15]] == list(range(1, 16))
    other = c.post("/api/search/text", json={"model": "ltd", "query": "another text", "k": 4}).json()
    assert c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 4,
                                            "cursor": other["next_cursor"]}).status_code == 400


def test_raw_vectors_text_to_text_and_batches(living):
    c, index = living
    ids = add(c, [60, 61], [{"captions": ["a small boat"]}, {"captions": ["a tall tree"]}])
    item = c.get(f"/api/models/ltd/items/{ids[1]}").json()
    cap_id = item["captions"][0]["id"]
    t2t = c.post("/api/search/captions", json={"model": "ltd", "caption_id": cap_id, "k": 3}).json()
    assert t2t["direction"] == "t2t" and t2t["results"][0]["id"] == cap_id
    dim = read_manifest(index)["dim"]
    v = np.random.default_rng(0).standard_normal(dim).tolist()
    for side, direction in (("images", "v2i"), ("captions", "v2t")):
        r = c.post("/api/search/vector", json={"model": "ltd", "vector": v, "side": side, "k": 5})
        assert r.status_code == 200 and r.json()["direction"] == direction and len(r.json()["results"]) == 5
    assert c.post("/api/search/vector", json={"model": "ltd", "vector": v[:-1]}).status_code == 400
    assert c.post("/api/search/vector", json={"model": "ltd", "vector": [0.0] * dim}).status_code == 400
    batch = c.post("/api/search/batch", json={"model": "ltd", "k": 2, "queries": [
        {"kind": "text", "text": "a boat"}, {"kind": "similar_images", "image_id": ids[0]},
        {"kind": "vector", "vector": v, "side": "captions", "k": 3}]}).json()["results"]
    assert [b["direction"] for b in batch] == ["t2i", "i2i", "v2t"] and [len(b["results"]) for b in batch] == [2, 2, 3]
    assert batch[1]["results"][0]["id"] == ids[0]
    too_many = [{"kind": "text", "text": "x"}] * 33
    r = c.post("/api/search/batch", json={"model": "ltd", "queries": too_many})  # over max_batch_queries, like k > max_k
    assert r.status_code == 422 and "at most 32 items" in r.json()["detail"], r.text


@pytest.mark.parametrize("bad", [
    {"field": "a", "eq": 1, "extra": 2}, {"and": [{"and": [{"and": [{"and": [{"and": [{"and": [{"and": [{"and": [
        {"and": [{"field": "a", "eq": 1}]}]}]}]}]}]}]}]}]}, {"field": "a", "in": list(range(2000))},
    {"field": "../x", "eq": 1}, {"text": "x" * 500}, {"field": "a", "gte": "not a date"}, [1, 2]])
def test_bad_filters_are_400(living, bad):
    c, _ = living
    r = c.post("/api/search/text", json={"model": "ltd", "query": "x", "filter": bad})
    assert r.status_code in (400, 422) and "error" in r.json(), r.text


def test_bad_writes_are_4xx(living, tiny_index_pair, tmp_path):
    c, _ = living
    assert c.post("/api/models/ltd/items", files=[("file", ("x.png", b"not an image"))]).status_code == 415
    assert c.post("/api/models/ltd/items", files=[("file", ("x.png", png(1)))],
                  data={"items": "[1, 2]"}).status_code == 400
    r = c.post("/api/models/ltd/items", files=[("file", ("x.png", png(1)))], data={"metadata": json.dumps({"bad key!": 1})})
    assert r.status_code == 400 and r.json()["detail"].startswith("metadata: 'bad key!' is not a field name"), r.text
    assert c.post("/api/models/ltd/items", files=[("file", (f"{k}.png", png(k))) for k in range(33)]).status_code in (400, 422)
    assert c.patch("/api/models/ltd/items/999999", json={"metadata": {"a": 1}}).status_code == 404
    assert c.post("/api/models/ltd/items", json={"folder": "x"}).status_code == 403  # no --ingest-root
    assert c.post("/api/models/nope/items", files=[("file", ("x.png", png(1)))]).status_code == 404
    settings = pair_settings(tiny_index_pair, models={"ltd": str(tiny_index_pair["ltd"])})  # not writable
    with TestClient(create_app(settings)) as ro:
        assert ro.post("/api/models/ltd/items", files=[("file", ("x.png", png(1)))]).status_code == 403
        assert ro.delete("/api/models/ltd/items/1").status_code == 403
    assert not (Path(tiny_index_pair["ltd"]) / "items.sqlite").exists()  # a read-only server makes no store


def test_compaction_drops_removed_items_and_keeps_every_answer(living):
    c, index = living
    ids = add(c, list(range(70, 76)))
    c.delete(f"/api/models/ltd/items/{ids[0]}")
    before = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 20}).json()["results"]
    gen = read_manifest(index)["generation"]
    from indexer.compact import compact

    out = compact(index)
    assert out.generation == gen + 1 and ids[0] not in out.images.ids and set(ids[1:]) <= set(out.images.ids)
    assert c.post("/api/models/ltd/reload").json()["generation"] == gen + 1
    after = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 20}).json()["results"]
    assert [(h["id"], round(h["score"], 5)) for h in after] == [(h["id"], round(h["score"], 5)) for h in before]
    assert c.get(f"/api/images/{ids[1]}?model=ltd").status_code == 200
    assert ids[0] not in every_route_ids(c, ids)


def test_a_server_compacts_by_itself_past_compact_after(tiny_index_pair, tmp_path):
    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    image_roots.record(index, read_manifest(index)["image_roots"])
    gen = read_manifest(index)["generation"]
    settings = pair_settings(tiny_index_pair, models={"ltd": str(index)}, writable=True, compact_after=5)
    with TestClient(create_app(settings)) as c:
        ids = add(c, [90, 91, 92])
        assert read_manifest(index)["generation"] == gen  # 3 pending: below the threshold
        c.delete(f"/api/models/ltd/items/{ids[0]}")
        ids += add(c, [93])  # 5 pending: this write starts a compaction in the background
        deadline = time.monotonic() + 60
        while read_manifest(index)["generation"] == gen and time.monotonic() < deadline:
            time.sleep(0.2)
        assert read_manifest(index)["generation"] == gen + 1
        while c.get("/api/models/ltd/items", params={"limit": 10}).json()["generation"] == gen:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert ids[0] not in every_route_ids(c, ids)
        for i in ids[1:]:
            assert c.post("/api/search/similar", json={"model": "ltd", "image_id": i, "k": 1}).json()["results"][0]["id"] == i


def test_writes_need_the_write_token_and_the_read_token_cannot_write(tiny_index_pair, tmp_path):
    from pydantic import SecretStr

    from app.cli.serve import write_policy
    from training.errors import UserValueError

    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    image_roots.record(index, read_manifest(index)["image_roots"])
    settings = pair_settings(tiny_index_pair, models={"ltd": str(index)}, writable=True,
                             api_token=SecretStr("read-token"), write_token=SecretStr("write-token"))
    read, write = {"Authorization": "Bearer read-token"}, {"Authorization": "Bearer write-token"}
    with TestClient(create_app(settings)) as c:
        upload = [("file", ("x.png", png(5)))]
        assert c.post("/api/models/ltd/items", files=upload).status_code == 401  # no token at all
        assert c.post("/api/models/ltd/items", files=upload, headers=read).status_code == 403  # readers cannot write
        assert c.post("/api/models/ltd/reload", headers=read).status_code == 403
        r = c.post("/api/models/ltd/items", files=upload, headers=write)
        assert r.status_code == 201, r.text
        item = r.json()["items"][0]["id"]
        assert c.delete(f"/api/models/ltd/items/{item}", headers=read).status_code == 403
        assert c.post("/api/search/text", json={"model": "ltd", "query": "x"}, headers=read).status_code == 200
        assert c.post("/api/search/text", json={"model": "ltd", "query": "x"}, headers=write).status_code == 200
        assert c.delete(f"/api/models/ltd/items/{item}", headers=write).status_code == 200
    # `ltd serve` refuses a writable server on another address without a write token of its own
    exposed = pair_settings(tiny_index_pair, writable=True, api_token=SecretStr("t"))
    with pytest.raises(UserValueError, match="LTD_WRITE_TOKEN"):
        write_policy(exposed, "0.0.0.0")
    write_policy(exposed, "127.0.0.1")  # loopback: allowed
    same = pair_settings(tiny_index_pair, writable=True, api_token=SecretStr("t"), write_token=SecretStr("t"))
    with pytest.raises(UserValueError, match="must differ"):
        write_policy(same, "0.0.0.0")


def test_filter_masks_are_kept_per_snapshot_and_dropped_by_a_write(living):
    c, _ = living
    svc = c.app.state.service
    ids = add(c, [60, 61], [{"metadata": {"album": "x"}}, {"metadata": {"album": "y"}}])
    flt = {"field": "album", "eq": "x"}
    e = svc.registry.get("ltd")
    first, caps = svc.filter_masks(e, flt)
    again, _ = svc.filter_masks(e, {"eq": "x", "field": "album"})  # the same filter, keys in another order
    assert again is first and not first.flags.writeable and caps is not None
    assert svc.filter_masks(e, flt, captions=False)[1] is None
    c.patch(f"/api/models/ltd/items/{ids[1]}", json={"metadata": {"album": "x"}})  # a write: a new snapshot
    e2 = svc.registry.get("ltd")
    fresh, _ = svc.filter_masks(e2, flt)
    assert fresh is not first and fresh.sum() == first.sum() + 1


def test_ground_truth_metrics_under_a_filter_are_those_of_the_ranking_shown(living):
    """With a filter, the first ground-truth rank is its rank among the kept items (the hit list's), the
    cut-offs count kept items only, and a filter that keeps no ground-truth item gives no metrics."""
    c, index = living
    from indexer.index import load_index_dir

    ix = load_index_dir(index)
    cap = 0
    image_id = int(ix.images.ids[ix.captions.meta["image"][cap]])
    cap_id = int(ix.captions.ids[cap])
    others = [int(i) for i in ix.images.ids if int(i) != image_id]
    keep = {"field": "image_id", "in": [image_id] + others[:3]}
    body = c.post("/api/search/text", json={"model": "ltd", "caption_id": cap_id, "k": 20, "filter": keep}).json()
    hits = body["results"]
    assert len(hits) == 4 and {h["id"] for h in hits} == set(keep["in"])
    gt_rank = next(h["rank"] for h in hits if h["id"] == image_id)
    m = body["metrics"]
    assert m["first_gt_rank"] == gt_rank and m["k"] == 4  # k: at most the kept items
    assert m["precision_at_k"] == pytest.approx(1 / 4) and 0 < m["ndcg_at_k"] <= 1
    whole = c.post("/api/search/text", json={"model": "ltd", "caption_id": cap_id, "k": 20}).json()["metrics"]
    assert whole["first_gt_rank"] >= gt_rank
    out = c.post("/api/search/text", json={"model": "ltd", "caption_id": cap_id, "k": 5,
                                            "filter": {"field": "image_id", "in": others[:3]}}).json()
    assert out["metrics"] is None and len(out["results"]) == 3


LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="per-thread nice values are read from Linux's /proc")


def nice_of(pid: int, tid: int | None = None) -> int:
    stat = Path(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


@LINUX_PROC
def test_writes_embed_in_a_child_process_of_lower_priority(living):
    """By default the images of a write are embedded by a child process per model at nice +``write_nice``
    over the searches' and under the batch scheduling policy, every thread of it (search/embed_process.py):
    on a busy machine the add yields CPU to the searches, and no thread of it shares the server's GIL."""
    c, _ = living
    add(c, [401])
    child = c.app.state.service.writes._processes["ltd"].pid
    assert child is not None and child != os.getpid()
    assert nice_of(child) == min(19, os.nice(0) + SearchConfig().write_nice)
    threads = [int(t.name) for t in Path(f"/proc/{child}/task").iterdir()]  # the runtime's pool included
    assert len(threads) > 1 and {os.sched_getscheduler(t) for t in threads} == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the server's own threads keep theirs


def test_the_embedder_process_stores_the_uploads_not_the_server(living, monkeypatch):
    """By default an add's files are written (and fsynced) by the embedder process: no thread of the
    server writes them (its searches' GIL never waits on those writes), and they are what an in-process
    add stores: named by their sha256 under the store's folder, with their file metadata."""
    import indexer.items as items
    import search.embed_process as embed_process
    import search.write_images as write_images
    import search.writes as writes

    def refused(*a, **k):
        raise AssertionError("the server wrote an upload")

    monkeypatch.setattr(items, "store_upload", refused)
    monkeypatch.setattr(write_images, "store_upload", refused)
    monkeypatch.setattr(embed_process, "save_upload", refused)
    monkeypatch.setattr(writes, "save_upload", refused)
    c, index = living
    (image_id,) = add(c, [403])
    data = png(403)
    item = c.get(f"/api/models/ltd/items/{image_id}").json()
    assert item["metadata"]["width"] == 64 and item["metadata"]["bytes"] == len(data)
    assert c.get(f"/api/images/{image_id}?model=ltd").content == data
    stored = list((index / items.FILES).rglob("*.png"))
    assert [p.read_bytes() for p in stored] == [data] and stored[0].stem == hashlib.sha256(data).hexdigest()


@LINUX_PROC
def test_writes_embed_in_process_on_a_thread_of_lower_priority(tiny_index_pair, tmp_path):
    """``write_in_process``: on the server's write thread instead, at the same nice and policy."""
    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    image_roots.record(index, read_manifest(index)["image_roots"])
    settings = pair_settings(tiny_index_pair, models={"ltd": str(index)}, writable=True, write_in_process=True)
    with TestClient(create_app(settings)) as c:
        add(c, [401])
        assert not c.app.state.service.writes._processes
        writer = list(c.app.state.service.writes._embedder._threads)  # this server's write thread
        assert len(writer) == 1 and writer[0].name.startswith("ltd-writes")
        assert nice_of(os.getpid(), writer[0].native_id) == min(19, os.nice(0) + SearchConfig().write_nice)
        assert os.sched_getscheduler(writer[0].native_id) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) == os.SCHED_OTHER


@LINUX_PROC
def test_an_embedder_killed_while_storing_an_add_fails_it_whole(living, monkeypatch):
    """The write embedder SIGKILLed once every upload has decoded, while it stores them and runs the model:
    the add is a 503 with nothing committed, any file it had stored is an uncommitted upload (swept), and
    the next add works."""
    import signal

    from search.embed_process import ProcessEmbedder

    c, index = living
    add(c, [404])  # the child is up
    writes = c.app.state.service.writes
    before = c.get("/api/models/ltd/items", params={"limit": 1}).json()["total"]
    real = ProcessEmbedder.embed_and_store

    def killed(self, uploads, min_side, folder, on_decoded=None):
        return real(self, uploads, min_side, folder, on_decoded=lambda: os.kill(self.pid, signal.SIGKILL))

    monkeypatch.setattr(ProcessEmbedder, "embed_and_store", killed)
    r = c.post("/api/models/ltd/items", files=[("file", (f"p{s}.png", png(s))) for s in range(405, 437)])
    assert r.status_code == 503, r.text
    assert c.get("/api/models/ltd/items", params={"limit": 1}).json()["total"] == before
    store = writes.svc.registry.get("ltd").live.store
    store.remove_orphan_files(min_age=0)
    named = {p for (p,) in store.conn.execute("SELECT path FROM images WHERE path IS NOT NULL AND deleted_seq IS NULL")}
    on_disk = {str(p) for p in store.files_folder().rglob("*") if p.is_file()}
    assert len(on_disk) == 1 and on_disk <= named  # the first add's upload alone
    monkeypatch.setattr(ProcessEmbedder, "embed_and_store", real)
    assert len(add(c, [437])) == 1


def test_new_captions_of_an_edit_are_embedded_on_the_write_thread(living, monkeypatch):
    """A PATCH that replaces an item's captions embeds them where an add embeds its images: on the write
    thread, not on the request's."""
    import search.writes as writes

    c, _ = living
    (image_id,) = add(c, [402])
    real, threads = writes.embed_captions, []

    def recorded(model, texts):
        threads.append(threading.current_thread().name)
        return real(model, texts)

    monkeypatch.setattr(writes, "embed_captions", recorded)
    r = c.patch(f"/api/models/ltd/items/{image_id}", json={"captions": ["a red kite over the dunes"]})
    assert r.status_code == 200 and [x["text"] for x in r.json()["captions"]] == ["a red kite over the dunes"]
    assert threads and all(t.startswith("ltd-writes") for t in threads)


def test_a_search_never_waits_for_a_write_in_its_transaction(living):
    """A write holds the store's writer connection from its first row to its commit; what a search asks
    of the store (has anything changed, metadata, the changes) goes through connections of its own and
    answers at once, from what was committed: the uncommitted edit is not seen until it commits."""
    c, _ = living
    (image_id,) = add(c, [403], [{"metadata": {"album": "before"}}])
    live = c.app.state.service.registry.get("ltd").live
    store = live.store
    inside, release = threading.Event(), threading.Event()

    def write():
        with store.transaction():
            store.edit(image_id, metadata={"album": "after"})
            inside.set()
            release.wait(30)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert inside.wait(10)
        t0 = time.perf_counter()
        assert live.refresh() is False  # nothing committed since: no change, and no wait
        assert store.metadata([image_id])[image_id]["album"] == "before"
        assert store.changes_since(live.seq).images == []
        r = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 5,
                                              "filter": {"field": "album", "eq": "before"}})
        assert r.status_code == 200 and [h["id"] for h in r.json()["results"]] == [image_id]
        assert time.perf_counter() - t0 < 5.0  # the write holds its transaction for up to 30 s
        assert writer.is_alive()
    finally:
        release.set()
        writer.join(30)
    live.catch_up()  # what the writer does before it answers
    assert store.metadata([image_id])[image_id]["album"] == "after"
    r = c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 5,
                                          "filter": {"field": "album", "eq": "after"}})
    assert [h["id"] for h in r.json()["results"]] == [image_id]
