"""The search service: the domain layer that the REST API (``app/api``) and the UI (``ui``) both call.

- ``registry``: named models (checkpoint + index directory), loaded and verified once, in the
  background if asked; a broken model is reported while the others serve.
- ``encoding``: query texts → embeddings (cleaning, an LRU cache, batching of concurrent queries,
  optional int8 encoder).
- ``media``: uploads (type sniffing, decoding under a pixel budget) and thumbnails.
- ``ranking``: FAISS search and one result builder for text → image, image → text and compare,
  with ground-truth metrics when the query is a dataset item.
- ``analysis``: the Explorer's disagreement rows and the training curves of the served models.

Imports flow ``training ← indexer ← search ← app``; nothing here knows about HTTP or Gradio.
"""
from indexer.metrics import REPORT_KEYS
from search.errors import (
           BadRequest,
           Busy,
           NotFound,
           NotReady,
           SearchError,
           Unsupported,
           UnsupportedMediaType,
           redact_paths,
)
from search.ranking import CompareResult, Hit, SearchResult
from search.service import SearchConfig, SearchService

__all__ = ["REPORT_KEYS", "BadRequest", "Busy", "CompareResult", "Hit", "NotFound", "NotReady", "SearchConfig", "SearchError",
           "SearchResult", "SearchService", "Unsupported", "UnsupportedMediaType", "redact_paths"]
