"""`scalerl recipes`: listing, printing a recipe file, its resolved config, its path."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from scalerl.cli import recipes as cli
from scalerl.config import load_config
from scalerl.recipes import list_recipes, load_recipe_config, recipe_path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="scalerl")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["recipes", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_listing_shows_every_recipe_with_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run([], capsys)
    lines = out.splitlines()
    recipes = list_recipes()
    for (name, description), line in zip(recipes, lines, strict=False):
        assert line.split(None, 1) == [name, description]
    # Descriptions start in one column, so the list reads as a table.
    starts = {line.index(desc) for (_, desc), line in zip(recipes, lines, strict=False)}
    assert len(starts) == 1
    assert "--resolved" in lines[-1]


def test_name_prints_the_file_which_loads_back_to_the_same_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = _run(["qwen_dapo"], capsys)
    assert out == recipe_path("qwen_dapo").read_text()
    copy = tmp_path / "my_recipe.yaml"
    copy.write_text(out)
    want = load_recipe_config("qwen_dapo").model_dump(exclude={"recipe"})
    assert load_config(copy).model_dump(exclude={"recipe"}) == want


def test_resolved_prints_the_full_config(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["gspo", "--resolved"], capsys)
    assert yaml.safe_load(out) == load_recipe_config("gspo").model_dump(mode="json")


def test_path_prints_where_the_file_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["minimax", "--path"], capsys) == f"{recipe_path('minimax')}\n"


def test_unknown_name_and_flags_without_a_name_are_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="unknown recipe 'nope'; known recipes: base"):
        _run(["nope"], capsys)
    with pytest.raises(ValueError, match="need a recipe NAME"):
        _run(["--resolved"], capsys)
    with pytest.raises(SystemExit):  # argparse: the two flags exclude each other
        _run(["scalerl", "--resolved", "--path"], capsys)
