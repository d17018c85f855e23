"""Pydantic schemas of every request and response of the REST API (one module, as in the FastAPI
"bigger applications" layout). The OpenAPI document at /openapi.json is generated from these. Response
fields are named as in the service's results (search/results.py; tests/test_service_results.py)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from app.api.fields import Cursor, FilterJSON, ItemId, K, ModelName, QueryText


def _exactly_one(model: BaseModel, names: tuple[str, ...]) -> None:
    given = [n for n in names if n in model.model_fields_set]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {', '.join(names)} (got {', '.join(given) or 'none'})")


def _request_schema(*one_of: str):
    """Schema post-processing of request models: optional fields are absent-or-valued (``= None`` is
    only the "absent" marker, so drop the null default), and ``one_of`` lists alternatives of which
    exactly one must be given."""

    def extra(schema: dict, cls: type) -> None:
        for prop in schema.get("properties", {}).values():
            if "default" in prop and prop["default"] is None:
                del prop["default"]
        if one_of:
            schema["oneOf"] = [{"required": [n]} for n in one_of]

    return extra


# ---- requests ----------------------------------------------------------------------------------
class TextSearchRequest(BaseModel):
    """Text → images. Give ``query`` (free text) or ``caption_id`` (a dataset caption: the answer then
    marks its ground-truth image and carries per-query metrics)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema("query", "caption_id"))

    query: QueryText = None  # type: ignore[assignment]
    caption_id: ItemId = None  # type: ignore[assignment]
    model: ModelName = None  # type: ignore[assignment]  # absent: the first model
    k: K = 10
    filter: FilterJSON = None
    cursor: Cursor = None

    @model_validator(mode="after")
    def _one_query(self) -> TextSearchRequest:
        _exactly_one(self, ("query", "caption_id"))
        return self


class ImageSearchRequest(BaseModel):
    """Image → captions for a dataset image (JSON). Uploads use multipart/form-data on the same path."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema())

    image_id: ItemId
    model: ModelName = None  # type: ignore[assignment]
    k: K = 10
    filter: FilterJSON = None
    cursor: Cursor = None


class CompareRequest(BaseModel):
    """The same query against two models. Give exactly one of ``query``, ``caption_id`` (text → images)
    or ``image_id`` (image → captions); uploads use multipart/form-data on the same path."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema("query", "caption_id", "image_id"))

    query: QueryText = None  # type: ignore[assignment]
    caption_id: ItemId = None  # type: ignore[assignment]
    image_id: ItemId = None  # type: ignore[assignment]
    models: Annotated[list[ModelName], Field(min_length=2, max_length=2, json_schema_extra={"uniqueItems": True})]
    k: K = 10
    filter: FilterJSON = None

    @model_validator(mode="after")
    def _check(self) -> CompareRequest:
        _exactly_one(self, ("query", "caption_id", "image_id"))
        if self.models[0] == self.models[1]:
            raise ValueError("models must name two different models")
        return self


# ---- responses ---------------------------------------------------------------------------------
class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """Every error: a machine-readable ``error`` code and a human-readable ``detail``."""

    error: str = Field(examples=["not_found"])
    detail: str = Field(examples=["unknown model 'x'; valid models: bl, ltd"])
    valid_models: list[str] | None = None  # unknown model
    errors: list[ValidationIssue] | None = None  # request validation (422)


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded", "loading", "error"]
    models: list[str] = Field(description="configured model names")
    loaded: list[str] = Field(description="models loaded so far")
    down: dict[str, str] = Field(default_factory=dict, description="models that could not be loaded, and why")
    detail: str | None = None
    loaded_at: float | None = Field(None, description="Unix time when loading finished")
    shards_down: dict[str, list[int]] = Field(default_factory=dict, description="sharded models' shards with no "
                                              "live replica (status degraded; their answers are partial)")


class ModelInfo(BaseModel):
    name: str
    status: Literal["ok", "down"] = Field("ok", description="down: the model could not be loaded (``detail`` says "
                                          "why; the other fields are empty) while the others serve")
    detail: str | None = Field(None, description="why a model is down (names files, never the server's folders)")
    dataset: str | None = None
    split: str | None = None
    counts: dict[str, int] | None = Field(None, description="items in the index: images, captions")
    dim: int | None = Field(None, description="embedding dimension")
    factory: str | None = Field(None, description="FAISS index factory string")
    ground_truth: bool = Field(False, description="the index is a dataset split with caption ↔ image links")
    image_search: bool = Field(False, description="uploaded images can be encoded (the model has an image backbone)")
    model: dict[str, Any] | None = Field(None, description="training summary from the manifest")
    caption_corpora: bool = Field(False, description="the caption encoder or the LTD targets come from a sentence model "
                                  "trained on Flickr30k/COCO captions (MiniLM, mpnet): numbers marked ᴹ in RESULTS.md")
    eval: dict[str, Any] | None = Field(None, description="report.json of `ltd eval` (R@k, R-P, nDCG, rsum), when present")
    manifest: dict[str, Any] | None = None


