"""Service settings (pydantic-settings, environment prefix ``LTD_``).

Every field can be set from the environment, e.g. ``LTD_MODELS='{"bl": "indexes/bl"}'``,
``LTD_TORCH_THREADS=1``, ``LTD_UI=false``; ``ltd serve`` fills them from its flags.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from search import SearchConfig, SearchService


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LTD_", extra="ignore")

    # NAME → index directory; from `ltd serve --model NAME=DIR` or LTD_MODELS='{"bl": "indexes/bl"}'.
    models: dict[str, str] = Field(default_factory=dict)
    # NAME → captioner checkpoint (`ltd serve --captioner NAME=CKPT`): /api/caption and the Caption tab.
    captioners: dict[str, str] = Field(default_factory=dict)
    # NAME → checkpoint, for an index whose checkpoint moved (`--model NAME=INDEX_DIR@CHECKPOINT`).
    checkpoints: dict[str, str] = Field(default_factory=dict)
    # Index check at load: "hash" (sha256 of every data file, default) or "counts" (sizes and counts only,
    # for very large indexes; logged).
    verify_index: Literal["hash", "counts"] = "hash"
    # A bearer token for /api, /ui, /docs and /metrics (not /api/health). Set it whenever the server is
    # reachable by others: `Authorization: Bearer TOKEN`, or the cookie that /login sets for browsers.
    api_token: SecretStr | None = None
    # Host headers the server answers (DNS-rebinding protection); None = any. `ltd serve` sets the
    # loopback names when it binds a loopback address.
    allowed_hosts: list[str] | None = None
    device: str = "cpu"
    max_k: int = Field(1000, ge=1)
    max_query_chars: int = Field(1000, ge=1)
    max_upload_bytes: int = Field(10 * 1024 * 1024, ge=1)
    # Decoded size limit of an uploaded image (width × height). JPEGs decode at reduced scale first
    # (short side ≥ twice the model's input), so this binds PNG/WebP/GIF/BMP/TIFF: 16 MP is 64 MB in memory.
    max_upload_pixels: int = Field(16_000_000, ge=1)
    # Uploads decoded at the same time (each may hold max_upload_pixels × 4 bytes while it runs).
    max_concurrent_decodes: int = Field(2, ge=1)
    # Bodies of the JSON endpoints (a 1,000-character query is ~6 KB even fully \u-escaped).
    max_json_bytes: int = Field(64 * 1024, ge=1024)
    # Bodies of the UI's own requests (Gradio's queue and API calls; file uploads use max_upload_bytes).
    max_ui_json_bytes: int = Field(256 * 1024, ge=1024)
    load_in_background: bool = True  # answer /api/health (503 "loading") while models load
    ui: bool = True  # mount the Gradio UI at /ui
    # Intra-op threads of torch (0 = torch's default, one per core). With text batching one thread
    # runs the text encoder, so its intra-op threads do not oversubscribe the request threads:
    # 2 threads served 64 % more requests/s than 1 on the 2-core machine (bench/api_load.py).
    torch_threads: int = Field(0, ge=0)
    # OpenMP threads of FAISS (0 = leave the default). One query per search call cannot use more.
    faiss_threads: int = Field(1, ge=0)
    # Query-embedding LRU cache entries per service (0 = off). Repeated queries skip the encoder.
    text_cache: int = Field(4096, ge=0)
    # Group text queries that arrive while the encoder is busy into one encoder call.
    text_batching: bool = True
    max_text_batch: int = Field(64, ge=1)
    # Opt-in: encode queries with an int8 dynamically quantised copy of the text encoder (GRU and
    # Linear layers): ~2.5x faster on CPU, query embeddings within cosine 0.9999 of the float model,
    # but no longer bit-identical to what `ltd eval` scored. Index embeddings are unchanged.
    text_quantize: bool = False
    thumb_cache: int = Field(2048, ge=0)  # thumbnails kept in memory (LRU)
    image_cache_seconds: int = Field(3600, ge=0)  # Cache-Control max-age of images and thumbnails

    def search_config(self) -> SearchConfig:
        """The search service's part of these settings."""
        return SearchConfig(device=self.device, max_k=self.max_k, max_query_chars=self.max_query_chars,
                            max_upload_pixels=self.max_upload_pixels,
                            max_concurrent_decodes=self.max_concurrent_decodes, thumb_cache=self.thumb_cache,
                            text_cache=self.text_cache, text_batching=self.text_batching,
                            max_text_batch=self.max_text_batch, text_quantize=self.text_quantize,
                            verify_index=self.verify_index)

    def search_service(self) -> SearchService:
        """A (not yet loaded) search service for these settings' models."""
        return SearchService(self.models, checkpoints=self.checkpoints, config=self.search_config(),
                             captioners=self.captioners)
