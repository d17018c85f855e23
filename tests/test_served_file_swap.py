"""A served image's file swapped between the server's check and its read (search/files.py
``open_served``): someone who can write in an image folder replaces a checked file — or a folder on its
path — with a link to a file outside the index's folders, or with a FIFO. The server's path check
happens first; the swap is made right after it (a wrapper of ``servable_image``), where a real race
would put it. Every such read is refused with a 404; the outside file's bytes are never sent."""

from __future__ import annotations

import io
import os
import shutil

import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient
from PIL import Image

import search.service as service_module
from app.api.main import create_app
from indexer import image_roots
from indexer.index import read_manifest


def jpeg(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), color).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture
def served(tiny_index_pair, tmp_path):
    """A writable copy of the tiny LTD index with one uploaded image: (client, its id, its file)."""
    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "ltd")
    image_roots.record(index, read_manifest(index)["image_roots"])
    with TestClient(create_app(pair_settings(tiny_index_pair, models={"ltd": str(index)}, writable=True))) as c:
        r = c.post("/api/models/ltd/items", files=[("file", ("mine.jpg", jpeg((20, 120, 200))))])
        assert r.status_code == 201, r.text
        image_id = r.json()["items"][0]["id"]
        e = c.app.state.service.registry.get("ltd")
        yield c, image_id, e.index.image_file(e.image_pos[image_id])


def swap_after_check(monkeypatch, swap):
    original = service_module.servable_image

    def checked_then_swapped(path, what):
        out = original(path, what)
        swap(path)
        return out

    monkeypatch.setattr(service_module, "servable_image", checked_then_swapped)


def test_an_unswapped_file_is_served_through_its_descriptor(served):
    c, image_id, path = served
    c.get(f"/api/images/{image_id}?model=ltd")
    fds = len(os.listdir("/proc/self/fd"))
    r = c.get(f"/api/images/{image_id}?model=ltd")
    assert r.status_code == 200 and r.content == path.read_bytes() and r.headers["content-type"] == "image/jpeg"
    assert c.get(f"/api/images/{image_id}?model=ltd", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    part = c.get(f"/api/images/{image_id}?model=ltd", headers={"Range": "bytes=0-9"})
    assert part.status_code == 206 and part.content == path.read_bytes()[:10]
    assert c.get(f"/api/images/{image_id}/thumbnail?model=ltd&size=32").status_code == 200
    for _ in range(20):
        c.get(f"/api/images/{image_id}?model=ltd", headers={"If-None-Match": r.headers["etag"]})
        c.get(f"/api/images/{image_id}?model=ltd")
    assert len(os.listdir("/proc/self/fd")) <= fds + 2  # every descriptor the route opened is closed again


@pytest.mark.parametrize("route", ["", "/thumbnail"])
@pytest.mark.parametrize("how", ["the file by a link", "its folder by a link", "the file by a FIFO"])
def test_a_file_swapped_after_the_check_is_not_read(served, tmp_path, monkeypatch, how, route):
    c, image_id, path = served
    secret = tmp_path / "outside" / path.parent.name / path.name
    secret.parent.mkdir(parents=True)
    secret.write_bytes(jpeg((250, 10, 10)))

    def swap(p):
        if how == "the file by a link":
            p.unlink()
            p.symlink_to(secret)
        elif how == "its folder by a link":
            shutil.rmtree(p.parent)
            p.parent.symlink_to(secret.parent, target_is_directory=True)
        else:
            p.unlink()
            os.mkfifo(p)

    swap_after_check(monkeypatch, swap)
    r = c.get(f"/api/images/{image_id}{route}?model=ltd")  # a FIFO: answered at once, no reader left waiting
    assert r.status_code == 404, r.text
    assert r.headers["content-type"].startswith("application/json") and secret.read_bytes() not in r.content
