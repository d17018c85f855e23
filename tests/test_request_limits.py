"""The request limits have one source: ``search.SearchConfig`` (inherited by the settings, so a flag or an
``LTD_*`` variable sets them). The REST API validates against them, its OpenAPI document shows them,
the service and the UI enforce them — with ``LTD_MAX_K=50`` the schema says 50 and k = 51 is refused;
with ``LTD_MAX_K=5000`` k = 5,000 is answered.
"""
from __future__ import annotations

import io

import pytest
from conftest import pair_settings
from fastapi.testclient import TestClient
from PIL import Image

from app.api.fields import LIMIT_KEY
from app.api.main import create_app
from app.api.schemas import TextSearchRequest
from app.api.settings import Settings
from search import SearchConfig


def _unloaded_app(monkeypatch, **env: str):
    """An app from the ``LTD_*`` environment whose models never load (validation runs before the service)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return create_app(Settings(models={"bl": "-", "ltd": "-"}, ui=False))


def _doc(app) -> dict:
    with TestClient(app) as c:
        return c.get("/openapi.json").json()


def _props(doc: dict, path: str, media: str = "application/json") -> dict:
    return doc["paths"][path]["post"]["requestBody"]["content"][media]["schema"]["properties"]


def test_the_openapi_document_shows_the_configured_limits(monkeypatch):
    doc = _doc(_unloaded_app(monkeypatch, LTD_MAX_K="50", LTD_MAX_QUERY_CHARS="20"))
    for path in ("/api/search/text", "/api/search/image", "/api/compare"):
        assert _props(doc, path)["k"]["maximum"] == 50, path
    for path in ("/api/search/image", "/api/compare"):
        assert _props(doc, path, "multipart/form-data")["k"]["maximum"] == 50, path
    for path in ("/api/search/text", "/api/compare", "/api/explain"):
        assert _props(doc, path)["query"]["maxLength"] == 20, path
    assert _props(doc, "/api/explain", "multipart/form-data")["query"]["maxLength"] == 20
    assert _props(doc, "/api/caption/check")["caption"]["maxLength"] == 20
    assert LIMIT_KEY not in str(doc)  # every marker was filled in


def test_the_defaults_are_the_services(monkeypatch):
    monkeypatch.delenv("LTD_MAX_K", raising=False)
    doc = _doc(create_app(Settings(models={"bl": "-"}, ui=False)))
    assert _props(doc, "/api/search/text")["k"]["maximum"] == SearchConfig().max_k


@pytest.mark.parametrize("env, k, query, status", [
    ({"LTD_MAX_K": "50"}, 51, "a dog", 422),
    ({"LTD_MAX_K": "50"}, 50, "a dog", 503),        # valid: then the (unloaded) service answers
    ({"LTD_MAX_K": "5000"}, 5000, "a dog", 503),    # over the default 1,000, within this server's limit
    ({"LTD_MAX_K": "5000"}, 5001, "a dog", 422),
    ({"LTD_MAX_QUERY_CHARS": "20"}, 10, "x" * 21, 422),
    ({"LTD_MAX_QUERY_CHARS": "20"}, 10, "x   " * 10, 503),  # 40 characters, 19 after collapsing
    ({"LTD_MAX_QUERY_CHARS": "2000"}, 10, "x" * 1500, 503),
])
def test_requests_are_validated_against_the_configured_limits(monkeypatch, env, k, query, status):
    with TestClient(_unloaded_app(monkeypatch, **env)) as c:
        for path, body in (("/api/search/text", {"query": query, "k": k}),
                           ("/api/compare", {"query": query, "k": k, "models": ["bl", "ltd"]})):
            r = c.post(path, json=body)
            assert r.status_code == status, (path, r.text)
            if status == 422:
                assert r.json()["error"] and ("k" in r.text or "query" in r.text), r.text


def test_multipart_k_is_validated_against_the_configured_limit(monkeypatch):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    with TestClient(_unloaded_app(monkeypatch, LTD_MAX_K="50")) as c:
        files = {"file": ("a.png", buf.getvalue(), "image/png")}
        assert c.post("/api/search/image", files=files, data={"k": "51"}).status_code == 422
        assert c.post("/api/search/image", files=files, data={"k": "50"}).status_code == 503


def test_query_cleaning_is_the_services(monkeypatch):
    """One cleaning for the REST API and the service: control characters are dropped (a NUL-only query is
    empty), whitespace collapsed."""
    limits = SearchConfig()
    req = TextSearchRequest.model_validate({"query": " a\x00 red\x1b\t dog\n"}, context={"limits": limits})
    assert req.query == "a red dog"
    with TestClient(_unloaded_app(monkeypatch)) as c:
        r = c.post("/api/search/text", json={"query": "\x00\x07"})
        assert r.status_code == 422 and "empty" in r.json()["detail"], r.text


def test_a_request_model_validated_without_the_limits_is_a_bug():
    with pytest.raises(RuntimeError, match="context"):
        TextSearchRequest.model_validate({"query": "a dog"})


@pytest.mark.slow
def test_a_server_with_a_larger_max_k_answers_it(tiny_index_pair):
    """k = 5,000 against the real service (the tiny index holds fewer items: all of them come back)."""
    app = create_app(pair_settings(tiny_index_pair, max_k=5000))
    with TestClient(app) as c:
        r = c.post("/api/search/text", json={"query": "a red square", "model": "bl", "k": 5000})
        assert r.status_code == 200, r.text
        n_images = len(app.state.service.registry.entries["bl"].index.images.ids)
        assert r.json()["k"] == 5000 and len(r.json()["results"]) == n_images
        assert c.post("/api/search/text", json={"query": "a red square", "k": 5001}).status_code == 422
