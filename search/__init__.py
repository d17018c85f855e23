"""The search service: the domain layer that the REST API (``app/api``) and the UI (``ui``) both call.

- ``service``: ``SearchService``, what the API and the UI call for retrieval; ``captioning``:
  ``CaptionService`` beside it (captions of an image, scored by self-retrieval and CIDEr-D).
- ``results``: what both return, as frozen dataclasses whose field names are the REST API's.
- ``registry``: named models (checkpoint + index directory), loaded and verified once, in the
  background if asked; a broken model is reported while the others serve (``captioners``: the same
  for captioners).
- ``encoding``: query texts → embeddings (cleaning, an LRU cache, batching of concurrent queries,
  optional int8 encoder).
- ``media``: uploads (type sniffing, decoding under a pixel budget) and thumbnails.
- ``ranking``: FAISS search and one result builder for text → image, image → text and compare,
  with ground-truth metrics when the query is a dataset item.
- ``analysis``: the Explorer's disagreement rows and the training curves of the served models.
- ``explainer``: why models rank as they do: word attributions of a query (``explain``), the words
  each model uses over a whole split (``word_usage``), and 2-D embedding maps (``embedmap``).

Imports flow ``training ← indexer ← search ← app``; nothing here knows about HTTP or Gradio.
"""
from indexer.metrics import REPORT_KEYS
from search.attribution import Explanation, ModelAttribution, WordAttribution
from search.captioning import CaptionService
from search.embedmap import EmbeddingMap
from search.errors import (
           BadRequest,
           Busy,
           Conflict,
           Forbidden,
           NotFound,
           NotReady,
           SearchError,
           Unsupported,
           UnsupportedMediaType,
           redact_paths,
)
from search.results import (
           CaptionCheck,
           CaptionerInfo,
           CaptionersStatus,
           CaptionResult,
           CompareResult,
           CutoffMetrics,
           DatasetCaption,
           GeneratedCaption,
           Hit,
           ImageRank,
           ModelInfo,
           QueryInfo,
           QueryMetrics,
           SearchResult,
           ServiceHealth,
)
from search.service import SearchConfig, SearchService
from search.word_usage import WordStat, WordUsage

__all__ = ["REPORT_KEYS", "BadRequest", "Busy", "Conflict", "Forbidden", "CaptionCheck", "CaptionResult", "CaptionService", "CaptionerInfo",
           "CaptionersStatus", "CompareResult", "CutoffMetrics", "DatasetCaption", "EmbeddingMap", "Explanation",
           "GeneratedCaption", "Hit", "ImageRank", "ModelAttribution", "ModelInfo", "NotFound", "NotReady",
           "QueryInfo", "QueryMetrics", "SearchConfig", "SearchError", "SearchResult", "SearchService",
           "ServiceHealth", "Unsupported", "UnsupportedMediaType", "WordAttribution", "WordStat", "WordUsage",
           "redact_paths"]
