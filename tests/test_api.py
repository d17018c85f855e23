"""REST API (app/api/main.py, app/api/routers/): every endpoint, every limit, every kind of bad input.

In-process with FastAPI's TestClient over the session's two tiny trained models (``bl``, ``ltd``).
"""
from __future__ import annotations

import io
import json
import re
import shutil
import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient
from PIL import Image

from app.api.main import create_app
from app.api.routers.deps import get_service
from app.api.schemas import CompareResponse, ImageSearchResponse, TextSearchResponse
from app.api.settings import Settings
from search import SearchService

MB = 1024 * 1024


@pytest.fixture(scope="module")
def service(pair_service) -> SearchService:
    return pair_service


@pytest.fixture(scope="module")
def client(tiny_index_pair, service):
    app = create_app(pair_settings(tiny_index_pair), service=service)
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def ids(service) -> dict:
    e = service.registry.entries["bl"]
    return {"image": int(e.index.images.ids[0]), "caption": int(e.index.captions.ids[0]),
            "image_path": Path(e.index.images.meta["paths"][0]),
            "captions_of_image": [int(e.index.captions.ids[p]) for p in e.index.images.meta["captions"][0]]}


@pytest.fixture(scope="module")
def jpeg(ids) -> bytes:
    return ids["image_path"].read_bytes()


