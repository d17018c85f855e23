"""Issue 53's attacks (round three), in process: each test is the attack, and the recorders show that
nothing reached out or decoded what it must not. The live attacks (slow bodies, held streams, forwarded
headers, the training agent's ports) are in tests/test_security_r3_live.py.
"""
from __future__ import annotations

import base64
import io
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest
import test_ui_guard
from conftest import pair_settings
from fastapi.testclient import TestClient
from PIL import Image
from test_security_exposed import _abandoned_upload, _rewrite_images_meta
from test_ui_guard import _call, _image_event

from app.api.main import create_app
from search import SearchService

ABS = ("/tmp/", "/root/", "/home/", "/work/")
fetches = test_ui_guard.fetches  # the fixture: every download and name resolution Gradio could start


@pytest.fixture(scope="module")
def service(pair_service) -> SearchService:
    return pair_service


@pytest.fixture(scope="module")
def ui(tiny_index_pair, service):
    with TestClient(create_app(pair_settings(tiny_index_pair, ui=True), service=service)) as c:
        yield c


@pytest.fixture(scope="module")
def bomb_data_url() -> str:
    """Row 1's payload: a 1-bit PNG of 16,383 × 16,383 pixels, ~43 KB, as a data URL."""
    buf = io.BytesIO()
    Image.new("1", (16383, 16383), 0).save(buf, "PNG", optimize=True)
    assert len(buf.getvalue()) < 100_000
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def decodes(monkeypatch) -> list:
    """Every base64 image decode Gradio could start, recorded (and refused)."""
    import gradio.image_utils as iu

    calls: list = []
    for name in ("decode_base64_to_image", "decode_base64_to_image_array", "decode_base64_to_file"):
        def record(*args, _name=name, **kwargs):
            calls.append(_name)
            raise AssertionError(f"{_name} must not run")
        monkeypatch.setattr(iu, name, record)
    return calls


# ---- 1: data URLs in any file-shaped or image value -------------------------------------------------
def test_data_url_image_values_are_refused_whatever_their_keys(ui, bomb_data_url, decodes, fetches):
    api, fn, n, pos = _image_event(ui)
    shapes = [{"path": None, "url": bomb_data_url, "meta": {"_type": "gradio.FileData"}},
              {"url": bomb_data_url},  # no marker, no path
              {"path": bomb_data_url, "meta": {"_type": "gradio.FileData"}},
              {"image": {"url": bomb_data_url, "path": None}, "caption": "x"},  # nested, as a gallery value
              bomb_data_url, "  DATA:image/png;base64,AAAA"]  # a bare string, any case
    for value in shapes:
        data: list = [None] * n
        data[pos] = value
        status, text = _call(ui, api, data)
        assert status == 400 and "forbidden_file" in text, (value if isinstance(value, str) else list(value), text)
        r = ui.post("/ui/gradio_api/queue/join", json={"data": data, "fn_index": fn, "session_hash": "s1",
                                                       "event_data": {"value": value}})
        assert r.status_code == 400 and r.json()["error"] == "forbidden_file"
    assert decodes == [] and fetches == []
    assert ui.get("/api/health").status_code == 200


def test_a_file_value_whose_url_names_another_file_is_refused(ui, tmp_path, no_outside_network):
    from gradio.utils import get_upload_folder

    up = ui.post("/ui/gradio_api/upload", files={"files": ("a.png", _png())}).json()[0]
    api, _, n, pos = _image_event(ui)
    real = str(Path(get_upload_folder()) / up.removeprefix("@ltd-uploads/"))
    for url in ("http://127.0.0.1:1/ui/gradio_api/file=/etc/passwd", "file:///etc/passwd", "//example.com/x.png",
                "https://example.com/x.png"):
        data: list = [None] * n
        data[pos] = {"path": up, "url": url, "meta": {"_type": "gradio.FileData"}}
        assert _call(ui, api, data)[0] == 400, url
    for url in (f"http://127.0.0.1:8000/ui/gradio_api/file={up}", f"/ui/gradio_api/file={real}", None, up):
        data = [None] * n
        data[pos] = {"path": up, "url": url, "meta": {"_type": "gradio.FileData"}}
        assert _call(ui, api, data)[0] == 200, url


