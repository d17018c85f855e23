"""Service settings (pydantic-settings, environment prefix ``LTD_``).

Every field can be set from the environment, e.g. ``LTD_MODELS='{"bl": "indexes/bl"}'``,
``LTD_TORCH_THREADS=1``, ``LTD_UI=false``; ``ltd serve`` fills them from its flags.
"""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LTD_", extra="ignore")

    # NAME → index directory; from `ltd serve --model NAME=DIR` or LTD_MODELS='{"bl": "indexes/bl"}'.
    models: dict[str, str] = Field(default_factory=dict)
    device: str = "cpu"
    max_k: int = Field(1000, ge=1)
    max_query_chars: int = Field(1000, ge=1)
    max_upload_bytes: int = Field(10 * 1024 * 1024, ge=1)
    # Decoded size limit of an uploaded image (width × height), well below PIL's bomb limit: a
    # 50-megapixel upload already needs 150 MB as RGB.
    max_upload_pixels: int = Field(50_000_000, ge=1)
    # Bodies of the JSON endpoints (a 1,000-character query is ~6 KB even fully \u-escaped).
    max_json_bytes: int = Field(64 * 1024, ge=1024)
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
