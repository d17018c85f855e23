"""Issue 35, findings 1 and 4: the mounted UI fetches no URL and keeps only images, in a bounded cache.

In process (TestClient: no sockets). Gradio's downloaders and the network are replaced by recorders:
a control run on a plain Gradio mount shows they see the download Gradio would make, and the same
payloads on every UI route of our app never reach them.
"""
from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient
from PIL import Image

from app.api.main import create_app
from app.api.settings import Settings
from search import SearchService

URLS = ["http://example.com/cat.png", "https://93.184.215.14/x.jpg", "HTTP://example.com/y.png"]


def _settings(pair, **kw) -> Settings:
    return pair_settings(pair, **({"ui": True} | kw))


@pytest.fixture(scope="module")
def service(pair_service) -> SearchService:
    return pair_service


@pytest.fixture
def fetches(monkeypatch, no_outside_network) -> list:
    """Every download Gradio could start, recorded (and refused); any name resolution or connection beyond
    loopback is refused and fails the test (``no_outside_network``, tests/netguard.py)."""
    import gradio.processing_utils as pu
    import gradio.routes as gr_routes

    calls: list = []

    def recorder(name):
        def record(*args, **kwargs):
            calls.append((name, args[:1]))
            raise ConnectionRefusedError(f"{name}: the test allows no network")

        async def arecord(*args, **kwargs):
            return record(*args, **kwargs)
        return record, arecord

    for name in ("ssrf_protected_download", "unsafe_download", "save_url_to_cache"):
        monkeypatch.setattr(pu, name, recorder(name)[0])
    for name in ("async_ssrf_protected_download", "async_ssrf_protected_get"):
        monkeypatch.setattr(pu, name, recorder(name)[1])
    monkeypatch.setattr(gr_routes, "secure_url_stream_response", recorder("secure_url_stream_response")[1])
    return calls


def _image_event(client: TestClient) -> tuple[str, int, int, int]:
    """(api name, fn index, number of inputs, position of the image input) of the image search event."""
    cfg = client.get("/ui/config").json()
    images = {c["id"] for c in cfg["components"] if c.get("type") == "image"}
    for k, d in enumerate(cfg["dependencies"]):
        for pos, cid in enumerate(d.get("inputs", [])):
            if cid in images and d.get("api_name"):
                return d["api_name"], d.get("id", k), len(d["inputs"]), pos
    raise AssertionError("no UI event takes an image")


def _file(path: str) -> dict:
    return {"path": path, "url": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "x.png"}


def _call(client: TestClient, api: str, data: list) -> tuple[int, str]:
    r = client.post(f"/ui/gradio_api/call/{api}", json={"data": data})
    if r.status_code != 200:
        return r.status_code, r.text
    return r.status_code, client.get(f"/ui/gradio_api/call/{api}/{r.json()['event_id']}").text


def test_control_a_plain_gradio_mount_downloads_the_url(service, fetches):
    """The recorders are wired to the path Gradio takes: without the guard, the URL is fetched."""
    import gradio as gr
    from fastapi import FastAPI

    from ui.app import build_ui

    blocks = build_ui(service)
    app = gr.mount_gradio_app(FastAPI(), blocks, path="/ui")
    blocks.has_launched = True  # as app/api/main.py does
    with TestClient(app) as c:
        api, _, n, pos = _image_event(c)
        data = [None] * n
        data[pos] = _file(URLS[0])
        _call(c, api, data)
    assert any(name.startswith(("async_ssrf", "ssrf", "save_url")) for name, _ in fetches), fetches


def test_no_ui_route_fetches_a_url_or_reads_a_server_path(tiny_index_pair, service, fetches, tmp_path):
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG\r\n\x1a\nSECRET")
    with TestClient(create_app(_settings(tiny_index_pair), service=service)) as c:
        api, fn, n, pos = _image_event(c)
        for bad in [*URLS, str(secret), "/etc/passwd", "//example.com/x.png", "../../etc/passwd"]:
            data: list = [None] * n
            data[pos] = _file(bad)
            nested = [{"deep": [[{"x": _file(bad)}]]}] + [None] * (n - 1)  # anywhere in the payload
            bodies = {f"/ui/gradio_api/call/{api}": {"data": data},
                      "/ui/gradio_api/queue/join": {"data": nested, "fn_index": fn, "session_hash": "s1",
                                                    "event_data": {"value": _file(bad)}}}
            for route, body in bodies.items():
                r = c.post(route, json=body)
                assert r.status_code == 400 and r.json()["error"] == "forbidden_file", (route, bad, r.text[:200])
            # Gradio's other routes that take such payloads are not the UI's: refused before Gradio sees them
            others = {f"/ui/gradio_api/run/{api}": {"data": data}, f"/ui/gradio_api/api/{api}": {"data": data},
                      f"/ui/gradio_api/call/v2/{api}": {"data": data},
                      "/ui/gradio_api/component_server": {"data": _file(bad), "component_id": 1,
                                                          "session_hash": "s1", "fn_name": "x"}}
            for route, body in others.items():
                r = c.post(route, json=body)
                assert r.status_code == 404 and r.json()["error"] == "not_found", (route, bad, r.text[:200])
        assert c.get("/api/health").status_code == 200
    assert fetches == []


def _png(size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def test_ui_uploads_keep_only_images(tiny_index_pair, service, fetches):
    from gradio.utils import get_upload_folder

    folder = Path(get_upload_folder())
    with TestClient(create_app(_settings(tiny_index_pair), service=service)) as c:
        before = {p for p in folder.rglob("*") if p.is_file()}
        for name, data in (("noise.png", os.urandom(1 << 20)), ("magic-only.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 500),
                           ("page.html", b"<script>alert(1)</script>")):
            r = c.post("/ui/gradio_api/upload", files={"files": (name, data)})
            assert r.status_code == 415, (name, r.text)
        r = c.post("/ui/gradio_api/upload", files=[("files", (f"{k}.png", _png())) for k in range(6)])
        assert r.status_code == 413
        assert {p for p in folder.rglob("*") if p.is_file()} == before  # nothing was kept
        r = c.post("/ui/gradio_api/upload", files={"files": ("ok.png", _png())})
        # the answer names the file under the upload folder's alias, never the server's folder
        shown = r.json()[0]
        assert r.status_code == 200 and shown.startswith("@ltd-uploads/") and str(folder) not in r.text
        assert (folder / shown.removeprefix("@ltd-uploads/")).is_file()
        # and the uploaded file is what the UI's events may name
        api, _, n, pos = _image_event(c)
        data: list = [None] * n
        data[pos] = _file(r.json()[0])
        assert c.post(f"/ui/gradio_api/call/{api}", json={"data": data}).status_code == 200


def test_upload_cache_is_bounded_by_age_count_and_size(tmp_path):
    from app.api.ui_guard import UploadCache

    folder = tmp_path / "cache"
    now = time.time()
    for k in range(10):
        d = folder / f"h{k}"
        d.mkdir(parents=True)
        f = d / "x.png"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (now - 100 * (10 - k), now - 100 * (10 - k)))  # h0 oldest
    cache = UploadCache(folder, max_bytes=5_500, max_age=750, max_files=8)
    assert cache.sweep() == 5  # 3 past the age (h0..h2), then 2 more for the 5,500-byte bound
    left = sorted(p.parent.name for p in folder.rglob("*.png"))
    assert left == ["h5", "h6", "h7", "h8", "h9"] and sorted(p.name for p in folder.iterdir()) == left
    assert UploadCache(folder, max_bytes=10**9, max_age=10**6, max_files=2).sweep() == 3
