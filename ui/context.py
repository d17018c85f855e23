"""What every tab gets: the search and caption services, the limits to enforce, how to show thumbnails,
and whether the UI may write to the living index."""
from __future__ import annotations

from dataclasses import dataclass

from search import CaptionService, SearchConfig, SearchService
from ui.inputs import K_CHOICES
from ui.render import ThumbSrc, two_models


@dataclass(frozen=True)
class UIContext:
    service: SearchService
    captions: CaptionService
    thumbs: ThumbSrc
    # Photos may be added and items removed through the UI: the server is writable and its writes need
    # no token of their own (app/api/main.py decides; a write token is for REST clients, the page has none).
    writes: bool = False

    @property
    def limits(self) -> SearchConfig:
        """The service's request limits (``max_query_chars``, ``max_upload_bytes``, ``max_k``): the server
        sets them once, so the UI and the REST API enforce the same ones."""
        return self.service.config

    @property
    def k_choices(self) -> list[int]:
        """The Top-k choices the server allows (those of ``K_CHOICES`` up to its ``max_k``)."""
        return [k for k in K_CHOICES if k <= self.limits.max_k] or [self.limits.max_k]

    @property
    def k_default(self) -> int:
        """The Top-k a tab starts with: 10 where the server allows it."""
        return 10 if 10 in self.k_choices else self.k_choices[-1]

    @property
    def card_actions(self) -> tuple[str, ...]:
        """The buttons of an image result card: "more like this", and "remove" when the UI may write."""
        return ("similar", "remove") if self.writes else ("similar",)

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