class QueryInfo(BaseModel):
    text: str | None = None
    caption_id: int | None = None
    image_id: int | None = None
    filename: str | None = None
    upload: bool = False
    vector: bool = False


class QueryMetrics(BaseModel):
    """Per-query metrics, present when the query is a dataset item (its ground truth is known)."""

    first_gt_rank: int = Field(description="1-based rank of the best-ranked ground-truth item among all items")
    k: int = Field(description="cut-off of the metrics: the requested k, at most the index size")
    precision_at_k: float
    ndcg_at_k: float
    ndcg_relevance: Literal["rougeL", "binary"] = Field(
        description="rougeL: graded ROUGE-L relevance cached by `ltd eval`; binary: ground truth only")


class ImageHit(BaseModel):
    rank: int
    id: int
    score: float
    filename: str | None
    image_url: str
    thumbnail_url: str
    ground_truth: bool | None = Field(None, description="the image is the query caption's own (caption_id queries)")
    relevance: float | None = Field(None, description="ROUGE-L relevance to the query caption, when cached")


class CaptionHit(BaseModel):
    rank: int
    id: int
    score: float
    text: str
    image_id: int | None = Field(None, description="the dataset image this caption describes")
    image_url: str | None = None
    thumbnail_url: str | None = None
    ground_truth: bool | None = Field(None, description="the caption describes the query image (image_id queries)")
    relevance: float | None = None


class TextSearchResponse(BaseModel):
    direction: Literal["t2i", "i2i", "v2i"] = Field("t2i", description="what the query was (a text, an image, a "
                                                    "vector); the hits are images")
    model: str
    k: int
    query: QueryInfo
    took_ms: float = Field(description="encode + search time inside the service")
    ground_truth_ids: list[int] | None = None
    metrics: QueryMetrics | None = None
    results: list[ImageHit]
    next_cursor: str | None = Field(None, description="give it as `cursor` (same query) for the next page")
    generation: int = Field(0, description="the index generation the answer was ranked on")
    partial: bool = Field(False, description="some shards of a sharded index gave no answer: these are the best "
                                             "hits of the others")
    missing_shards: list[int] | None = Field(None, description="the shards that gave no answer (when partial)")


class ImageSearchResponse(BaseModel):
    direction: Literal["i2t", "t2t", "v2t"] = Field("i2t", description="what the query was (an image, a text, a "
                                                    "vector); the hits are captions")
    model: str
    k: int
    query: QueryInfo
    took_ms: float
    ground_truth_ids: list[int] | None = None
    metrics: QueryMetrics | None = None
    results: list[CaptionHit]
    next_cursor: str | None = None
    generation: int = 0
    partial: bool = False
    missing_shards: list[int] | None = None


SearchResponse = Annotated[TextSearchResponse | ImageSearchResponse, Field(discriminator="direction")]


class CompareResponse(BaseModel):
    direction: Literal["t2i", "i2t"]
    k: int
    models: list[str]
    results: list[SearchResponse] = Field(description="one ranking per model, in the order of `models`")
    overlap: int = Field(description="items ranked by both models")
    overlap_ids: list[int]
    jaccard: float = Field(description="overlap / items ranked by either model")


class CaptionInfo(BaseModel):
    id: int
    model: str
    text: str
    image_id: int | None = None
    image_url: str | None = None
    thumbnail_url: str | None = None


# ---- captions ----------------------------------------------------------------------------------
CaptionerName = Annotated[str, Field(min_length=1, max_length=100, description="a captioner from GET /api/captioners")]
Beam = Annotated[int, Field(ge=1, le=20, description="beam width (1 = greedy)")]


