"""The ``LTD_*`` environment variables of the library, read here and nowhere else.

Each is typed and documented once; a bad value fails with one line naming the variable. They are
read on every call (cheap), so a test's ``monkeypatch.setenv`` and a worker's inherited environment
both apply. The service's own variables (``LTD_MODELS``, ``LTD_API_TOKEN``, …) are the fields of
``app/api/settings.py`` (same prefix, same system); ``data.path`` values may also name variables
(``$LTD_DATA_DIR/dataset_flickr8k.json``), which ``training.prepare`` expands.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from training.config_base import ConfigError, error_line

PREFIX = "LTD_"


class Environment(BaseModel):

    # A Karpathy-format dataset (its JSON or the folder holding dataset_*.json): `ltd demo`'s default.
    data_dir: str = ""
    # Feature, target and synthetic-dataset caches (a config's data.cache_dir wins); "" = ~/.cache/ltd.
    cache_dir: str = ""
    # Progress output: bar (tqdm), log (a line every progress_interval seconds), off; unset = bar on a
    # terminal, log elsewhere.
    progress: Literal["bar", "log", "off"] | None = None
    progress_interval: float = Field(30.0, gt=0)
    # Image encoder runtime for frozen features (training/models/runtimes.py); "" = auto.
    image_runtime: str = ""
    # float32 pins frozen CNN features on the CPU to fp32 (auto: bf16 where the CPU runs it natively).
    feature_dtype: Literal["auto", "float32"] = "auto"
    # Where the UI writes thumbnails it serves; "" = ui-thumbs in the cache folder (private, search/files.py).
    ui_thumbs: str = ""

    @field_validator("progress", "feature_dtype", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


def environment() -> Environment:
    """The ``LTD_*`` variables now; a bad value is a one-line ConfigError naming the variable."""
    values = {name: os.environ[PREFIX + name.upper()] for name in Environment.model_fields
              if os.environ.get(PREFIX + name.upper())}  # unset or empty: the default
    try:
        return Environment.model_validate(values)
    except ValidationError as e:
        name = str(e.errors()[0]["loc"][0])
        line = error_line(e, Environment)
        raise ConfigError(f"environment variable {PREFIX}{name.upper()}{line[len(name):]}") from None


def default_cache_dir(configured: str = "") -> Path:
    """The cache folder: a config's ``cache_dir``, else ``LTD_CACHE_DIR``, else ``~/.cache/ltd``."""
    return Path(configured or environment().cache_dir or Path.home() / ".cache" / "ltd")
