"""The typed results of the services (search/results.py) against the REST API's response models
(app/api/schemas.py): the same field names, so the routers build answers without renaming; what the
API adds (URLs, the request's k and model names) and what it leaves out is listed here, once.
Fast: no model is loaded."""
from __future__ import annotations

import dataclasses

import orjson
import pytest

from app.api import schemas
from search import attribution, results
from search.registry import ModelRegistry
from training.errors import Unavailable


def _fields(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)} | {
            n for n, v in vars(cls).items() if isinstance(v, property)}
    return set(cls.model_fields)


# (result, response model, fields only the API has, fields only the result has)
PAIRS = [
    (results.QueryInfo, schemas.QueryInfo, set(), set()),
    (results.QueryMetrics, schemas.QueryMetrics, set(), set()),
    (results.Hit, schemas.ImageHit, {"image_url", "thumbnail_url"}, {"text", "image_id"}),
    (results.Hit, schemas.CaptionHit, {"image_url", "thumbnail_url"}, {"filename"}),
    (results.SearchResult, schemas.TextSearchResponse, {"k", "results"}, {"hits", "cutoffs"}),
    (results.CompareResult, schemas.CompareResponse, {"models"}, set()),
    (results.ModelInfo, schemas.ModelInfo, set(), set()),
    (results.DatasetCaption, schemas.CaptionInfo, {"model", "image_url", "thumbnail_url"}, set()),
    (results.ServiceHealth, schemas.HealthResponse, set(), set()),
    (results.CaptionerInfo, schemas.CaptionerSummary, set(), set()),
    (results.CaptionersStatus, schemas.CaptionersResponse, set(), set()),
    (results.ImageRank, schemas.ImageRank, set(), set()),
    (results.GeneratedCaption, schemas.GeneratedCaption, set(), set()),
    (results.CaptionResult, schemas.CaptionResponse, set(), set()),
    (results.CaptionCheck, schemas.CaptionCheckResponse, set(), set()),
    (attribution.Explanation, schemas.ExplainResponse, {"image_url", "thumbnail_url"}, set()),
    (attribution.ModelAttribution, schemas.ModelExplanation, set(), set()),
    (attribution.WordAttribution, schemas.WordAttributionOut, set(), set()),
]


@pytest.mark.parametrize("result, model, api_only, result_only", PAIRS,
                         ids=[f"{r.__name__}-{m.__name__}" for r, m, *_ in PAIRS])
def test_results_and_response_models_share_field_names(result, model, api_only, result_only):
    ours, theirs = _fields(result), _fields(model)
    assert theirs - ours == api_only and ours - theirs == result_only


def _caption_result() -> results.CaptionResult:
    rank = results.ImageRank(model="bl", rank=3, of=61, score=0.25, in_index=False, referee=True)
    info = results.CaptionerInfo(stage="scst", alpha=0.5, labelled_fraction=1.0, judge_sha256="ab" * 8, epoch=2,
                                 val=0.75)
    cap = results.GeneratedCaption(captioner="sr", caption="a dog", cider=None, retrieval=[rank], info=info,
                                   took_ms=12.5)
    return results.CaptionResult(image_id=None, references=None, captions=[cap])


@pytest.mark.parametrize("build, model", [
    (_caption_result, schemas.CaptionResponse),
    (lambda: results.CaptionCheck(caption="a dog", image_id=7, cider=1.5, retrieval=[]), schemas.CaptionCheckResponse),
    (lambda: results.CaptionersStatus(ready={"xe": results.CaptionerInfo("xe", None, 0.5, None, 3, None)},
                                      down={"sr": "best.pt: missing"}), schemas.CaptionersResponse),
    (lambda: results.ServiceHealth(status="degraded", models=["bl", "ltd"], loaded=["bl"], down={"ltd": "gone"},
                                   detail=None, loaded_at=1.0), schemas.HealthResponse),
])
def test_a_result_validates_into_its_response_model_unchanged(build, model):
    """The cold paths validate results (nested ones too) with ``from_attributes``: the answer is the
    result's own data, as orjson would write the dataclass."""
    r = build()
    assert model.model_validate(r, from_attributes=True).model_dump(mode="json") == orjson.loads(orjson.dumps(r))


def test_results_are_frozen():
    q = results.QueryInfo(text="a dog")
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.text = "a cat"  # type: ignore[misc]


def test_what_loads_with_the_models_runs_first_or_at_once(tmp_path):
    """``load_with_models``: registered before loading, it runs in the loading thread before the models
    (here none can load, so the load fails after it ran); registered after, it runs at once."""
    calls: list[str] = []
    reg = ModelRegistry({"x": tmp_path / "missing"})
    reg.on_loaded = lambda entry: calls.append("model")
    reg.load_with_models(lambda: calls.append("first"))
    assert calls == []
    with pytest.raises(Unavailable):
        reg.load()
    assert calls == ["first"] and "x" in reg.failed
    reg.load_with_models(lambda: calls.append("late"))
    assert calls == ["first", "late"]