def _png(width: int, height: int) -> bytes:
    """A PNG header claiming width × height pixels (no real pixel data: nothing to decode)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def assert_error(r, status: int, error: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) >= {"error", "detail"} and isinstance(body["detail"], str) and body["detail"]
    if error:
        assert body["error"] == error, body
    return body


# ---- health and models ---------------------------------------------------------------------------
def test_health_and_models(client):
    r = client.get("/api/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["loaded"] == ["bl", "ltd"]
    models = client.get("/api/models").json()
    assert [m["name"] for m in models] == ["bl", "ltd"]
    for m in models:
        assert m["dataset"] == "synthetic" and m["split"] == "test" and m["ground_truth"] is True
        assert m["counts"]["images"] > 0 and m["counts"]["captions"] > 0 and m["dim"] == 64
        assert "rsum" in m["eval"] and m["manifest"]["checkpoint_sha256"]
    assert client.get("/api/models/ltd").json()["name"] == "ltd"
    assert assert_error(client.get("/api/models/nope"), 404, "not_found")["valid_models"] == ["bl", "ltd"]


def test_health_while_loading_then_ready(tiny_index_pair, monkeypatch):
    import search.registry

    gate = threading.Event()
    real = search.registry.load_entry

    def gated(*a, **kw):  # loading waits for a gate the test opens
        assert gate.wait(60), "gate never opened"
        return real(*a, **kw)

    monkeypatch.setattr(search.registry, "load_entry", gated)
    settings = pair_settings(tiny_index_pair, load_in_background=True, text_batching=True)
    svc = settings.search_service()
    with TestClient(create_app(settings, service=svc)) as c:
        r = c.get("/api/health")
        assert r.status_code == 503 and r.json()["status"] == "loading" and r.json()["loaded"] == []
        assert_error(c.post("/api/search/text", json={"query": "a red square"}), 503, "not_ready")
        assert_error(c.get("/api/models"), 503, "not_ready")
        gate.set()
        assert svc.registry.ready.wait(60)
        r = c.get("/api/health")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert c.post("/api/search/text", json={"query": "a red square"}).status_code == 200
    svc.close()


def test_health_reports_load_failure(tiny_index_pair, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_index_pair["bl"], bad)
    mf = json.loads((bad / "manifest.json").read_text())
    mf["checkpoint_sha256"] = "0" * 64  # an index that another checkpoint built
    (bad / "manifest.json").write_text(json.dumps(mf))
    settings = Settings(models={"bad": str(bad)}, ui=False, load_in_background=True)
    app = create_app(settings)
    with TestClient(app) as c:
        assert app.state.service.registry.ready.wait(60)
        r = c.get("/api/health")
        assert r.status_code == 503 and r.json()["status"] == "error"
        assert "checkpoint" in r.json()["detail"]
        assert_error(c.post("/api/search/text", json={"query": "x"}), 503, "not_ready")
    with pytest.raises(Exception, match="checkpoint"):  # loading in the foreground fails the start-up
        with TestClient(create_app(settings.model_copy(update={"load_in_background": False}))):
            pass


# ---- text → images ---------------------------------------------------------------------------------
def test_search_text_query(client):
    r = client.post("/api/search/text", json={"query": "  a red   square ", "model": "ltd", "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "ltd" and body["direction"] == "t2i" and body["query"]["text"] == "a red square"
    assert [h["rank"] for h in body["results"]] == [1, 2, 3]
    scores = [h["score"] for h in body["results"]]
    assert scores == sorted(scores, reverse=True)
    h = body["results"][0]
    assert h["image_url"] == f"/api/images/{h['id']}?model=ltd" and h["thumbnail_url"].startswith(f"/api/images/{h['id']}/thumbnail")
    assert h["ground_truth"] is None and body["metrics"] is None
    assert client.get(h["image_url"]).status_code == 200 and client.get(h["thumbnail_url"]).status_code == 200
    assert client.post("/api/search/text", json={"query": "a red square"}).json()["model"] == "bl"  # default model


def test_search_text_caption_id_has_ground_truth(client, ids, service):
    r = client.post("/api/search/text", json={"caption_id": ids["caption"], "model": "bl", "k": 1000})
    body = r.json()
    n_images = len(service.registry.entries["bl"].index.images.ids)
    assert r.status_code == 200 and len(body["results"]) == n_images  # k larger than the index: all of it
    gt = [h for h in body["results"] if h["ground_truth"]]
    assert len(gt) == 1 and body["ground_truth_ids"] == [gt[0]["id"]]
    assert body["metrics"]["first_gt_rank"] == gt[0]["rank"] and body["metrics"]["k"] == n_images
    assert 0 <= body["metrics"]["ndcg_at_k"] <= 1 and body["metrics"]["ndcg_relevance"] == "rougeL"
    assert all(h["relevance"] is not None for h in body["results"])
    assert body["query"]["caption_id"] == ids["caption"] and body["query"]["text"]


@pytest.mark.parametrize("payload", [
    {"query": ""}, {"query": "   \n\t "}, {"query": "x" * 10_000}, {"query": "a", "k": 0}, {"query": "a", "k": 10**6},
    {"query": "a", "k": -1}, {"query": "a", "k": "ten"}, {"query": "a", "k": 2.5}, {"query": None}, {"query": 5},
    {}, {"k": 5}, {"query": "a", "caption_id": 1}, {"query": "a", "color": "red"}, {"caption_id": -1},
    {"caption_id": 2**64}, {"query": "a", "model": ""}, [1, 2], "query",
])
def test_search_text_rejects_bad_input(client, payload):
    body = assert_error(client.post("/api/search/text", json=payload), 422, "validation_error")
    assert body["errors"] and all({"loc", "msg", "type"} <= set(e) for e in body["errors"])


def test_query_length_counts_after_trimming(client):
    assert client.post("/api/search/text", json={"query": "y" * 1000}).status_code == 200
    assert client.post("/api/search/text", json={"query": "   " + "y" * 1000 + " \n"}).status_code == 200
    assert_error(client.post("/api/search/text", json={"query": "y" * 1001}), 422)


def test_search_text_unknown_ids_and_models(client):
    body = assert_error(client.post("/api/search/text", json={"query": "a", "model": "nope"}), 404, "not_found")
    assert body["valid_models"] == ["bl", "ltd"] and "bl, ltd" in body["detail"]
    assert_error(client.post("/api/search/text", json={"caption_id": 10**9}), 404, "not_found")


def test_malformed_bodies(client):
    assert_error(client.post("/api/search/text", content=b'{"query": "a"', headers={"content-type": "application/json"}), 422)
    assert_error(client.post("/api/search/text", content=b"\xff\xfe", headers={"content-type": "application/json"}), 422)
    r = client.post("/api/search/text", content=b"query=a", headers={"content-type": "application/x-www-form-urlencoded"})
    assert 400 <= r.status_code < 500 and set(r.json()) >= {"error", "detail"}
    assert_error(client.post("/api/search/text", json={"query": "a" * 70_000}), 413, "payload_too_large")


# ---- image → captions ------------------------------------------------------------------------------
def test_search_image_by_id(client, ids):
    r = client.post("/api/search/image", json={"image_id": ids["image"], "model": "ltd", "k": 5})
    body = r.json()
    assert r.status_code == 200 and body["direction"] == "i2t" and len(body["results"]) == 5
    assert sorted(body["ground_truth_ids"]) == sorted(ids["captions_of_image"])
    h = body["results"][0]
    assert h["text"] and h["image_id"] is not None and h["image_url"] == f"/api/images/{h['image_id']}?model=ltd"
    assert body["metrics"]["first_gt_rank"] >= 1
    assert any(x["ground_truth"] for x in client.post("/api/search/image", json={"image_id": ids["image"], "k": 1000}).json()["results"])


def test_search_image_upload(client, jpeg):
    r = client.post("/api/search/image", files={"file": ("x.jpg", jpeg, "image/jpeg")}, data={"model": "bl", "k": "4"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["query"]["upload"] is True and len(body["results"]) == 4 and body["metrics"] is None
    png = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).save(png, "PNG")
    # the declared content type of the part does not matter: the bytes are sniffed
    assert client.post("/api/search/image", files={"file": ("x.bin", png.getvalue(), "application/octet-stream")}).status_code == 200


def test_search_image_rejects_bad_uploads(client, jpeg):
    def up(data, **form):
        return client.post("/api/search/image", files={"file": ("f", data, "image/jpeg")}, data=form)

    assert_error(up(b"hello, I am not an image" * 10), 415, "unsupported_media_type")
    assert_error(up(b"%PDF-1.4 not an image"), 415)
    assert_error(up(jpeg[: len(jpeg) // 2]), 400, "bad_request")  # truncated JPEG
    assert_error(up(jpeg[:20]), 400)
    assert_error(up(b""), 400)
    assert "decompression" in assert_error(up(_png(20_000, 20_000)), 400)["detail"]  # bomb: refused before decoding
    assert "exceeds" in assert_error(up(_png(8_000, 8_000)), 400)["detail"]  # over max_upload_pixels
    assert_error(up(jpeg, k="0"), 422)
    assert_error(up(jpeg, k="x"), 422)
    assert_error(up(jpeg, model="nope"), 404)
    assert_error(up(jpeg, colour="red"), 422)
    assert_error(client.post("/api/search/image", data={"model": "bl"}, files={"other": ("f", jpeg)}), 422)
    assert_error(client.post("/api/search/image", data={"file": "not a file"}, files={"x": ("f", b"1")}), 422)
    assert_error(client.post("/api/search/image", content=jpeg, headers={"content-type": "image/jpeg"}), 415)
    assert_error(client.post("/api/search/image", content=b"--x\r\n", headers={"content-type": "multipart/form-data"}), 400)


def test_upload_size_limits(client, jpeg):
    big = jpeg + b"\0" * (12 * MB)
    body = assert_error(client.post("/api/search/image", files={"file": ("big.jpg", big, "image/jpeg")}), 413,
                        "payload_too_large")
    assert "limit" in body["detail"]

    def chunks():  # no Content-Length: the limit stops the stream after ~10 MB
        yield jpeg
        for _ in range(12):
            yield b"\0" * MB

    r = client.post("/api/search/image", content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"})
    assert_error(r, 413)
    # just under the limit with multipart overhead: accepted by the size check (then decoded)
    ok = Image.new("RGB", (64, 64), "red")
    buf = io.BytesIO()
    ok.save(buf, "JPEG")
    padded = buf.getvalue() + b"\0" * (10 * MB - len(buf.getvalue()) - 1)
    assert client.post("/api/search/image", files={"file": ("ok.jpg", padded, "image/jpeg")}).status_code == 200


@pytest.mark.parametrize("payload", [{}, {"image_id": -1}, {"image_id": "x"}, {"image_id": 1, "k": 0},
                                     {"image_id": 1, "k": 1001}, {"image_id": 1, "query": "a"}, [], "image"])
def test_search_image_json_rejects_bad_input(client, payload):
    assert_error(client.post("/api/search/image", json=payload), 422, "validation_error")


def test_search_image_unknown(client):
    assert_error(client.post("/api/search/image", json={"image_id": 10**9}), 404)
    assert_error(client.post("/api/search/image", json={"image_id": 1, "model": "nope"}), 404)


# ---- compare ---------------------------------------------------------------------------------------
def test_compare_text_side_by_side(client):
    r = client.post("/api/compare", json={"query": "a big blue circle", "models": ["bl", "ltd"], "k": 4})
    body = r.json()
    assert r.status_code == 200 and body["direction"] == "t2i" and body["models"] == ["bl", "ltd"]
    a, b = body["results"]
    assert (a["model"], b["model"]) == ("bl", "ltd") and len(a["results"]) == len(b["results"]) == 4
    both = {h["id"] for h in a["results"]} & {h["id"] for h in b["results"]}
    assert body["overlap"] == len(both) and body["overlap_ids"] == sorted(both) and 0 <= body["jaccard"] <= 1


def test_compare_with_ground_truth(client, ids, jpeg):
    body = client.post("/api/compare", json={"caption_id": ids["caption"], "models": ["ltd", "bl"], "k": 3}).json()
    assert [r["model"] for r in body["results"]] == ["ltd", "bl"]
    assert all(r["metrics"]["first_gt_rank"] >= 1 and "precision_at_k" in r["metrics"] for r in body["results"])
    body = client.post("/api/compare", json={"image_id": ids["image"], "models": ["bl", "ltd"]}).json()
    assert body["direction"] == "i2t" and all(r["metrics"] is not None for r in body["results"])
    r = client.post("/api/compare", files={"file": ("x.jpg", jpeg, "image/jpeg")}, data={"models": ["bl", "ltd"], "k": "2"})
    assert r.status_code == 200 and r.json()["direction"] == "i2t" and len(r.json()["results"][1]["results"]) == 2
    r = client.post("/api/compare", files=[("file", ("x.jpg", jpeg, "image/jpeg"))], data={"models": ["ltd", "bl"]})
    assert r.status_code == 200 and r.json()["models"] == ["ltd", "bl"]


@pytest.mark.parametrize("path, payload, model", [
    ("/api/search/text", {"query": "a red square", "k": 3}, TextSearchResponse),
    ("/api/search/text", {"caption_id": "CAPTION", "k": 5}, TextSearchResponse),
    ("/api/search/image", {"image_id": "IMAGE", "k": 4}, ImageSearchResponse),
    ("/api/compare", {"query": "a red square", "models": ["bl", "ltd"]}, CompareResponse),
    ("/api/compare", {"image_id": "IMAGE", "models": ["ltd", "bl"]}, CompareResponse),
])
def test_answers_are_exactly_their_response_models(client, ids, path, payload, model):
    """The handlers write plain data with orjson, not the pydantic models: the reference is the model
    (every field present, of its type, nothing extra), re-serialised to the same JSON."""
    payload = {k: ids[v.lower()] if v in ("CAPTION", "IMAGE") else v for k, v in payload.items()}
    r = client.post(path, json=payload)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    body = r.json()
    assert model.model_validate(body, strict=True).model_dump(mode="json") == body


@pytest.mark.parametrize("payload", [
    {"query": "a", "models": ["bl"]}, {"query": "a", "models": ["bl", "bl"]}, {"query": "a", "models": ["bl", "ltd", "x"]},
    {"models": ["bl", "ltd"]}, {"query": "a", "image_id": 1, "models": ["bl", "ltd"]}, {"query": " ", "models": ["bl", "ltd"]},
    {"query": "a", "models": ["bl", "ltd"], "k": 0},
])
def test_compare_rejects_bad_input(client, payload):
    assert_error(client.post("/api/compare", json=payload), 422)


def test_compare_unknown_model(client, jpeg):
    assert assert_error(client.post("/api/compare", json={"query": "a", "models": ["bl", "nope"]}), 404)["valid_models"]
    assert_error(client.post("/api/compare", files={"file": ("x", jpeg)}, data={"models": "bl"}), 422)
    assert_error(client.post("/api/compare", files={"file": ("x", b"text")}, data={"models": ["bl", "ltd"]}), 415)
    assert_error(client.post("/api/compare", files={"file": ("x", jpeg)}, data={"models": ["bl", "bl"]}), 422)
    assert_error(client.post("/api/compare", files={"file": ("x", jpeg)}, data={"models": "bl,ltd"}), 422)


# ---- images, thumbnails, captions, examples --------------------------------------------------------
def test_images_are_served_with_caching_headers(client, ids, jpeg):
    r = client.get(f"/api/images/{ids['image']}")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg" and r.content == jpeg
    assert "max-age" in r.headers["cache-control"] and r.headers.get("etag")
    assert client.get(f"/api/images/{ids['image']}", headers={"if-none-match": r.headers["etag"]}).status_code == 304
    assert client.get(f"/api/images/{ids['image']}?model=ltd").content == jpeg
    t = client.get(f"/api/images/{ids['image']}/thumbnail?size=32&model=bl")
    assert t.status_code == 200 and t.headers["content-type"] == "image/jpeg" and "max-age" in t.headers["cache-control"]
    assert max(Image.open(io.BytesIO(t.content)).size) <= 32


@pytest.mark.parametrize("path,status", [
    ("/api/images/999999999", 404), ("/api/images/999999999/thumbnail", 404), ("/api/images/-1", 422),
    ("/api/images/abc", 422), ("/api/images/1.5", 422), ("/api/images/99999999999999999999999", 422),
    ("/api/images/..%2F..%2Fetc%2Fpasswd", None), ("/api/images/%2e%2e/%2e%2e/etc/passwd", None),
    ("/api/images/../../etc/passwd", None), ("/api/images/1%00", 422), ("/api/images/1/thumbnail?size=5", 422),
    ("/api/images/1/thumbnail?size=100000", 422), ("/api/images/1?model=nope", 404),
])
def test_images_refuse_unknown_and_traversal(client, path, status):
    r = client.get(path)
    if status is None:  # traversal attempts: some 4xx, JSON, never a file
        assert 400 <= r.status_code < 500, r.status_code
    else:
        assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json") and b"root:" not in r.content


def test_captions_and_examples(client, ids):
    c = client.get(f"/api/captions/{ids['caption']}").json()
    assert c["id"] == ids["caption"] and c["text"] and c["image_id"] is not None and c["image_url"]
    assert client.get(f"/api/captions/{ids['caption']}?model=ltd").json()["model"] == "ltd"
    assert_error(client.get("/api/captions/999999999"), 404)
    assert_error(client.get("/api/captions/1?model=nope"), 404)
    ex = client.get("/api/examples?model=ltd&n=5&seed=3").json()
    assert len(ex) == 5 and len({e["id"] for e in ex}) == 5
    assert ex == client.get("/api/examples?model=ltd&n=5&seed=3").json()  # reproducible by seed
    assert_error(client.get("/api/examples?n=0"), 422)
    assert_error(client.get("/api/examples?n=101"), 422)


# ---- generic errors, metrics, robustness -----------------------------------------------------------
def test_unknown_routes_and_methods_are_json(client):
    assert_error(client.get("/api/nothing-here"), 404, "not_found")
    assert_error(client.get("/nothing"), 404)
    r = client.delete("/api/health")
    assert_error(r, 405, "method_not_allowed")
    assert "GET" in r.headers["allow"]
    assert_error(client.get("/api/search/text"), 405)
    assert client.get("/openapi.json").status_code == 200 and client.get("/docs").status_code == 200


def _samples(text: str) -> set[tuple[str, frozenset]]:
    """The exposition's sample lines as (name, labels), label order aside (every value must be a number)."""
    out = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            float(value)
            name, _, labels = series.partition("{")
            pairs = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)
            out.add((name, frozenset(pairs)))
    return out


