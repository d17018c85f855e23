"""Adding a server-side folder (``--ingest-root``) to a served living index: what it adds and skips, that
it is the item an upload of the same bytes would be, and — by default — that the write embedder process
reads and embeds its files, not the server (search/embed_process.py ``embed_files``)."""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient
from PIL import Image
from test_living_index import png

from app.api.main import create_app
from indexer import image_roots
from indexer.index import read_manifest


@pytest.fixture
def photos(tmp_path):
    """An ingest root: trip/ with three photos, a file that is not one, and a link out of the root."""
    root = tmp_path / "photos"
    (root / "trip" / "day2").mkdir(parents=True)
    for seed, name in ((501, "a.png"), (502, "b.png"), (503, "day2/c.png")):
        (root / "trip" / name).write_bytes(png(seed))
    (root / "trip" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    (tmp_path / "secret.png").write_bytes(png(504))
    (root / "trip" / "link.png").symlink_to(tmp_path / "secret.png")
    return root


def serve(tiny_index_pair, tmp_path, root, **kw):
    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    image_roots.record(index, read_manifest(index)["image_roots"])
    return TestClient(create_app(pair_settings(tiny_index_pair, models={"ltd": str(index)}, writable=True,
                                               ingest_roots=[str(root)], **kw)))


def folder_vectors(c, ids):
    """The served vectors of ``ids`` (the live snapshot's rows)."""
    e = c.app.state.service.registry.get("ltd")
    return np.stack([e.index.images.vectors[e.image_pos[i]] for i in ids])


@pytest.mark.parametrize("in_process", [False, True])
def test_a_folder_adds_its_images_once_and_skips_what_is_not_one(tiny_index_pair, tmp_path, photos, monkeypatch,
                                                                 in_process):
    import search.writes as writes

    if not in_process:  # the server itself reads and embeds none of the folder's files
        def refused(*a, **k):
            raise AssertionError("the server embedded a folder's file")
        monkeypatch.setattr(writes, "read_image_files", refused)
        monkeypatch.setattr(writes, "embed_images", refused)
    with serve(tiny_index_pair, tmp_path, photos, write_in_process=in_process) as c:
        r = c.post("/api/models/ltd/items", json={"folder": "trip", "metadata": {"album": "summer"}})
        assert r.status_code == 201, r.text
        items = r.json()["items"]
        ids = [it["id"] for it in items if it.get("id") is not None]
        assert len(ids) == 3 and all(it["added"] for it in items if it.get("id") is not None)
        assert [it["file"] for it in items if it.get("skipped")] == ["broken.jpg"]  # the link out of the root: not even tried
        assert [it["file"] for it in items] == ["a.png", "b.png", "broken.jpg", "day2/c.png"]  # each file, in order
        got = {c.get(f"/api/models/ltd/items/{i}").json()["filename"]: c.get(f"/api/models/ltd/items/{i}").json()
               for i in ids}
        assert sorted(got) == ["a.png", "b.png", "c.png"]
        assert {Path(it["file"]).name: it["id"] for it in items if it.get("id")} == {n: got[n]["id"] for n in got}
        assert got["c.png"]["metadata"]["folder"] == "trip/day2" and got["a.png"]["metadata"]["album"] == "summer"
        assert got["a.png"]["metadata"]["width"] == 64 and got["a.png"]["metadata"]["bytes"] == len(png(501))
        assert c.get(f"/api/images/{got['b.png']['id']}?model=ltd").content == png(502)
        for name, seed in (("a.png", 501), ("b.png", 502)):  # the same bytes uploaded: the same item
            again = c.post("/api/models/ltd/items", files=[("file", ("x.png", png(seed)))]).json()["items"]
            assert [(it["id"], it["added"]) for it in again] == [(got[name]["id"], False)]
            top = c.post("/api/search/similar", files=[("file", ("x.png", png(seed)))], data={"model": "ltd", "k": 1})
            assert top.json()["results"][0]["id"] == got[name]["id"], top.text
        r = c.post("/api/models/ltd/items", json={"folder": "trip"})  # again: nothing new
        assert [it.get("added") for it in r.json()["items"] if it.get("id") is not None] == [False] * 3
        assert c.post("/api/models/ltd/items", json={"folder": "../"}).status_code == 404
        assert c.post("/api/models/ltd/items", json={"folder": str(photos)}).status_code == 400


@pytest.mark.parametrize("in_process", [False, True])
def test_a_folders_file_over_the_upload_budgets_is_skipped(tiny_index_pair, tmp_path, in_process):
    """A folder's files are held to the uploads' byte and pixel budgets on either write path."""
    root = tmp_path / "photos"
    (root / "big").mkdir(parents=True)
    buf = io.BytesIO()
    Image.new("RGB", (300, 300), (90, 140, 200)).save(buf, "PNG")
    small, wide, heavy = png(601), buf.getvalue(), png(603, size=200)
    (root / "big" / "small.png").write_bytes(small)
    (root / "big" / "wide.png").write_bytes(wide)  # few bytes, but 90,000 pixels: over the budget below
    (root / "big" / "heavy.png").write_bytes(heavy)  # 40,000 pixels, but more bytes than the budget
    assert len(small) < len(heavy) and len(wide) < len(heavy)
    with serve(tiny_index_pair, tmp_path, root, write_in_process=in_process, max_upload_bytes=len(heavy) - 1,
               max_upload_pixels=50_000) as c:
        r = c.post("/api/models/ltd/items", json={"folder": "big"})
        assert r.status_code == 201, r.text
        items = r.json()["items"]
        assert [it.get("added") for it in items if it.get("id") is not None] == [True]
        why = {it["file"]: it["skipped"] for it in items if it.get("skipped")}
        assert sorted(why) == ["heavy.png", "wide.png"] and "upload limit" in why["heavy.png"], why
        assert "pixel" in why["wide.png"], why


def test_a_file_swapped_for_a_link_out_of_the_root_after_the_check_is_not_read(tmp_path, photos):
    """The server lists a folder's files and drops links out of the root; a file replaced by such a link
    after that is caught where it is read: the opened file's real path is checked, not the name."""
    from search.media import UploadDecoder
    from search.write_images import read_image_files

    swapped, fifo = photos / "trip" / "a.png", photos / "trip" / "day2" / "c.png"
    swapped.unlink()
    swapped.symlink_to(tmp_path / "secret.png")
    fifo.unlink()
    os.mkfifo(fifo)  # opened without waiting for a writer, and refused
    images, records, skipped = read_image_files(UploadDecoder(max_pixels=10**7), [swapped, photos / "trip" / "b.png", fifo],
                                                128, photos.resolve(), 10**7)
    assert list(skipped) == [0, 2] and "leads out of the ingest root" in skipped[0]
    assert "not a regular file" in skipped[2]
    assert len(images) == 1 and records[0]["path"] == str((photos / "trip" / "b.png").resolve())


def test_the_child_embeds_a_folder_as_the_server_would(tiny_index_pair, tmp_path, photos):
    """The process's vectors of a folder are the in-process write path's (the same model, the same
    preprocessing), to float tolerance."""
    vectors = {}
    for in_process in (True, False):
        with serve(tiny_index_pair, tmp_path / str(in_process), photos, write_in_process=in_process) as c:
            items = c.post("/api/models/ltd/items", json={"folder": "trip"}).json()["items"]
            by_name = {c.get(f"/api/models/ltd/items/{it['id']}").json()["filename"]: it["id"] for it in items if it.get("id") is not None}
            vectors[in_process] = folder_vectors(c, [by_name[n] for n in ("a.png", "b.png", "c.png")])
    np.testing.assert_allclose(vectors[False], vectors[True], atol=1e-4)


def test_a_big_folder_goes_to_the_child_in_requests_of_at_most_the_add_cap(tiny_index_pair, tmp_path, monkeypatch):
    from search.embed_process import ProcessEmbedder

    root = tmp_path / "many"
    root.mkdir()
    for seed in range(70):
        (root / f"{'x' * 200}{seed:03d}.png").write_bytes(png(600 + seed, size=32))
    sizes, real = [], ProcessEmbedder.embed_files

    def counted(self, paths, min_side, root):
        sizes.append(len(paths))
        return real(self, paths, min_side, root)

    monkeypatch.setattr(ProcessEmbedder, "embed_files", counted)
    with serve(tiny_index_pair, tmp_path, tmp_path, max_items_per_add=32) as c:
        r = c.post("/api/models/ltd/items", json={"folder": "many"})
        assert r.status_code == 201, r.text
        assert len({it["id"] for it in r.json()["items"]}) == 70
    assert sum(sizes) == 70 and max(sizes) <= 32 and len(sizes) >= 3


def test_a_folder_add_whose_embedder_is_killed_fails_whole_and_the_next_one_works(tiny_index_pair, tmp_path, photos,
                                                                                monkeypatch):
    import os
    import signal

    from search.embed_process import ProcessEmbedder

    real, calls = ProcessEmbedder.embed_files, []

    def killed_on_the_second_request(self, paths, min_side, root):
        calls.append(len(paths))
        if len(calls) == 2:
            os.kill(self.pid, signal.SIGKILL)
        return real(self, paths, min_side, root)

    monkeypatch.setattr(ProcessEmbedder, "embed_files", killed_on_the_second_request)
    with serve(tiny_index_pair, tmp_path, photos, max_items_per_add=2) as c:
        before = c.get("/api/models/ltd/items", params={"limit": 1000}).json()["items"]
        r = c.post("/api/models/ltd/items", json={"folder": "trip"})
        assert r.status_code == 503 and "error" in r.json(), r.text
        assert c.get("/api/models/ltd/items", params={"limit": 1000}).json()["items"] == before  # none of it
        r = c.post("/api/models/ltd/items", json={"folder": "trip"})  # a new embedder process
        assert r.status_code == 201 and sum(it.get("id") is not None for it in r.json()["items"]) == 3, r.text
