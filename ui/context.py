"""What every tab gets: the search and caption services, the limits to enforce, how to show thumbnails."""
from __future__ import annotations

from dataclasses import dataclass

from search import CaptionService, SearchService
from ui.render import ThumbSrc, two_models


@dataclass(frozen=True)
class UILimits:
    """Set by the server (app/api/settings.py), so the UI and the REST API enforce the same limits."""

    max_upload_bytes: int = 10 * 1024 * 1024
    max_query_chars: int = 1000


@dataclass(frozen=True)
class UIContext:
    service: SearchService
    captions: CaptionService
    limits: UILimits
    thumbs: ThumbSrc

    @property
    def names(self) -> list[str]:
        return list(self.service.registry.names)

    @property
    def pair(self) -> tuple[str, str] | None:
        """The two models to compare by default (None with one model)."""
        return two_models(self.service)

    @property
    def first_pair(self) -> tuple[str, str]:
        return self.pair or (self.names[0], self.names[0])