def _png(size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


# ---- 3: every Gradio route the UI does not use ------------------------------------------------------
GRADIO_ROUTES_NOT_USED = [
    ("GET", "/ui/gradio_api/file/http://127.0.0.1:1/x.png"), ("GET", "/ui/gradio_api/file/etc/passwd"),
    ("GET", "/ui/gradio_api/proxy=http://127.0.0.1:1/"), ("GET", "/ui/gradio_api/file=https://127.0.0.1:1/x"),
    ("GET", "/ui/gradio_api/file=data:image/png;base64,AAAA"), ("POST", "/ui/gradio_api/stream/abc"),
    ("GET", "/ui/gradio_api/mcp/sse"), ("GET", "/ui/monitoring"), ("GET", "/ui/gradio_api/vibe-code"),
    ("POST", "/ui/gradio_api/vibe-edit"), ("GET", "/ui/gradio_api/dev/reload"), ("GET", "/ui/gradio_api/user"),
    ("GET", "/ui/gradio_api/token"), ("GET", "/ui/gradio_api/app_id"), ("POST", "/ui/login"), ("GET", "/ui/logout"),
    ("GET", "/ui/gradio_api/run-history/buckets"), ("GET", "/ui/gradio_api/runs"),
    ("GET", "/ui/gradio_api/deep_link"), ("POST", "/ui/gradio_api/process_recording"),
    ("GET", "/ui/gradio_api/custom_component/1/client/index.js/x"), ("POST", "/ui/gradio_api/reset"),
    ("POST", "/ui/gradio_api/component_server"), ("GET", "/ui/gradio_api/openapi.json"),
    ("OPTIONS", "/ui/config"), ("PUT", "/ui/gradio_api/queue/join"), ("GET", "/ui/gradio_api/startup-events"),
]


def test_only_the_uis_own_routes_answer(ui, fetches):
    for method, path in GRADIO_ROUTES_NOT_USED:
        r = ui.request(method, path)
        assert r.status_code in (403, 404), (method, path, r.status_code)
        assert r.headers["content-type"].startswith("application/json"), (method, path)
    assert fetches == []
    for path in ("/ui/", "/ui/config", "/ui/gradio_api/info", "/ui/theme.css"):  # what the page needs still works
        assert ui.get(path).status_code == 200, path


def test_the_ui_grants_no_cross_origin_reads(ui, no_outside_network):
    for origin in ("http://localhost:1234", "http://127.0.0.1:9", "https://evil.example"):
        r = ui.get("/ui/config", headers={"Origin": origin})
        assert r.status_code == 200 and not any(k.lower().startswith("access-control-") for k in r.headers), origin


# ---- 7: unknown or malformed calls are 4xx, one log line --------------------------------------------
def test_unknown_and_malformed_calls_are_4xx_with_one_line(ui, caplog):
    api, fn, n, _ = _image_event(ui)
    bad = [("/ui/gradio_api/run/no_such_api", {"data": []}, 404), ("/ui/gradio_api/call/v2/upload_image", {"data": []}, 404),
           ("/ui/gradio_api/call/no_such_api", {"data": []}, 404), (f"/ui/gradio_api/call/{api}", {"data": []}, 422),
           (f"/ui/gradio_api/call/{api}", {"data": "x"}, 422), (f"/ui/gradio_api/call/{api}", [1, 2], 422),
           ("/ui/gradio_api/queue/join", {"data": [None] * n, "fn_index": 10**6, "session_hash": "s"}, 422),
           ("/ui/gradio_api/queue/join", {"data": [None] * (n + 1), "fn_index": fn, "session_hash": "s"}, 422),
           ("/ui/gradio_api/queue/join", {"data": [None] * n, "fn_index": fn, "session_hash": "../x"}, 422),
           ("/ui/gradio_api/queue/join", {"data": [None] * n, "fn_index": True, "session_hash": "s"}, 422)]
    for path, body, status in bad:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            r = ui.post(path, json=body)
        assert r.status_code == status and "error" in r.json(), (path, body, r.status_code, r.text[:200])
        ours = [rec for rec in caplog.records if not rec.name.startswith("httpx")]  # not the test client's own
        assert not any(rec.exc_info for rec in ours) and len(ours) <= 1, (path, caplog.text[:500])
    r = ui.post(f"/ui/gradio_api/call/{api}", content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 400


# ---- 9: no absolute path in any UI answer -----------------------------------------------------------
def test_ui_answers_name_no_server_folder(ui, service):
    from gradio.utils import get_upload_folder

    folders = [str(Path(get_upload_folder()).resolve()), str(service.thumbnails.private_folder())]
    up = ui.post("/ui/gradio_api/upload", files={"files": ("b.png", _png())})
    cfg = ui.get("/ui/config").json()
    on_load = next(d["api_name"] for d in cfg["dependencies"] if d.get("api_name") == "on_load")
    status, events = _call(ui, on_load, ["bl", "bl"])
    api, _, n, pos = _image_event(ui)
    data: list = [None] * n
    data[pos] = {"path": up.json()[0], "meta": {"_type": "gradio.FileData"}}
    shown = [up.text, events, _call(ui, api, data)[1], ui.get("/ui/").text, json.dumps(cfg)]
    assert status == 200 and "@ltd-" in events  # the gallery's thumbnails are named under an alias
    for text in shown:
        assert not any(f in text for f in folders), text[:300]
        assert not any(a in text for a in ABS), [line for line in text.splitlines() if any(a in line for a in ABS)][:2]
    name = json.loads(up.text)[0]
    assert ui.get(f"/ui/gradio_api/file={name}").content == _png()  # the alias is served, as the browser asks


# ---- 10: /api/models with one model down --------------------------------------------------------------
def test_models_lists_the_healthy_and_marks_the_broken(tiny_index_pair, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_index_pair["ltd"], broken)
    (broken / "manifest.json").write_text("{" * 50)
    settings = pair_settings(tiny_index_pair, models={"bl": str(tiny_index_pair["bl"]), "ltd": str(broken)})
    with TestClient(create_app(settings)) as c:
        assert c.get("/api/health").json()["status"] == "degraded"
        r = c.get("/api/models")
        assert r.status_code == 200, r.text
        by_name = {m["name"]: m for m in r.json()}
        assert by_name["bl"]["status"] == "ok" and by_name["bl"]["counts"]["images"] > 0
        assert by_name["ltd"]["status"] == "down" and by_name["ltd"]["detail"] and by_name["ltd"]["counts"] is None
        assert str(tmp_path) not in r.text
        assert c.get("/api/models/ltd").status_code == 503 and c.get("/api/models/bl").status_code == 200


# ---- 12: an abandoned UI body ---------------------------------------------------------------------------
def test_an_abandoned_ui_event_body_is_a_499(tiny_index_pair, service):
    import anyio

    app = create_app(pair_settings(tiny_index_pair, ui=True), service=service)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/ui/gradio_api/queue/join", "raw_path": b"/ui/gradio_api/queue/join", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                          (b"content-length", b"5000")],
             "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8000), "state": {}}
    chunks = [{"type": "http.request", "body": b'{"data": [', "more_body": True}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        pass

    with TestClient(app) as c:  # the lifespan, so the mount exists
        anyio.run(app, scope, receive, send)
        _abandoned_upload(app, "/ui/gradio_api/upload", "files")
        metrics = c.get("/metrics").text
    rows = [line for line in metrics.splitlines() if line.startswith("ltd_http_requests_total") and "/ui" in line]
    assert any('status="499"' in r for r in rows) and not any('status="5' in r for r in rows), rows


# ---- 8: a manifest cannot widen where images are read from -------------------------------------------
def test_a_manifest_cannot_widen_the_image_folders(tiny_index_pair, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "private.png").write_bytes(_png((5, 5)))
    index = shutil.copytree(tiny_index_pair["ltd"], tmp_path / "crafted")

    def edit(meta):
        meta["paths"][0] = str(elsewhere / "private.png")

    _rewrite_images_meta(index, edit)
    mf = json.loads((index / "manifest.json").read_text())
    mf["image_roots"] = ["/"]
    (index / "manifest.json").write_text(json.dumps(mf))
    image_id = json.loads((index / mf["files"]["images.json"]["file"]).read_text())["ids"][0]
    for roots, served in (([], False), ([str(elsewhere)], True)):
        settings = pair_settings(tiny_index_pair, models={"x": str(index)}, images_roots=roots)
        with TestClient(create_app(settings)) as c:
            r = c.get(f"/api/images/{image_id}?model=x")
            assert (r.status_code == 200) == served, (roots, r.status_code, r.text[:200])
            if served:
                assert r.content == _png((5, 5))
            else:
                assert r.status_code == 404 and str(elsewhere) not in r.text


def test_ltd_index_records_the_folders_it_was_given(tiny_index_pair):
    from indexer.image_roots import recorded

    mf = json.loads((Path(tiny_index_pair["bl"]) / "manifest.json").read_text())
    assert sorted(map(str, recorded(tiny_index_pair["bl"]))) == sorted(mf["image_roots"])
    assert recorded(Path(tiny_index_pair["bl"]).parent / "never-built") == []


# ---- 6: engine files are verified by content -----------------------------------------------------------
def test_a_planted_engine_file_is_exported_again_not_loaded(tmp_path):
    pytest.importorskip("onnxruntime")
    import numpy as np
    import torch

    from training.models.runtimes import onnx_once, ort_session

    torch.manual_seed(0)
    real = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    planted = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    with torch.no_grad():
        planted[0].weight.zero_()
        planted[0].bias.fill_(1.0)  # answers the same for every input: "three uploads, the same top-5"
    args = (torch.zeros(1, 4), ["x"], {"x": {0: "batch"}, "y": {0: "batch"}}, tmp_path)
    path = onnx_once("probe", real, args[0:1], *args[1:], "a probe")
    folder = path.parent
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700  # a private folder
    evil = onnx_once("evil", planted, args[0:1], *args[1:], "the planted model")
    shutil.copyfile(evil, path)  # planted under the real engine's name
    again = onnx_once("probe", real, args[0:1], *args[1:], "a probe")
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    y = ort_session(again).run(None, {"x": x})[0]
    assert np.allclose(y, real(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
    os.unlink(path)
    os.symlink(evil, path)  # a link to a file of the right digest is not a regular file: exported again
    assert not os.path.islink(onnx_once("probe", real, args[0:1], *args[1:], "a probe"))


def test_every_promise_in_the_security_guide_names_a_test_that_exists():
    import re

    root = Path(__file__).resolve().parent.parent
    table = (root / "docs/guides/security.md").read_text().split("## Promises and the tests that keep them", 1)[1]
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", table)
    assert len(named) >= 30
    for file, test in named:
        assert re.search(rf"^def {test}\(", (root / file).read_text(), re.M), f"{file}::{test}"
