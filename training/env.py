"""The ``LTD_*`` environment variables of the library, read here and nowhere else.

One mechanism for every ``LTD_*`` variable: a pydantic-settings model with the prefix ``LTD_``. This
one holds the library's (data, caches, progress, runtimes); the service's (``LTD_MODELS``,
``LTD_API_TOKEN``, ``LTD_MAX_K``, …) are the fields of ``app.api.settings.Settings``, the same kind of
model with the same prefix (tests/test_environment.py checks that nothing else reads one). Each is
typed and documented once; a bad value fails with one line naming the variable. They are read on
every call (cheap), so a test's ``monkeypatch.setenv`` and a worker's inherited environment both
apply. ``data.path`` values may also name variables (``$LTD_DATA_DIR/dataset_flickr8k.json``), which
``training.prepare`` expands.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from training.config_base import ConfigError, error_line

PREFIX = "LTD_"


class Environment(BaseSettings):
    """The library's ``LTD_*`` variables (an unset or empty one: the default)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore")

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
    # JPEG decoding for a model on a GPU: auto = on the device when nvImageCodec is installed
    # (training/data/gpu_decode.py), off = in CPU worker processes.
    gpu_decode: Literal["auto", "off"] = "auto"

    @field_validator("progress", "feature_dtype", "gpu_decode", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


def environment() -> Environment:
    """The ``LTD_*`` variables now; a bad value is a one-line ConfigError naming the variable."""
    try:
        return Environment()
    except ValidationError as e:
        name = str(e.errors()[0]["loc"][0])
        line = error_line(e, Environment)
        raise ConfigError(f"environment variable {PREFIX}{name.upper()}{line[len(name):]}") from None


def default_cache_dir(configured: str = "") -> Path:
    """The cache folder: a config's ``cache_dir``, else ``LTD_CACHE_DIR``, else ``~/.cache/ltd``."""
    return Path(configured or environment().cache_dir or Path.home() / ".cache" / "ltd")


@contextmanager
def exported(**values: str) -> Iterator[None]:
    """``LTD_<NAME>=value`` for each keyword (``exported(progress="off")``) in this process's environment
    while the block runs, so that the processes started in it inherit them; the earlier values come back
    after. A setting for child processes: this process reads its own settings elsewhere."""
    names = {PREFIX + k.upper(): v for k, v in values.items()}
    before = {n: os.environ.get(n) for n in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for n, v in before.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
