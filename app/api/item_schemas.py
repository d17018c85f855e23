"""Request and response models of the living index's routes: items, new query kinds, batches."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from app.api.fields import Cursor, FilterJSON, ItemId, K, ModelName, QueryText, check_batch, limit_marker
from app.api.schemas import ImageSearchResponse, TextSearchResponse, _exactly_one, _request_schema

Vector = Annotated[list[float], Field(min_length=1, max_length=4096, description="an embedding in the model's space")]


class CaptionOut(BaseModel):
    id: int
    text: str


class ItemOut(BaseModel):
    id: int
    filename: str | None
    metadata: dict[str, Any]
    captions: list[CaptionOut]
    image_url: str
    thumbnail_url: str


class ItemsPage(BaseModel):
    items: list[ItemOut]
    next_after: int | None = Field(description="give it as `after` for the next page (null: the last page)")
    total: int = Field(description="items matching the filter")
    generation: int


class AddedItem(BaseModel):
    id: int | None = None
    added: bool | None = Field(None, description="false: the same image was already there (its id is given)")
    file: str | None = Field(None, description="a folder add: the file, relative to the folder (null for uploads)")
    skipped: str | None = Field(None, description="a folder add: why this file was not added (it has no id)")


class AddResponse(BaseModel):
    model: str
    items: list[AddedItem]


class AddFolderRequest(BaseModel):
    """Add the images of a server-side folder (relative to one of the server's ``--ingest-root`` folders)."""

    model_config = ConfigDict(extra="forbid")
    folder: Annotated[str, Field(min_length=1, max_length=1000)]
    metadata: dict[str, Any] = Field(default_factory=dict, description="given to every image of the folder")


class ItemPatch(BaseModel):
    """New metadata (merged into the item's: a field set to null is dropped; ``replace`` replaces it all)
    and/or new captions (replacing the item's; they are embedded again)."""

    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] | None = None
    replace: bool = False
    captions: Annotated[list[str], Field(max_length=20)] | None = None


class RemovedItem(BaseModel):
    id: int
    removed: bool


class ReloadResponse(BaseModel):
    changed: bool
    generation: int
    seq: int = Field(description="the last item-store write the served index holds")


class CompactResponse(BaseModel):
    compacting: bool
    pending: dict[str, int]


class SimilarRequest(BaseModel):
    """Image → images ("more like this") for a served image (JSON); uploads use multipart/form-data."""

    model_config = ConfigDict(extra="forbid")
    image_id: ItemId
    model: ModelName = None  # type: ignore[assignment]
    k: K = 10
    filter: FilterJSON = None
    cursor: Cursor = None


class CaptionSearchRequest(BaseModel):
    """Text → captions: ``query`` (a text) or ``caption_id`` (a served caption)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema("query", "caption_id"))
    query: QueryText = None  # type: ignore[assignment]
    caption_id: ItemId = None  # type: ignore[assignment]
    model: ModelName = None  # type: ignore[assignment]
    k: K = 10
    filter: FilterJSON = None
    cursor: Cursor = None

    @model_validator(mode="after")
    def _one_query(self) -> CaptionSearchRequest:
        _exactly_one(self, ("query", "caption_id"))
        return self


class VectorSearchRequest(BaseModel):
    """A raw embedding as the query, against the images or the captions."""

    model_config = ConfigDict(extra="forbid")
    vector: Vector
    side: Literal["images", "captions"] = "images"
    model: ModelName = None  # type: ignore[assignment]
    k: K = 10
    filter: FilterJSON = None
    cursor: Cursor = None


class _Batched(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema())
    k: K | None = None
    filter: FilterJSON = None
    cursor: Cursor = None


class TextQuery(_Batched):
    """Text → images."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_request_schema("text", "caption_id"))
    kind: Literal["text"]
    text: QueryText = None  # type: ignore[assignment]
    caption_id: ItemId = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _one_query(self) -> TextQuery:
        _exactly_one(self, ("text", "caption_id"))
        return self


class SimilarCaptionsQuery(TextQuery):
    """Text → captions."""

    kind: Literal["similar_captions"]  # type: ignore[assignment]


class ImageQuery(_Batched):
    """Image → captions, for a served image."""

    kind: Literal["image"]
    image_id: ItemId


class SimilarImagesQuery(_Batched):
    """Image → images, for a served image."""

    kind: Literal["similar_images"]
    image_id: ItemId


class VectorQuery(_Batched):
    """A raw embedding against the images or the captions."""

    kind: Literal["vector"]
    vector: Vector
    side: Literal["images", "captions"] = "images"


BatchQuery = Annotated[TextQuery | SimilarCaptionsQuery | ImageQuery | SimilarImagesQuery | VectorQuery,
                       Field(discriminator="kind")]


class BatchRequest(BaseModel):
    """Many queries in one request; ``k`` and ``filter`` are the defaults of the queries that give none."""

    model_config = ConfigDict(extra="forbid")
    model: ModelName = None  # type: ignore[assignment]
    queries: Annotated[list[BatchQuery], Field(min_length=1, json_schema_extra=limit_marker(maxItems="max_batch_queries"),
                                               description="at most the server's max_batch_queries (maxItems here)"),
                       AfterValidator(check_batch)]
    k: K = 10
    filter: FilterJSON = None


class BatchResponse(BaseModel):
    model: str
    results: list[TextSearchResponse | ImageSearchResponse]