def _distinct(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError("each captioner may be named once")
    return names


# One beam search per name: the same captioner named 8 times was 8 times the work of one request.
Captioners = Annotated[list[CaptionerName], Field(min_length=1, max_length=8, json_schema_extra={"uniqueItems": True}),
                       AfterValidator(_distinct)]


class CaptionRequest(BaseModel):
    """Captions for a dataset image (JSON); uploads use multipart/form-data on the same path."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema())

    image_id: ItemId
    captioners: Captioners = None  # type: ignore[assignment]
    beam: Beam = 5


class CaptionCheckRequest(BaseModel):
    """How well a caption (written by a person) finds a dataset image; uploads use multipart/form-data."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema())

    image_id: ItemId
    caption: QueryText


class ImageRank(BaseModel):
    model: str = Field(description="a retrieval model")
    rank: int = Field(description="the image's rank for the caption among the model's index images (1 = best)")
    of: int = Field(description="how many images it was ranked among (an upload counts as one more)")
    score: float
    in_index: bool = Field(description="the image is one of the index's images (else it was embedded from the upload)")
    teacher: bool = Field(False, description="the captioner was trained against this model (its self-retrieval judge)")
    referee: bool = Field(False, description="no served captioner was trained against this model: an independent view")


class CaptionerSummary(BaseModel):
    """A served captioner's training summary, from its checkpoint."""

    stage: str | None = Field(description="xe (cross-entropy) or scst (self-critical)")
    alpha: float | None = Field(description="SCST: weight of the self-retrieval reward")
    labelled_fraction: float
    judge_sha256: str | None = Field(description="SCST: sha256 prefix of the retrieval model it was trained against")
    epoch: int | None
    val: float | None = Field(description="best validation score")


class CaptionersResponse(BaseModel):
    ready: dict[str, CaptionerSummary]
    down: dict[str, str] = Field(description="captioners that could not be loaded, and why")


class GeneratedCaption(BaseModel):
    captioner: str
    caption: str
    cider: float | None = Field(description="CIDEr-D against the image's reference captions (dataset images only)")
    retrieval: list[ImageRank] = Field(description="self-retrieval: the image's rank for this caption, per model")
    info: CaptionerSummary
    took_ms: float


class CaptionResponse(BaseModel):
    image_id: int | None
    references: list[str] | None = Field(description="the dataset image's own captions, when it has them")
    captions: list[GeneratedCaption]


class CaptionCheckResponse(BaseModel):
    caption: str
    image_id: int | None
    cider: float | None
    retrieval: list[ImageRank]


# ---- explanations --------------------------------------------------------------------------------
def _explain_schema(schema: dict, cls: type) -> None:
    """A dataset caption (its own image unless ``image_id`` says otherwise), or free text and an image id."""
    _request_schema()(schema, cls)
    schema["oneOf"] = [{"required": ["caption_id"]}, {"required": ["query", "image_id"]}]
    schema["not"] = {"required": ["query", "caption_id"]}


class ExplainRequest(BaseModel):
    """Word attributions: which words of a query hold an image up, per model. Give ``query`` (free text, then
    ``image_id`` too) or ``caption_id`` (a dataset caption; the image defaults to its own). Uploads use
    multipart/form-data on the same path."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_explain_schema)

    query: QueryText = None  # type: ignore[assignment]
    caption_id: ItemId = None  # type: ignore[assignment]
    image_id: ItemId = None  # type: ignore[assignment]
    models: Annotated[list[ModelName], Field(min_length=1, max_length=4, json_schema_extra={"uniqueItems": True})]

    @model_validator(mode="after")
    def _check(self) -> ExplainRequest:
        _exactly_one(self, ("query", "caption_id"))
        if self.query is not None and self.image_id is None:
            raise ValueError("a free-text query needs the image to explain: give image_id (or upload the image)")
        if len(set(self.models)) != len(self.models):
            raise ValueError("models must name different models")
        return self


class WordAttributionOut(BaseModel):
    word: str
    start: int = Field(description="offset of the word in the model's query text")
    end: int
    text_without: str = Field(description="the query with this word removed: what was encoded")
    score_without: float
    rank_without: int
    delta_score: float = Field(description="score(full) − score(without the word): > 0, the word pulls the image closer")
    delta_rank: int = Field(description="rank(without) − rank(full): > 0, the image drops that many places without it")


class ModelExplanation(BaseModel):
    model: str
    text: str = Field(description="the query as this model encodes it")
    score: float = Field(description="the full query's score for the image")
    rank: int = Field(description="the image's rank for the full query (1 = best; ties count against it)")
    of: int = Field(description="among how many images (an upload counts as one more)")
    words: list[WordAttributionOut] = Field(description="one per word; empty for fewer than two words (see note)")
    took_ms: float
    note: str | None = Field(None, description="why there are no word attributions (a query of fewer than two words)")


class ExplainResponse(BaseModel):
    text: str = Field(description="the query as shown (a dataset caption's text)")
    caption_id: int | None
    image_id: int | None = Field(description="the explained image (None for an upload)")
    upload: bool
    image_url: str | None = None
    thumbnail_url: str | None = None
    results: list[ModelExplanation] = Field(description="one per model, in the order of the request's `models`")
    summary: list[str] = Field(description="plain sentences about the words the models treat most differently")
