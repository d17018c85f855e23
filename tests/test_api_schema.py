"""Property-based API test: schemathesis generates requests from the app's own OpenAPI document
(valid and invalid ones) and checks every answer: no server errors, documented status codes and
content types, bodies that match the response schemas, invalid requests rejected.

In-process (ASGI, no socket), bounded and deterministic: a fixed number of examples per operation,
derandomized, no shrinking.
"""
from __future__ import annotations

import io

import pytest
import schemathesis
from conftest import pair_settings
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from PIL import Image

from app.api.main import create_app
from app.api.settings import Settings

# every test here uses the session's trained models (tests/conftest.py marks them; this keeps the fast
# tier from importing the module at all)
pytestmark = [pytest.mark.slow, pytest.mark.training]

MAX_EXAMPLES = 30


@st.composite
def _images(draw, fmt: str) -> bytes:
    """Small real images: the upload fields are documented as image/*, and an OpenAPI schema cannot say
    "decodable picture", so valid examples must come from here (random bytes are rightly refused)."""
    size = (draw(st.integers(1, 48)), draw(st.integers(1, 48)))
    color = draw(st.tuples(*[st.integers(0, 255)] * 3))
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


schemathesis.openapi.media_type("image/jpeg", _images("JPEG"))
schemathesis.openapi.media_type("image/png", _images("PNG"))


@pytest.fixture(scope="module")
def api_app(tiny_index_pair, pair_service):
    return create_app(pair_settings(tiny_index_pair), service=pair_service)


# The document is generated without loading any model (nothing is read from these paths), so the
# operations are known when pytest collects; the requests go to the loaded app of the fixture.
# (schemathesis.pytest.from_fixture would do the same lazily, but breaks on pytest 9's node ids.)
schema = schemathesis.openapi.from_dict(create_app(Settings(models={"bl": "-", "ltd": "-"}, ui=False)).openapi())


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, api_app):
    excluded = []
    if case.media_type and case.media_type.startswith("multipart/"):
        # Uploads: "schema-valid" bytes are mostly not decodable images (schemathesis also draws files
        # outside the image/* strategies registered above), and a 4xx for them is the right answer.
        # Every other check (no 5xx, documented status, content type, response schema) still runs.
        excluded.append(schemathesis.checks.positive_data_acceptance)
        if case.path == "/api/caption/check":
            # a multipart field is text: a "negative" caption such as the boolean false arrives as the
            # valid string "false", and accepting it is right
            excluded.append(schemathesis.checks.negative_data_rejection)
    if case.method == "POST" and not isinstance(case.body, (dict, list, str, bytes)):
        # no body drawn (a request body schema schemathesis cannot satisfy, such as the batch route's
        # discriminated queries): a 415 for the body-less POST is right
        excluded.append(schemathesis.checks.positive_data_acceptance)
    body = case.body if isinstance(case.body, dict) else {}
    batched = body.get("queries") if isinstance(body.get("queries"), list) else []
    drawn = [body, *[q for q in batched if isinstance(q, dict)]]
    if any(d.get(k) is not None for d in drawn for k in ("cursor", "filter", "vector")) or (case.query or {}).get("filter"):
        # A cursor is opaque (only one this server made is valid), a filter is a small language whose
        # rules (field names, dates, depth) the schema cannot all say, and a vector must have the model's
        # dimension, which the schema does not know: a 4xx for a drawn one is right.
        excluded.append(schemathesis.checks.positive_data_acceptance)
    case.call_and_validate(app=api_app, excluded_checks=excluded)


def test_openapi_document(api_app):
    with TestClient(api_app) as c:
        doc = c.get("/openapi.json").json()
    ops = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert {("GET", "/api/health"), ("GET", "/api/models"), ("POST", "/api/search/text"), ("POST", "/api/search/image"),
            ("POST", "/api/compare"), ("GET", "/api/images/{image_id}"), ("GET", "/api/images/{image_id}/thumbnail"),
            ("GET", "/api/captions/{caption_id}"), ("GET", "/api/examples"), ("GET", "/metrics")} <= ops
    body = doc["paths"]["/api/search/image"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    for item in doc["paths"].values():  # every error answer is documented as ErrorResponse
        for op in item.values():
            for code, resp in op["responses"].items():
                if code.startswith("4"):
                    assert resp["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse"), (code, op)


@pytest.mark.parametrize("path", ["/api/search/text", "/api/search/image", "/api/compare"])
def test_fuzzing_reaches_valid_and_invalid_requests(api_app, path):
    """The generated requests exercise both sides of each search endpoint: some are answered 2xx, some
    are refused 422, none 5xx (a fuzz that only ever produced 422s would test nothing)."""
    from hypothesis import given

    statuses: set[int] = set()
    for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
        op = schema[path]["POST"]
        media = "application/json"

        @given(case=op.as_strategy(mode, media_type=media))
        @settings(max_examples=25, derandomize=True, deadline=None, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case):
            statuses.add(case.call(app=api_app).status_code)

        run()
    assert any(200 <= s < 300 for s in statuses) and 422 in statuses, statuses
    assert not any(s >= 500 for s in statuses), statuses


def test_every_reference_of_the_document_resolves_from_its_root():
    """ReDoc and other viewers resolve ``$ref`` from the document's root: a pydantic ``#/$defs/X`` left
    inside a hand-documented body (the batch route's queries) broke /redoc's rendering."""
    doc = create_app(Settings(models={"bl": "-", "ltd": "-"}, ui=False)).openapi()
    refs: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            assert "$defs" not in node
            refs.extend(v for k, v in node.items() if k == "$ref")
            refs.extend(v for v in (node.get("mapping") or {}).values() if isinstance(v, str))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    assert refs
    for ref in refs:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"], ref