def test_metrics_exposition(client):
    assert client.post("/api/search/text", json={"query": "metrics probe"}).status_code == 200
    assert_error(client.get("/api/images/999999999"), 404)
    assert_error(client.get("/some/random/path/12345"), 404)
    assert client.get("/openapi.json").status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text, samples = r.text, _samples(r.text)

    def has(name: str, **labels) -> bool:
        return (name, frozenset(labels.items())) in samples

    assert has("ltd_http_requests_total", method="POST", route="/api/search/text", status="200")
    assert has("ltd_http_requests_total", method="GET", route="/api/images/{image_id}", status="404")
    assert 'route="<unmatched>"' in text and "12345" not in text  # raw paths never become labels
    assert has("ltd_http_requests_total", method="GET", route="/openapi.json", status="200")
    assert has("ltd_http_request_duration_seconds_bucket", method="POST", route="/api/search/text", le="+Inf")
    assert "ltd_http_request_duration_seconds_count" in text and "ltd_text_cache_hits_total" in text
    # the tiny models' GRU caption encoders run in torch; the metric says so per model
    assert has("ltd_text_runtime_info", model="ltd", runtime="torch", precision="model's")


def test_server_keeps_serving_after_bad_requests(client, jpeg):
    for _ in range(3):  # each bad request gets its own 4xx JSON answer, and the next request is served
        r = client.post("/api/search/image", files={"file": ("f", b"\x89PNG\r\n\x1a\n garbage")})
        assert r.status_code in (400, 415) and r.json()["error"], r.text
        assert_error(client.post("/api/search/text", content=b"\x00" * 100, headers={"content-type": "application/json"}),
                     422, "validation_error")
        body = assert_error(client.post("/api/compare", json={"query": "x" * 5000, "models": ["bl", "ltd"]}), 422)
        assert "1000" in body["detail"] or "1,000" in body["detail"], body
    assert client.get("/api/health").status_code == 200
    assert client.post("/api/search/text", json={"query": "still alive"}).status_code == 200


