"""The living index over a sharded index, in process (the local shard engine): items added through the
front are found at once, removed ones are never answered again, a filter and the shards together."""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from conftest import pair_settings
from fastapi.testclient import TestClient
from test_living_index import png

from app.api.main import create_app
from indexer import image_roots
from indexer.index import read_manifest
from indexer.shards_index import shard_index_dir


def test_added_items_are_found_and_removed_ones_never_returned_on_a_sharded_index(tiny_index_pair, tmp_path):
    sharded = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    shard_index_dir(sharded, 2, "id")
    image_roots.record(sharded, read_manifest(sharded)["image_roots"])  # as `ltd index` would have
    settings = pair_settings({"bl": tiny_index_pair["bl"], "ltd": sharded}, writable=True, compact_after=2)
    with TestClient(create_app(settings)) as c:
        before = {h["id"] for h in c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 500})
                  .json()["results"]}
        files = [("file", (f"p{s}.png", png(s), "image/png")) for s in range(300, 306)]
        r = c.post("/api/models/ltd/items", files=files)
        assert r.status_code == 201, r.text
        ids = [it["id"] for it in r.json()["items"]]
        for i in ids:  # each is its own top image the moment its add returned
            hit = c.post("/api/search/similar", json={"model": "ltd", "image_id": i, "k": 1}).json()
            assert hit["results"][0]["id"] == i and hit["partial"] is False
        gone = ids[:3]
        for i in gone:
            assert c.delete(f"/api/models/ltd/items/{i}").json() == {"id": i, "removed": True}
        old = sorted(before)[:2]
        for i in old:  # base rows, held by the shards, removed through the front
            assert c.delete(f"/api/models/ltd/items/{i}").status_code == 200
        found = {h["id"] for h in c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 500})
                 .json()["results"]}
        assert set(ids[3:]) <= found and not (set(gone) | set(old)) & found
        assert found == (before - set(old)) | set(ids[3:])
        # past compact_after (2) the server compacted by itself: merged, and sharded again in its layout
        deadline = time.monotonic() + 60
        registry = c.app.state.service.registry
        while registry.get("ltd").generation < 3 or \
                [t for t in threading.enumerate() if t.name.startswith("ltd-compact-")]:
            assert time.monotonic() < deadline, "no compaction"
            time.sleep(0.2)
        c.post("/api/models/ltd/compact")  # then once more for the writes since (202, or 409 while one runs)
        while registry.get("ltd").live.pending() != {"added": 0, "removed": 0} or \
                [t for t in threading.enumerate() if t.name.startswith("ltd-compact-")]:
            assert time.monotonic() < deadline, "writes never folded"
            if not [t for t in threading.enumerate() if t.name.startswith("ltd-compact-")]:
                c.post("/api/models/ltd/compact")
            time.sleep(0.2)
        mf = read_manifest(sharded)
        assert mf["generation"] >= 3 and mf["sharding"]["count"] == 2 and mf["items_seq"] > 0
        assert {h["id"] for h in c.post("/api/search/text", json={"model": "ltd", "query": "a photo", "k": 500})
                .json()["results"]} == found
        live = c.get("/api/models/ltd/items?limit=1").json()["total"]  # every item the store lists, now all in shards
        assert sum(mf["sharding"]["shards"][s]["counts"]["images"] for s in range(2)) == live == mf["counts"]["images"]


def test_sharding_a_living_index_keeps_its_writes_or_refuses(tiny_index_pair, tmp_path):
    """A store the base already holds is dropped by sharding in place (the sharded index then serves and
    takes writes); one holding writes the base does not is refused, the index left as it was."""
    import pytest

    from indexer.index import load_index_dir
    from indexer.items import ItemStore, has_store
    from training.errors import UserValueError

    clean = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "clean")
    first = int(load_index_dir(clean).images.meta["ids"][0])
    ItemStore.open(load_index_dir(clean)).close()  # seeded only: what a writable server leaves unwritten
    shard_index_dir(clean, 2, "id")
    assert not has_store(clean)
    settings = pair_settings({"bl": tiny_index_pair["bl"], "ltd": clean}, writable=True)
    with TestClient(create_app(settings)) as c:
        assert c.get("/api/health").json()["status"] == "ok"
        assert c.patch(f"/api/models/ltd/items/{first}", json={"metadata": {"tag": "x"}}).status_code == 200

    dirty = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "dirty")
    store = ItemStore.open(load_index_dir(dirty))
    store.edit(first, {"tag": "kept"})
    store.close()
    before = read_manifest(dirty)
    with pytest.raises(UserValueError, match="--compact"):
        shard_index_dir(dirty, 2, "id")
    assert read_manifest(dirty) == before and has_store(dirty)


def test_compacting_a_sharded_index_survives_a_kill_at_the_commit(tiny_index_pair, tmp_path, monkeypatch):
    """`ltd index --compact` on a sharded index: killed at its commit point it leaves the old generation
    and the store's writes as they were; run again it folds them into new shards of the same layout."""
    import pytest

    import indexer.shards_index as shards_index
    from app.cli import main
    from indexer.compact import compact
    from indexer.items import ItemStore
    from indexer.shards_merge import read_sharded_plain

    sharded = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    shard_index_dir(sharded, 2, "id")
    ids = [int(i) for i in read_sharded_plain(sharded).images.ids]
    store = ItemStore.open(read_sharded_plain(sharded))
    store.remove([ids[0]])
    store.edit(ids[1], {"album": "kept"})
    store.close()
    before = read_manifest(sharded)

    def killed(*a, **k):
        raise SystemExit("killed")  # what a kill at the commit point leaves: everything written before it
    monkeypatch.setattr(shards_index, "write_json_atomic", killed)
    with pytest.raises(SystemExit):
        compact(sharded)
    monkeypatch.undo()
    assert read_manifest(sharded) == before
    ix = read_sharded_plain(sharded, verify="hash")  # the old generation, whole
    assert ids[0] in {int(i) for i in ix.images.ids}
    store = ItemStore.open(ix, create=False)
    assert store.last_seq() > store.folded_seq
    store.close()

    assert main(["index", "--compact", "--out", str(sharded), "--no-progress"]) == 0
    after = read_manifest(sharded)
    assert after["generation"] == before["generation"] + 1 and after["sharding"]["by"] == "id"
    assert after["created"] == before["created"]  # the same build: the store still belongs to it
    ix = read_sharded_plain(sharded, verify="hash")
    kept = [int(i) for i in ix.images.ids]
    assert ids[0] not in kept and kept == ids[1:]
    assert ix.images.meta["metadata"][0]["album"] == "kept"
    store = ItemStore.open(ix, create=False)
    assert store.last_seq() == store.folded_seq and store.pending() == {"added": 0, "removed": 0}
    store.close()
    assert not list(Path(sharded).glob(f"shards.g{before['generation']:04d}"))  # the old shards collected
