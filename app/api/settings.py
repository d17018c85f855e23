"""Service settings (pydantic-settings, environment prefix ``LTD_``).

Every field can be set from the environment, e.g. ``LTD_MODELS='{"bl": "indexes/bl"}'``,
``LTD_TORCH_THREADS=1``, ``LTD_UI=false``; ``ltd serve`` fills them from its flags. The search
service's own limits are the fields of :class:`search.SearchConfig`, inherited here (declared once).
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from search import CaptionService, SearchConfig, SearchService
from training.config_base import ConfigError, error_line


class Settings(BaseSettings, SearchConfig):
    """Everything a server needs: the models and captioners to serve, the search service's limits and
    tuning (inherited from ``SearchConfig``), security, body limits and timeouts, threads. Each field is
    also an ``LTD_*`` variable (pydantic-settings); ``load_settings`` turns a bad value into one line."""

    model_config = SettingsConfigDict(env_prefix="LTD_", extra="ignore")

    # NAME → index directory; from `ltd serve --model NAME=DIR` or LTD_MODELS='{"bl": "indexes/bl"}'.
    models: dict[str, str] = Field(default_factory=dict)
    # NAME → captioner checkpoint (`ltd serve --captioner NAME=CKPT`): /api/caption and the Caption tab.
    captioners: dict[str, str] = Field(default_factory=dict)
    # NAME → checkpoint, for an index whose checkpoint moved (`--model NAME=INDEX_DIR@CHECKPOINT`).
    checkpoints: dict[str, str] = Field(default_factory=dict)
    # A bearer token for /api, /ui, /docs and /metrics (not /api/health). Set it whenever the server is
    # reachable by others: `Authorization: Bearer TOKEN`, or the cookie that /login sets for browsers.
    api_token: SecretStr | None = None
    # The token the living index's writes need (`Authorization: Bearer WRITE_TOKEN`), distinct from
    # api_token; required when a writable server binds a non-loopback address. It also reads.
    write_token: SecretStr | None = None
    # A multipart add (POST /api/models/{name}/items): its whole body (each file also within max_upload_bytes).
    max_add_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # How long a browser stays logged in after /login (the signed cookie's expiry).
    session_seconds: int = Field(12 * 3600, ge=60)
    # Wrong tokens an address may send a minute before it is locked (app/api/login.py), for the whole
    # server: with `--workers N` each process allows this / N (rounded up).
    max_wrong_tokens: int = Field(20, ge=1)
    workers: int = Field(1, ge=1)  # server processes (`ltd serve --workers`), set by `ltd serve`
    # Host headers the server answers (DNS-rebinding protection); None = any. `ltd serve` sets the
    # loopback names when it binds a loopback address.
    allowed_hosts: list[str] | None = None
    # Bodies of the JSON endpoints (a 1,000-character query is ~6 KB even fully \u-escaped).
    max_json_bytes: int = Field(64 * 1024, ge=1024)
    # Bodies of the UI's own requests (Gradio's queue and API calls; file uploads use max_upload_bytes).
    max_ui_json_bytes: int = Field(256 * 1024, ge=1024)
    # The UI's upload folder (Gradio's cache; $GRADIO_TEMP_DIR, else ui-uploads in the cache folder):
    # files older than this, or beyond these totals, are deleted oldest first (app/api/ui_guard.py).
    ui_cache_seconds: int = Field(3600, ge=60)
    ui_cache_bytes: int = Field(512 * 1024 * 1024, ge=1024 * 1024)
    ui_cache_files: int = Field(2000, ge=10)
    # Slow clients (app/api/connections.py): a request's headers must arrive within header_timeout s;
    # a body gets body_timeout s plus 1 s per min_body_rate bytes (8 KB/s: a 10 MB upload over a
    # 64 kbit/s link still fits); a response the client does not read for send_timeout s is dropped.
    header_timeout: float = Field(10.0, gt=0)
    body_timeout: float = Field(30.0, gt=0)
    min_body_rate: float = Field(8192.0, gt=0)
    send_timeout: float = Field(60.0, gt=0)
    # Connections per process (0 = from the descriptor limit, keeping a reserve for the server's files).
    max_connections: int = Field(0, ge=0)
    # The UI's long-lived streams (app/api/streams.py), per process: at most this many at once and from one
    # client address (a browser tab holds two); a heartbeat whose session did nothing else for
    # stream_idle_seconds is closed, any other stream stream_max_seconds after it opened.
    max_streams: int = Field(256, ge=1)
    max_streams_per_client: int = Field(16, ge=1)
    stream_idle_seconds: float = Field(900.0, gt=0)
    stream_max_seconds: float = Field(600.0, gt=0)
    # Addresses of reverse proxies whose X-Forwarded-For / X-Forwarded-Proto headers are believed (comma
    # separated, "*" for any; uvicorn's --forwarded-allow-ips). Empty: no proxy, the headers are ignored
    # and the peer's address is the client's (the wrong-token limit and the stream caps count by it).
    forwarded_allow_ips: str = ""

    load_in_background: bool = True  # answer /api/health (503 "loading") while models load
    ui: bool = True  # mount the Gradio UI at /ui
    # Intra-op threads of torch (0 = torch's default, one per core). With text batching one thread
    # runs the text encoder, so its intra-op threads do not oversubscribe the request threads:
    # 2 threads served 64 % more requests/s than 1 on the 2-core machine (bench/api_load.py).
    torch_threads: int = Field(0, ge=0)
    # OpenMP threads of FAISS (0 = leave the default). One query per search call cannot use more.
    faiss_threads: int = Field(1, ge=0)
    image_cache_seconds: int = Field(3600, ge=0)  # Cache-Control max-age of images and thumbnails

    def to_env(self) -> dict[str, str]:
        """``LTD_*`` variables from which another process (a worker) rebuilds these settings. Secrets
        carry their value: ``model_dump`` would write pydantic's mask, ``**********``, and every worker
        would then accept the mask and refuse the real token."""
        out = {}
        for key, value in self.model_dump(mode="json").items():
            secret = getattr(self, key)
            if isinstance(secret, SecretStr):
                value = secret.get_secret_value()
            if value is not None:
                out[f"LTD_{key.upper()}"] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        return out

    def search_config(self) -> SearchConfig:
        """The search service's part of these settings."""
        return SearchConfig.model_validate(self.model_dump(include=set(SearchConfig.model_fields)))

    def search_service(self) -> SearchService:
        """A (not yet loaded) search service for these settings' models."""
        return SearchService(self.models, checkpoints=self.checkpoints, config=self.search_config())

    def caption_service(self, search: SearchService) -> CaptionService:
        """The caption service of these settings' captioners, beside ``search``. Built before ``search``
        loads, its captioners load with the models (in the same thread, covered by ``ready``)."""
        return CaptionService(search, self.captioners)


def load_settings(**overrides: Any) -> Settings:
    """Settings from the flags (``overrides``) over the ``LTD_*`` environment; a bad value is a one-line
    ConfigError naming the setting (``LTD_`` + its upper-cased name in the environment)."""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise ConfigError(f"service settings (flags or LTD_* variables): {error_line(e, Settings)}") from None