def test_unexpected_errors_become_json_500(tiny_index_pair, service):
    class Broken:
        names = ["bl"]

        def search_text(self, *a, **kw):
            raise RuntimeError("boom")

    app = create_app(pair_settings(tiny_index_pair), service=service)
    app.dependency_overrides[get_service] = lambda: Broken()
    with TestClient(app, raise_server_exceptions=False) as c:
        assert_error(c.post("/api/search/text", json={"query": "a"}), 500, "internal")
        app.dependency_overrides.clear()
        assert c.post("/api/search/text", json={"query": "a"}).status_code == 200  # still serving


# ---- the service behind it: cache and batching -----------------------------------------------------
def test_batched_cached_and_direct_encodings_agree(tiny_index_pair, service):
    texts = [f"a {c} {s} in the corner" for c in ("red", "blue", "green", "pink") for s in ("square", "circle", "cross")]
    direct = pair_settings(tiny_index_pair, text_cache=0, text_batching=False).search_service()
    direct.registry.load()
    ref = np.stack([direct.encode_text("ltd", t) for t in texts])
    assert direct.encoder.info()["hits"] == 0
    batched = pair_settings(tiny_index_pair, text_cache=0, text_batching=True).search_service()
    batched.registry.load()
    out: dict[int, np.ndarray] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, batched.encode_text("ltd", texts[i])))
               for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_allclose(np.stack([out[i] for i in range(len(texts))]), ref, atol=1e-5)
    info = batched.encoder.info()
    assert info["encoded_queries"] == len(texts) and 1 <= info["encoder_calls"] <= len(texts)
    service.encoder.clear()
    service.encode_text("bl", "a cached query")
    service.encode_text("bl", "  a cached   query ")  # same after trimming: a hit
    assert service.encoder.info()["hits"] == 1 and service.encoder.info()["misses"] == 1
    batched.close()
    direct.close()


