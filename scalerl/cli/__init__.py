"""The `scalerl` command line: every subcommand's arguments, messages and exit statuses.

Each subcommand is a module of this package (`scalerl.cli.train`, `scalerl.cli.eval`, ...) that
exposes `register(subparsers)`, which adds its parsers and sets `func(args) -> int` as their
default. Commands parse and report; what they run is built by the composition root
(`scalerl.assembly`) or a study (`scalerl.studies`), which never print for a command's sake nor
exit. Nothing below this package imports it. A subcommand is listed here only once it works end
to end.

Registration is lazy: only the module of the command being run is imported (the others appear in
`scalerl --help` by their one-line help from `COMMANDS`), so `scalerl fit`, `scalerl compare` and
every `--help` start without importing torch or transformers (seconds of CPU on a small machine).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from scalerl import __version__
from scalerl.assembly.failures import is_input_error
from scalerl.inputs import InputError

#: subcommand -> (the module that registers it, the one-line help of `scalerl --help`).
COMMANDS: dict[str, tuple[str, str]] = {
    "fit": ("scalerl.cli.fit", "fit the ScaleRL sigmoid to runs and predict where they end"),
    "compare": ("scalerl.cli.fit", "compare recipes: asymptote, efficiency, crossover, fixed-A refit"),
    "fit-cross": ("scalerl.cli.fit_cross", "fit the cross-model-size law (Tan et al.) to runs of many sizes"),
    "recipes": ("scalerl.cli.recipes", "list the named recipes, or print one"),
    "data": ("scalerl.cli.data", "write a synthetic prompt set, check, rate or curate a prompt file"),
    "sft": ("scalerl.cli.sft", "supervised fine-tuning (warm start before RL)"),
    "train": ("scalerl.cli.train", "run RL training (recipe + config + overrides)"),
    "eval": ("scalerl.cli.eval", "mean@k / pass@k of a checkpoint or model on held-out prompts"),
    "export": ("scalerl.cli.export",
               "write a checkpoint's weights as a Hugging Face model (LoRA adapters merged)"),
    "ablate": ("scalerl.cli.ablate",
               "leave-one-out, grid or coupled-axis study: run, fit, tabulate (paper Fig. 7)"),
    "serve": ("scalerl.cli.serve", "an OpenAI-compatible endpoint over a checkpoint or model"),
    "watch": ("scalerl.cli.watch", "follow runs in progress: step, compute, pass rate, live forecast of A"),
    "demo": ("scalerl.cli.demo",
             "train the tiny default, fit the first half, check the predicted final pass rate"),
}
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


class UserError(InputError):
    """An error caused by the user's input; printed without a traceback, exit status 2."""


DEBUG_VAR = "SCALERL_DEBUG"


def debug_wanted(args: argparse.Namespace) -> bool:
    """`--debug` or `SCALERL_DEBUG=1`: show the traceback of bad input too."""
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_VAR, "").strip().lower() in (
        "1", "true", "yes", "on")


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` runs: its first word that is not an option (top-level options take no
    value), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: the full parser of its command, one-line entries for the others.

    `argv=None` registers every command in full (for tools that walk the whole parser).
    """
    parser = argparse.ArgumentParser(
        prog="scalerl",
        description="RL post-training on verifiable rewards, with compute-scaling prediction.",
    )
    parser.add_argument("--version", action="version", version=f"scalerl {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of bad input too (or set {DEBUG_VAR}=1)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = None if argv is None else COMMANDS.get(command_of(argv) or "", (None, ""))[0]
    for name, (module, help_text) in COMMANDS.items():
        if name in subparsers.choices:
            continue  # registered with an earlier command of the same module
        if argv is None or module == wanted:
            importlib.import_module(module).register(subparsers)
        else:
            subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """`parser.parse_args`, with `KEY=VALUE` overrides taken anywhere among the flags.

    argparse gives a `nargs="*"` positional only the words before the first flag
    (`train --max-steps 2 eval.at_start=false` would leave the override unrecognized), and its
    `parse_intermixed_args` does not support subcommands; so the words left over are the command's
    overrides, in the order typed, if it takes any and none of them is an option.
    """
    args, extras = parser.parse_known_args(argv)
    if extras:
        if isinstance(getattr(args, "overrides", None), list) and not any(e.startswith("-") for e in extras):
            args.overrides = [*args.overrides, *extras]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_in)
    args = parse_args(parser, args_in)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"scalerl {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        # Two kinds of failure. Bad input (the exceptions `scalerl.assembly.failures.INPUT_ERRORS`
        # names, raised where input is validated): one line, exit 2. Anything else is ours (a bug of
        # scalerl or a library's failure): the traceback, exit 1; a training run has also written it
        # to its error.log and recorded the stop in sessions.jsonl.
        if is_input_error(err):
            if debug_wanted(args):
                traceback.print_exc(file=sys.stderr)
            print(f"scalerl {args.command}: error: {err}", file=sys.stderr)
            return 2
        traceback.print_exc(file=sys.stderr)
        print(f"scalerl {args.command}: internal error ({type(err).__name__}, not a problem with your "
              "input): please report it with the traceback above", file=sys.stderr)
        return 1

