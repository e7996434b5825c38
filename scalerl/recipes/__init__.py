"""Named recipes: YAML presets of algorithmic choices, each a partial `RunConfig` tree.

A recipe is a file in this package, `NAME.yaml`, whose header comment starts with a one-line
description, followed by a `# Source:` line naming where its settings come from. Recipes set only
algorithmic choices (loss, aggregation, normalization, filters, off-policy algorithm, precision,
length control, and the batch shape where a source prescribes one), never a model or data path,
so any recipe applies to any model.

    from scalerl.recipes import list_recipes, load_recipe_config

    for name, description in list_recipes():
        print(name, "-", description)
    cfg = load_recipe_config("scalerl", "my_run.yaml", overrides=["pipeline.k=4"])

Precedence, lowest first: the built-in defaults, the recipe, the user's YAML files in order, then
`key.sub=value` overrides. The resolved config records the recipe's name in `recipe`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from scalerl.config import ConfigError, RunConfig, build_config, override_layer, yaml_layer

RECIPES_DIR = Path(__file__).resolve().parent
_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")
_SOURCE_PREFIX = "Source:"


@dataclass(frozen=True)
class RecipeInfo:
    """What a recipe file's header says about it."""

    name: str
    description: str
    source: str
    path: Path


def recipe_names() -> list[str]:
    """Names of the bundled recipes, sorted."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml") if _NAME.fullmatch(p.stem))


def recipe_path(name: str) -> Path:
    """The file of recipe `name`; `ConfigError` listing the known names if there is none."""
    known = recipe_names()
    # Only bare names are looked up, so `name` can never point outside this package.
    if name not in known:
        raise ConfigError(f"unknown recipe {name!r}; known recipes: {', '.join(known)}")
    return RECIPES_DIR / f"{name}.yaml"


def _header_lines(path: Path) -> list[str]:
    """The text of the leading comment block, one entry per line, without the `#`."""
    lines = []
    for raw in path.read_text().splitlines():
        if not raw.startswith("#"):
            break
        lines.append(raw[1:].strip())
    return lines


def recipe_info(name: str) -> RecipeInfo:
    """Description (first header line) and source (the `# Source:` line) of recipe `name`."""
    path = recipe_path(name)
    header = _header_lines(path)
    description = header[0] if header else ""
    source = next((h[len(_SOURCE_PREFIX) :].strip() for h in header if h.startswith(_SOURCE_PREFIX)), "")
    return RecipeInfo(name=name, description=description, source=source, path=path)


def list_recipes() -> list[tuple[str, str]]:
    """`(name, one-line description)` of every bundled recipe, sorted by name."""
    return [(name, recipe_info(name).description) for name in recipe_names()]


def load_recipe_config(
    name: str,
    *extra_yaml: str | Path,
    overrides: tuple[str, ...] | list[str] = (),
) -> RunConfig:
    """Resolve recipe `name`, then the user's YAML files in order, then overrides; validate.

    Errors name the file and line (or the override) that set the offending key.
    """
    path = recipe_path(name)
    # The name goes in as the lowest layer, so a user file may still relabel the run.
    layers = [({"recipe": name}, {("recipe",): f"recipe {name!r}"}), yaml_layer(path)]
    layers.extend(yaml_layer(p) for p in extra_yaml)
    layers.append(override_layer(list(overrides)))
    return build_config(layers)


__all__ = [
    "RECIPES_DIR",
    "RecipeInfo",
    "list_recipes",
    "load_recipe_config",
    "recipe_info",
    "recipe_names",
    "recipe_path",
]