def test_quantized_query_encoder_is_close(tiny_index_pair):
    quant = pair_settings(tiny_index_pair, text_quantize=True, text_cache=0).search_service()
    quant.registry.load()
    ref = pair_settings(tiny_index_pair, text_cache=0, text_batching=False).search_service()
    ref.registry.load()
    for text in ("a red square in the corner", "a big striped blue circle"):
        a, b = quant.encode_text("ltd", text), ref.encode_text("ltd", text)
        assert float(a @ b) / float(np.linalg.norm(a) * np.linalg.norm(b)) > 0.99
    assert quant.search_text("ltd", query="a red square", k=3).hits
    quant.close()
    ref.close()


# ---- ltd serve -------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,message", [
    ([], "no models"), (["--model", "bl"], "NAME=INDEX_DIR"), (["--model", "=x"], "NAME=INDEX_DIR"),
    (["--model", "bl="], "NAME=INDEX_DIR"), (["--model", "b/l=."], "a name is"), (["--model", "bl=/no/such/dir"], "does not exist"),
    (["--model", "bl=."], "not an index directory"), (["--port", "0", "--model", "bl=."], "--port"),
])
def test_serve_cli_rejects_bad_input(argv, message, capsys, monkeypatch):
    from app.cli import main

    monkeypatch.delenv("LTD_MODELS", raising=False)
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_serve_cli_buildspair_settings(tiny_index_pair, capsys, monkeypatch):
    import app.cli.serve as cmd
    from app.cli import main

    seen = {}
    monkeypatch.setattr(cmd, "serve", lambda settings, **kw: seen.update(settings=settings, **kw))
    bl, ltd = tiny_index_pair["bl"], tiny_index_pair["ltd"]
    common = ["serve", "--model", f"bl={bl}", "--model", f"ltd={ltd}", "--no-ui", "--port", "8123"]
    # another address than loopback is a decision: refused without --expose, before anything loads
    assert main([*common, "--host", "0.0.0.0"]) == 2
    assert "--expose" in capsys.readouterr().err and not seen
    assert main([*common, "--host", "0.0.0.0", "--expose", "--no-text-cache", "--torch-threads", "2"]) == 0
    s = seen["settings"]
    assert s.models == {"bl": str(Path(bl).resolve()), "ltd": str(Path(ltd).resolve())}
    assert (s.ui, s.text_cache, s.torch_threads, seen["port"], seen["host"]) == (False, 0, 2, 8123, "0.0.0.0")
    assert s.allowed_hosts is None  # exposed: any Host (a token, if set, guards access)
    assert main([*common, "--allowed-host", "ltd.local"]) == 0  # loopback: only loopback names
    assert seen["settings"].allowed_hosts == ["localhost", "127.0.0.1", "::1", "ltd.local"]
    assert main(["serve", "--model", f"bl={bl}@{tiny_index_pair['runs']['bl'] / 'best.pt'}", "--no-ui"]) == 0
    assert seen["settings"].checkpoints == {"bl": str((tiny_index_pair["runs"]["bl"] / "best.pt").resolve())}
    assert main(["serve", "--model", f"bl={bl}", "--model", f"bl={ltd}"]) == 2
    assert "given twice" in capsys.readouterr().err
    from app.cli.serve import urls
    assert dict(urls("0.0.0.0", 8000, True))["UI"] == "http://127.0.0.1:8000/ui"
    assert "UI" not in dict(urls("127.0.0.1", 8000, False)) and dict(urls("::1", 80, False))["API docs"] == "http://[::1]:80/docs"


