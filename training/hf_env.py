"""The Hugging Face libraries' environment, set in one place.

- ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``: a model that is not on disk fails at once instead of
  being downloaded (every model is a local path or an installed package; nothing is fetched at run time).
- ``TOKENIZERS_PARALLELISM=false``: the tokenizers' own thread pool warns and can deadlock in forked
  DataLoader workers, and competes with the request threads of a server.

They must be in the environment before transformers, sentence-transformers or tokenizers are imported.
Called by the CLI as it starts (app/cli/__init__.py), by ``training.targets`` before it loads a sentence
model (library use without the CLI), by the tests' conftest and by the bench scripts. A value the user
set wins. No imports beyond ``os``: ``ltd --help`` loads this module.
"""
from __future__ import annotations

import os

HF_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def set_hf_environment() -> None:
    """Put ``HF_ENVIRONMENT`` into ``os.environ`` where the user has not set a value."""
    for key, value in HF_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
