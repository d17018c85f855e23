"""The `ltd` parser and entry point: every subcommand module registers itself on the parser.

The error boundary tells the truth. User mistakes (``training.errors.UserError``: bad config keys,
missing files, corrupt images, unloadable checkpoints) end with one line on stderr and exit code 2;
``-v`` (anywhere on the command line) adds the traceback. Anything else (a shape mismatch, running
out of memory) is a bug or a machine problem, not the user's mistake: its traceback is printed with a
request to report it, exit code 1.
"""
from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from app.cli import caption, compare, data, demo, experiment, index, interop, items, serve, train
from training.errors import UserError

COMMANDS = (data, train, index, items, interop, compare, serve, demo, experiment, caption)


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


@contextmanager
def _process_settings(args: argparse.Namespace) -> Iterator[None]:
    """The settings of the whole process that the commands' shared flags give, while the command runs:
    ``--no-progress`` shows no progress here nor in the processes the command starts (data-parallel
    ranks, grid jobs, local Ray workers: ``training.progress.quiet_everywhere``), and ``--device`` is the
    device the command computes on (``training.device.using_device``)."""
    with ExitStack() as stack:
        if getattr(args, "no_progress", False):
            from training.progress import quiet_everywhere  # lazy: pydantic stays out of `ltd --help`

            stack.enter_context(quiet_everywhere())
        if getattr(args, "device", None):
            from training.device import using_device  # lazy: torch stays out of `ltd --help`

            stack.enter_context(using_device(args.device))
        yield


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # report it with the command's own usage, not the top level's
        commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}{_set_hint(extra, argv)}")
    verbose = getattr(args, "verbose", False)
    _setup(verbose)
    try:
        with _process_settings(args):
            return int(args.func(args) or 0)
    except UserError as e:  # the user can fix it: one clear line, no traceback (use -v for one)
        if verbose:
            logging.exception("failed")
        print(f"ltd {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # not the user's mistake: show where it happened
        traceback.print_exc()
        print(f"ltd {args.command}: internal error ({type(e).__name__}): this is a bug or a machine problem, not a "
              "mistake in the command; please report it with the command line and the traceback above",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
