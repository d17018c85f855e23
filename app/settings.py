"""Service settings (pydantic-settings, environment prefix ``LTD_``)."""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LTD_", extra="ignore")

    # NAME → index directory; from `ltd serve --model NAME=DIR` or LTD_MODELS='{"bl": "indexes/bl"}'.
    models: dict[str, str] = Field(default_factory=dict)
    device: str = "cpu"
    max_k: int = 1000
    max_query_chars: int = 1000
    max_upload_bytes: int = 10 * 1024 * 1024
    load_in_background: bool = True  # answer /api/health (503 "loading") while models load
    ui: bool = True  # mount the Gradio UI at /ui
    torch_threads: int = 0  # 0 = leave torch's default
