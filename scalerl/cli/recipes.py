"""``scalerl recipes``: list the bundled recipes, print one, or print its resolved config.

    scalerl recipes                    # name and one-line description of every recipe
    scalerl recipes NAME               # the recipe file itself: redirect it, edit it, pass it back
    scalerl recipes NAME --resolved    # the full config it resolves to (defaults filled in)
    scalerl recipes NAME --path        # where the file is installed

Registered by ``scalerl.cli`` through ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import sys

from scalerl.config import config_to_yaml
from scalerl.inputs import InputError
from scalerl.recipes import list_recipes, load_recipe_config, recipe_path


def _list() -> str:
    rows = list_recipes()
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {description}" for name, description in rows]
    lines.append("")
    lines.append("`scalerl recipes NAME` prints a recipe file; add --resolved for the full config it gives.")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        if args.resolved or args.path:
            raise InputError("--resolved and --path need a recipe NAME")
        sys.stdout.write(_list())
        return 0
    path = recipe_path(args.name)
    if args.path:
        sys.stdout.write(f"{path}\n")
    elif args.resolved:
        sys.stdout.write(config_to_yaml(load_recipe_config(args.name)))
    else:
        sys.stdout.write(path.read_text())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "recipes",
        help="list the named recipes, or print one",
        description=(
            "List the bundled recipes (algorithmic presets with their sources), print one as a file "
            "to copy and edit, or print the full config it resolves to."
        ),
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="recipe to print (omit to list them all)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--resolved", action="store_true", help="print the resolved config (built-in defaults + recipe)"
    )
    shown.add_argument("--path", action="store_true", help="print the path of the recipe file")
    p.set_defaults(func=run)
