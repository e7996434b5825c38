"""The `scalerl` command line.

Each subcommand lives beside the code it drives: a module listed in `COMMAND_MODULES` exposes
`register(subparsers)`, which adds its parsers and sets `func(args) -> int` as their default.
A subcommand is listed here only once it works end to end.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from scalerl import __version__

COMMAND_MODULES: tuple[str, ...] = (
    "scalerl.scaling.cli",
    "scalerl.recipes.cli",
    "scalerl.data.cli",
    "scalerl.training.cli",
    "scalerl.pipeline.cli",
    "scalerl.evaluation.cli",
    "scalerl.studies.ablate",
    "scalerl.studies.demo",
)


class UserError(Exception):
    """An error caused by the user's input; printed without a traceback, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scalerl",
        description="RL post-training on verifiable rewards, with compute-scaling prediction.",
    )
    parser.add_argument("--version", action="version", version=f"scalerl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (UserError, ValueError, FileNotFoundError) as err:
        print(f"scalerl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"scalerl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
