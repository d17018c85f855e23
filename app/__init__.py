"""LTD retrieval — app: the `ltd` CLI and the FastAPI service (the composition root).

CPU threading settings must be in the environment before torch is first imported: OpenMP reads
them once. The OpenMP wait policy depends on the command:

- ``ltd serve`` gets ``OMP_WAIT_POLICY=PASSIVE``: many request threads share 2 cores, and threads
  that busy-wait between requests take CPU from the ones doing work.
- everything else (train, experiment, demo, index, eval) keeps the OpenMP default (spin briefly,
  then sleep). PASSIVE makes every parallel region pay a sleep/wake-up, which the GRU caption
  encoder's hundreds of small per-time-step regions feel most: one Flickr8k epoch of the
  ``flickr8k_ltd`` preset took 92 s with PASSIVE and 53 s with the default on a 2-core VM
  (BENCHMARKS.md).

A value the user set always wins.
"""
import os as _os
import sys as _sys


def _command() -> str | None:
    """The ``ltd`` subcommand this process runs (first non-option argument), if any."""
    return next((a for a in _sys.argv[1:] if not a.startswith("-")), None)


for _k, _v in (("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    _os.environ.setdefault(_k, _v)
if _command() == "serve":
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
