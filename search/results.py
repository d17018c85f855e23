"""What the search and caption services return: frozen dataclasses, one per kind of answer.

They are the boundary between the domain (``search/``) and its two callers, the REST API
(``app/api``) and the UI (``ui/``). Their field names are the REST API's JSON names, so an answer is
built from them without renaming anything: ``orjson`` writes the small ones (``QueryInfo``,
``QueryMetrics``) as they are on the search hot path, and the cold paths validate them into their
response models with ``from_attributes``. What the API adds is only its own business (image URLs).

Frozen (all but ``Hit``) because a result is a value: the UI, the CLI and the API may all hold the
same one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# t2i: text → images, i2t: image → captions, i2i: image → images ("more like this"), t2t: text → captions;
# a raw embedding as the query searches either side (v2i, v2t).
Direction = Literal["t2i", "i2t", "i2i", "t2t", "v2i", "v2t"]


# ---- search ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class QueryInfo:
    """The query as the answer echoes it: a text (``caption_id`` when it is a dataset caption), a
    dataset image (``image_id``, ``filename``), or an upload."""

    text: str | None = None
    caption_id: int | None = None
    image_id: int | None = None
    filename: str | None = None
    upload: bool = False
    vector: bool = False  # a raw embedding was the query


@dataclass(frozen=True, slots=True)
class QueryMetrics:
    """Per-query metrics at the requested k, when the query is a dataset item (its ground truth known)."""

    first_gt_rank: int  # 1-based rank of the best-ranked ground-truth item among all items
    k: int  # the requested k, at most the index size
    precision_at_k: float
    ndcg_at_k: float
    ndcg_relevance: Literal["rougeL", "binary"]  # graded ROUGE-L relevance (cached by `ltd eval`), else ground truth


@dataclass(frozen=True, slots=True)
class CutoffMetrics:
    """The same query's P@5 and nDCG@25, the eval report's fixed cut-offs (at most the index size), so a
    query's numbers read like a row of ``report.json`` whatever k was asked. The UI shows these."""

    p_at: int
    precision: float
    ndcg_at: int
    ndcg: float


@dataclass(slots=True)
class Hit:
    """One ranked item. Not frozen, unlike the rest: ``rank`` builds k of them per query on the search
    hot path, and a frozen dataclass's ``__init__`` (``object.__setattr__`` per field) took ~1.3 µs more
    per hit than this one (CPython 3.11, measured on the 2-core Xeon VM); nothing changes one after."""

    rank: int
    id: int
    score: float
    text: str | None = None  # captions
    filename: str | None = None  # images
    image_id: int | None = None  # captions: the image it describes (dataset indexes)
    ground_truth: bool | None = None  # None: the query's ground truth is unknown (free text, uploads)
    relevance: float | None = None  # ROUGE-L relevance to the query, when cached


@dataclass(frozen=True, slots=True)
class SearchResult:
    """One ranking: the query, its hits, and the ground truth and per-query metrics when the query is a
    dataset item."""

    model: str
    direction: Direction
    query: QueryInfo
    hits: list[Hit]
    ground_truth_ids: list[int] | None
    metrics: QueryMetrics | None
    cutoffs: CutoffMetrics | None
    took_ms: float  # encode + search inside the service
    next_cursor: str | None = None  # the next page of the same ranking (search/paging.py), when there is one
    generation: int = 0  # the index generation the answer was ranked on
    partial: bool = False  # some shards of a sharded index gave no answer: the hits are the others' best
    missing_shards: list[int] | None = None  # which (when ``partial``)


@dataclass(frozen=True, slots=True)
class CompareResult:
    """One query, two models: both rankings and the ids both retrieved."""

    direction: Direction
    k: int
    results: list[SearchResult]
    overlap_ids: list[int] = field(default_factory=list)

    @property
    def overlap(self) -> int:
        """How many items both models ranked in the top k."""
        return len(self.overlap_ids)

    @property
    def jaccard(self) -> float:
        """Overlap / items ranked by either model (0.0 when neither ranked any)."""
        union = len({h.id for r in self.results for h in r.hits})
        return self.overlap / union if union else 0.0


# ---- models and dataset items ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A served model as clients see it: its index, its training summary and its `ltd eval` report.
    ``manifest`` has no path of the server's file system (``registry.public_manifest``)."""

    name: str
    dataset: str | None = None
    split: str | None = None
    counts: dict[str, int] | None = None
    dim: int | None = None
    factory: str | None = None
    ground_truth: bool = False  # a dataset split with caption ↔ image links (queries have ground truth)
    image_search: bool = False  # uploads can be encoded (the model has an image backbone)
    model: dict[str, Any] | None = None
    caption_corpora: bool = False  # its text side saw Flickr30k/COCO captions (numbers marked ᴹ)
    eval: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    status: str = "ok"  # "ok", or "down" (it could not be loaded: ``detail`` says why, the rest is empty)
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class DatasetCaption:
    """A caption of a served index (a dataset caption, or a corpus caption without an image)."""

    id: int
    text: str
    image_id: int | None  # the image it describes (None in a corpus without links)


@dataclass(frozen=True, slots=True)
class ServiceHealth:
    """Loading state of the served models; reasons name files, never the server's folders."""

    status: Literal["ok", "degraded", "loading", "error"]
    models: list[str]  # configured
    loaded: list[str]
    down: dict[str, str]  # name → why it could not be loaded (paths redacted)
    detail: str | None  # why none could be loaded (paths redacted)
    loaded_at: float | None  # Unix time when loading finished
    shards_down: dict[str, list[int]] = field(default_factory=dict)  # model → its shards with no live replica


# ---- captions ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CaptionerInfo:
    """A served captioner's training summary, from its checkpoint."""

    stage: str | None  # xe | scst
    alpha: float | None  # SCST: weight of the self-retrieval reward
    labelled_fraction: float
    judge_sha256: str | None  # SCST: sha256 prefix of the retrieval model it was trained against
    epoch: int | None
    val: float | None  # best validation score


@dataclass(frozen=True, slots=True)
class CaptionersStatus:
    """The captioners that serve (name → training summary) and those that could not load (name → why)."""

    ready: dict[str, CaptionerInfo]
    down: dict[str, str]  # name → why (paths redacted)


@dataclass(frozen=True, slots=True)
class ImageRank:
    """The image's rank for a caption under one retrieval model (self-retrieval)."""

    model: str
    rank: int  # 1 = best; ties count against the image
    of: int  # images ranked among (an upload counts as one more)
    score: float
    in_index: bool  # one of the index's images (else embedded from the upload)
    teacher: bool = False  # the captioner was trained against this model
    referee: bool = False  # no served captioner was trained against this model


@dataclass(frozen=True, slots=True)
class GeneratedCaption:
    """One captioner's caption of an image, its CIDEr-D, and the image's rank for it under each model."""

    captioner: str
    caption: str
    cider: float | None  # CIDEr-D against the image's references (dataset images only)
    retrieval: list[ImageRank]  # empty for a caption without words
    info: CaptionerInfo
    took_ms: float


@dataclass(frozen=True, slots=True)
class CaptionResult:
    """Every asked captioner's caption of one image, with the image's own references when it has them."""

    image_id: int | None  # None for an upload
    references: list[str] | None  # the dataset image's own captions
    captions: list[GeneratedCaption]


@dataclass(frozen=True, slots=True)
class CaptionCheck:
    """How well a caption written by a person finds an image under each retrieval model."""

    caption: str  # as encoded (whitespace collapsed)
    image_id: int | None
    cider: float | None
    retrieval: list[ImageRank]
