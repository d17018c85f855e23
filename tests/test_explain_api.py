"""POST /api/explain (app/api/routers/explain.py): answers equal the service's, uploads work, and every
bad input is a 4xx JSON error (never a 5xx)."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient

from app.api.main import create_app
from search import SearchService

# every test here uses the session's trained models (tests/conftest.py marks them; this keeps the fast
# tier from importing the module at all)
pytestmark = [pytest.mark.slow, pytest.mark.training]


@pytest.fixture(scope="module")
def client(tiny_index_pair, pair_service):
    with TestClient(create_app(pair_settings(tiny_index_pair), service=pair_service)) as c:
        c.svc = pair_service  # type: ignore[attr-defined]
        yield c


@pytest.fixture(scope="module")
def ids(client) -> dict:
    svc: SearchService = client.svc
    e = svc.registry.entries["bl"]
    return {"image": int(e.index.images.ids[1]), "caption": int(e.index.captions.ids[3]),
            "path": e.index.images.meta["paths"][1]}


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] and body["detail"]
    return body


def test_explain_a_caption(client, ids):
    r = client.post("/api/explain", json={"caption_id": ids["caption"], "models": ["bl", "ltd"]})
    assert r.status_code == 200, r.text
    body = r.json()
    want = client.svc.explainer.explain(["bl", "ltd"], caption_id=ids["caption"])
    assert body["text"] == want.text and body["caption_id"] == ids["caption"] and body["image_id"] == want.image_id
    assert body["thumbnail_url"].startswith(f"/api/images/{want.image_id}/thumbnail?")
    for got, m in zip(body["results"], want.results):
        assert got["model"] == m.model and got["rank"] == m.rank and got["of"] == m.of
        assert [w["word"] for w in got["words"]] == [w.word for w in m.words]
        assert [w["delta_rank"] for w in got["words"]] == [w.delta_rank for w in m.words]
        assert [w["delta_score"] for w in got["words"]] == pytest.approx([w.delta_score for w in m.words], abs=1e-6)
        assert set(got["words"][0]) == set(asdict(m.words[0]))
    assert body["summary"] == want.summary


def test_explain_free_text_for_an_image_and_an_upload(client, ids):
    q = "a big green circle next to a small square"
    r = client.post("/api/explain", json={"query": q, "image_id": ids["image"], "models": ["ltd"]})
    assert r.status_code == 200, r.text
    assert [w["word"] for w in r.json()["results"][0]["words"]] == q.split()
    data = open(ids["path"], "rb").read()
    r = client.post("/api/explain", files={"file": ("x.jpg", data, "image/jpeg")},
                    data={"query": q, "models": ["bl", "ltd"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["upload"] and body["image_id"] is None and body["thumbnail_url"] is None
    n = len(client.svc.registry.entries["bl"].index.images.ids)
    assert [m["of"] for m in body["results"]] == [n + 1, n + 1]
    r = client.post("/api/explain", files={"file": ("x.jpg", data, "image/jpeg")},
                    data={"caption_id": str(ids["caption"]), "models": "bl"})
    assert r.status_code == 200 and r.json()["caption_id"] == ids["caption"]


@pytest.mark.parametrize("payload, status", [
    ({"query": "", "image_id": 0, "models": ["bl", "ltd"]}, 422),  # empty
    ({"query": "   ", "image_id": 0, "models": ["bl", "ltd"]}, 422),
    ({"query": " ".join(["word"] * 1000), "image_id": 0, "models": ["bl", "ltd"]}, 422),  # 1,000 words
    ({"query": " ".join(["a"] * 300), "image_id": 0, "models": ["bl", "ltd"]}, 400),  # 300 words within 1,000 chars
    ({"query": "a red dog", "models": ["bl", "ltd"]}, 422),  # no image
    ({"query": "a red dog", "image_id": 10**12, "models": ["bl", "ltd"]}, 404),  # unknown ids
    ({"caption_id": 10**12, "models": ["bl", "ltd"]}, 404),
    ({"query": "a red dog", "image_id": 0, "models": ["bl", "nope"]}, 404),
    ({"query": "a red dog", "image_id": 0, "models": ["bl", "bl"]}, 422),
    ({"query": "a red dog", "image_id": 0, "models": []}, 422),
    ({"query": "a red dog", "image_id": 0, "models": ["bl", "ltd", "a", "b", "c"]}, 422),
    ({"query": "a red dog", "caption_id": 1, "image_id": 0, "models": ["bl"]}, 422),
    ({"image_id": 0, "models": ["bl"]}, 422),
    ({"query": "a red dog", "image_id": -1, "models": ["bl"]}, 422),
    ({"query": "a red dog", "image_id": 0, "models": ["bl"], "k": 3}, 422),
    ({"query": "a red \ud800 dog", "image_id": 0, "models": ["bl"]}, 422),  # the schema cleans as the service does
])
def test_bad_inputs_are_4xx(client, ids, payload, status):
    if payload.get("image_id") == 0:
        payload = payload | {"image_id": ids["image"]}
    raw = json.dumps(payload)  # ASCII-escaped: a lone surrogate travels as "\\ud800", as a hostile client sends it
    body = _error(client.post("/api/explain", content=raw, headers={"content-type": "application/json"}), status)
    if status == 400:
        assert any(w in body["detail"] for w in ("word", "image", "Unicode", "limit")), body
    if "\ud800" in payload.get("query", ""):
        assert "invalid Unicode" in body["detail"], body


@pytest.mark.parametrize("query", ["dog", "dog ...!", "!!!"])
def test_fewer_than_two_words_get_a_clear_message(client, ids, query):
    r = client.post("/api/explain", json={"query": query, "image_id": ids["image"], "models": ["bl", "ltd"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert all(m["words"] == [] and m["note"] for m in body["results"])
    assert body["summary"] and ("one-word" in body["summary"][0] or "no words" in body["summary"][0])


def test_bad_uploads_are_4xx(client, ids):
    data = open(ids["path"], "rb").read()
    _error(client.post("/api/explain", files={"file": ("x", b"not an image")}, data={"query": "a red dog",
                                                                                     "models": "bl"}), 415)
    _error(client.post("/api/explain", files={"file": ("x", data)}, data={"models": "bl"}), 400)  # no query
    _error(client.post("/api/explain", files={"file": ("x", data)}, data={"query": "a red dog"}), 422)  # no models
    _error(client.post("/api/explain", files={"file": ("x", data)},
                       data={"query": "a red dog", "models": "bl", "k": "2"}), 422)
    _error(client.post("/api/explain", content=b"query=a", headers={"content-type": "text/plain"}), 415)
    big = b"\xff\xd8" + b"\x00" * (11 * 1024 * 1024)
    _error(client.post("/api/explain", files={"file": ("x.jpg", big)}, data={"query": "a red dog", "models": "bl"}), 413)
    assert client.get("/api/health").status_code == 200  # still serving


def test_explain_is_in_the_openapi_document(client):
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/api/explain"]["post"]
    assert set(op["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
    assert {"200", "400", "404", "422"} <= set(op["responses"])
