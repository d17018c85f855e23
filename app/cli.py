"""`ltd`: the command line. The composition root that wires training, indexer and the service.

Each subcommand lives in its own module (app/cmd_*.py); this file only builds the parser.
"""
from __future__ import annotations

import argparse
import logging
import sys

from training.config import ConfigError
from training.data.images import ImageError
from training.data.karpathy import DatasetError


def _setup(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("faiss.loader", "httpx", "sentence_transformers", "transformers", "urllib3", "matplotlib", "PIL", "multipart"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    from app import cmd_data, cmd_train

    p = argparse.ArgumentParser(prog="ltd", description="Image-caption retrieval with latent target decoding.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cmd_data.register(sub)
    cmd_train.register(sub)
    for name in ("cmd_index", "cmd_serve", "cmd_demo", "cmd_experiment", "cmd_caption"):
        try:
            mod = __import__(f"app.{name}", fromlist=["register"])
        except ModuleNotFoundError as e:
            if e.name != f"app.{name}":
                raise
            continue
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup(args.verbose)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, DatasetError, ImageError, FileNotFoundError, FileExistsError, ValueError,
            RuntimeError) as e:
        # User mistakes: one clear line, no traceback (use -v for one).
        if args.verbose:
            logging.exception("failed")
        print(f"ltd {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
