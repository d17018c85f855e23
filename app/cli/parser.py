"""The `ltd` parser and entry point: every subcommand module registers itself on the parser.

User mistakes (bad config keys, missing files, corrupt images, unloadable checkpoints) end with one
line on stderr and exit code 2; ``-v`` (anywhere on the command line) adds the traceback.
"""
from __future__ import annotations

import argparse
import logging
import sys

from app.cli import caption, data, demo, experiment, index, serve, train
from training.config import ConfigError
from training.data.images import ImageError
from training.data.karpathy import DatasetError

COMMANDS = (data, train, index, serve, demo, experiment, caption)


def _setup(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("faiss.loader", "httpx", "sentence_transformers", "transformers", "urllib3", "matplotlib", "PIL",
                  "multipart"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and every subcommand's own parser (so errors show the right usage)."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's parser must not reset a -v given before the command name
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging, and tracebacks on errors")
    p = argparse.ArgumentParser(prog="ltd", description="Image-caption retrieval with latent target decoding.",
                                parents=[common])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    before = set(sub.choices)
    for module in COMMANDS:
        module.register(sub, common)
    return p, {name: sub.choices[name] for name in sub.choices if name not in before}


def _set_hint(extra: list[str], argv: list[str]) -> str:
    """A hint for `--set KEY VALUE` (the value must be joined with '=')."""
    for i, a in enumerate(argv[:-1]):
        if a == "--set" and "=" not in argv[i + 1] and i + 2 < len(argv) and argv[i + 2] in extra:
            return f"; did you mean --set {argv[i + 1]}={argv[i + 2]} ?"
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # report it with the command's own usage, not the top level's
        commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}{_set_hint(extra, argv)}")
    verbose = getattr(args, "verbose", False)
    _setup(verbose)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, DatasetError, ImageError, FileNotFoundError, FileExistsError, ValueError,
            RuntimeError) as e:
        # User mistakes: one clear line, no traceback (use -v for one).
        if verbose:
            logging.exception("failed")
        print(f"ltd {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