@pytest.mark.slow
def test_ui_is_mounted_next_to_the_api(tiny_index_pair, service):
    app = create_app(pair_settings(tiny_index_pair, ui=True), service=service)
    assert app.state.ui_mounted  # the UI is part of the project: not mounting it is a failure
    with TestClient(app) as c:
        r = c.get("/ui/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert c.post("/api/search/text", json={"query": "a red square"}).status_code == 200
        assert 'route="/ui/"' in c.get("/metrics").text  # mounted routes keep their mount point


@pytest.mark.parametrize("path", ["/api/search/text", "/api/search/image", "/api/compare"])
@pytest.mark.parametrize("body", [
    "[" * 5000 + "]" * 5000,  # nesting past the parser's recursion limit
    '{"image_id": ' + "9" * 5000 + ', "caption_id": 1, "models": ["bl", "ltd"]}',  # over Python's int digit limit
    '{"query": "a \\ud800 dog", "models": ["bl", "ltd"]}',  # a lone surrogate: valid JSON, not valid text
    '{"query": "a dog", "k": 1e400, "models": ["bl", "ltd"]}',
    '{"query": "\\u0000", "models": ["bl", "ltd"]}',
    b'{"query": "\xff\xfe"}',
])
def test_hostile_json_bodies_are_4xx_json(client, path, body):
    """Every one of these once answered 500 (or could): each must be a 4xx with a JSON error body."""
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    assert r.json()["error"] and r.json()["detail"]


def test_hostile_multipart_fields_are_4xx_json(client, jpeg):
    for data in ({"k": "9" * 5000}, {"model": "\ud800"}, {"k": "1e400"}):
        r = client.post("/api/search/image", files={"file": ("a.jpg", jpeg, "image/jpeg")},
                        data={k: v.encode("utf-8", "surrogatepass") for k, v in data.items()})
        assert 400 <= r.status_code < 500 and r.json()["error"], (data, r.status_code, r.text[:200])


def test_a_broken_model_is_reported_and_the_others_serve(tiny_index_pair, tmp_path):
    """One model whose checkpoint is gone: health says 'degraded' and which model is down (with the
    fix), requests to it answer 503 with the reason, the other model serves; none at all: 'error'."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_index_pair["ltd"], broken)
    mf = json.loads((broken / "manifest.json").read_text())
    mf["checkpoint"], mf["checkpoint_relative"] = "/nonexistent/best.pt", "../nowhere/best.pt"
    (broken / "manifest.json").write_text(json.dumps(mf))
    svc = SearchService({"bl": str(tiny_index_pair["bl"]), "ltd": str(broken)})
    svc.registry.load()
    app = create_app(pair_settings(tiny_index_pair), service=svc)
    with TestClient(app) as c:
        h = c.get("/api/health")
        assert h.status_code == 200 and h.json()["status"] == "degraded" and h.json()["loaded"] == ["bl"]
        assert "checkpoint" in h.json()["down"]["ltd"] and "@" in h.json()["down"]["ltd"]  # names the fix
        assert c.post("/api/search/text", json={"query": "a red square", "model": "bl"}).status_code == 200
        r = c.post("/api/search/text", json={"query": "a red square", "model": "ltd"})
        assert r.status_code == 503 and "ltd is down" in r.json()["detail"]
        assert c.post("/api/search/text", json={"query": "a red square"}).status_code == 200  # default: a live model
    none = SearchService({"ltd": str(broken)})
    with pytest.raises(RuntimeError, match="no model could be loaded"):
        none.registry.load()
    assert none.registry.status == "error"


def test_models_endpoint_shows_no_absolute_paths(client, tiny_index_pair):
    body = client.get("/api/models").text
    assert str(Path(tiny_index_pair["bl"]).parent) not in body and '"/' not in body.replace('"/api', "")
