"""`ltd`: the command line, one module per subcommand (app/cli/<name>.py), each registered here.

CPU threading settings must be in the environment before torch is first imported: OpenMP reads
them once, so they are set when this package is imported, before any subcommand module loads.
The OpenMP wait policy depends on the command:

- ``ltd serve`` gets ``OMP_WAIT_POLICY=PASSIVE``: many request threads share 2 cores, and threads
  that busy-wait between requests take CPU from the ones doing work.
- ``ltd compare`` too: its split-wide word occlusion runs the GRU over thousands of variants at once
  (large parallel regions, where a sleep/wake-up costs little), and on a shared, loaded machine
  spinning threads starved it: 55 variants/s with the default against 214 with PASSIVE at 2 threads
  (BENCHMARKS.md, "Explanations").
- everything else (train, experiment, demo, index, eval) keeps the OpenMP default (spin briefly,
  then sleep). PASSIVE makes every parallel region pay a sleep/wake-up, which the GRU caption
  encoder's hundreds of small per-time-step regions feel most: one Flickr8k epoch of the
  ``flickr8k_ltd`` preset took 92 s with PASSIVE and 53 s with the default on a 2-core VM
  (BENCHMARKS.md).

A value the user set always wins.
"""
from __future__ import annotations

import os
import sys

from training.hf_env import set_hf_environment


def _command(argv: list[str]) -> str | None:
    """The ``ltd`` subcommand of ``argv`` (first non-option argument), if any."""
    return next((a for a in argv[1:] if not a.startswith("-")), None)


set_hf_environment()  # offline Hugging Face libraries, no tokenizer threads (training/hf_env.py)
if _command(sys.argv) in ("serve", "compare"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from app.cli.parser import main  # noqa: E402  (after the environment is set)

__all__ = ["main"]
