"""The README and the docs agree with the code: the demo's settings, the loop's commands, the
warm start's steps, where plots land."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from scalerl.cli import COMMANDS, build_parser
from scalerl.studies.demo import SETTINGS_FILE
from scalerl.training.sft_config import SFTConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}") + 1
    end = README.find("\n## ", start + 1)
    return README[start:end]


def _code_lines(text: str, languages: tuple[str, ...] = ("", "bash")) -> list[str]:
    """Lines of the fenced code blocks in `languages` ("" = no language given)."""
    out, lang = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            lang = line[3:].strip() if lang is None else None
            continue
        if lang in languages:
            out.append(line)
    return out


def _commands(text: str) -> list[list[str]]:
    lines = [ln.split(" #", 1)[0].strip() for ln in _code_lines(text)]
    commands = [shlex.split(ln)[1:] for ln in lines if ln.startswith("scalerl ") and not ln.endswith("\\")]
    return [c for c in commands if c and c[0] in COMMANDS]  # not a table row that starts with "scalerl"


def test_the_demo_block_matches_the_shipped_settings() -> None:
    section = _section("Try it: the demo")
    shipped = yaml.safe_load(SETTINGS_FILE.read_text())["run"]
    steps, every = shipped["max_steps"], shipped["eval"]["every"]
    head = re.search(r"demo: recipe scalerl, (\d+) steps, (\d+) evaluations \((\d+) held-out prompts x (\d+) "
                     r"samples\), [\d.]+ min", section)
    assert head, "the README shows no demo output"
    assert [int(g) for g in head.groups()] == [steps, steps // every + 1, shipped["data"]["heldout_size"],
                                               shipped["eval"]["k"]]
    assert f"for {steps} steps" in section and f"every {every} steps" in section
    assert f"{SFTConfig().steps} SFT steps" in section  # the warm start's length, as the code has it


def test_the_loop_commands_parse_and_do_what_they_say() -> None:
    commands = _commands(_section("Predict where a run ends"))
    assert [c[0] for c in commands] == ["train", "fit", "train", "compare"]
    for argv in commands:
        args = build_parser(argv).parse_args(argv)
        if argv[0] == "train":
            # A run's length is its step count: --max-time-s alone stops at the default 100 steps.
            assert args.max_steps is not None
        if argv[0] in ("fit", "compare"):
            # The x axis that does not depend on machine load, and a window that always holds out
            # the second half whatever the run's length.
            assert args.x == "flops"
        if argv[0] == "fit":
            assert args.fit_fraction == 0.5 and args.max_x is None
        if getattr(args, "plot", None):
            assert args.plot.startswith("runs/"), "plots go into runs/, not the repository root"


def test_the_docs_state_the_warm_start_steps_of_the_code() -> None:
    training = (ROOT / "docs" / "training.md").read_text()
    assert f"Defaults (`scalerl/training/sft_config.py`): {SFTConfig().steps} steps" in training
    assert "250 steps" not in training


def test_the_readme_is_short_and_its_quickstarts_are_on_the_first_screen() -> None:
    lines = README.splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines (issue: at most ~150)"
    first_screen = "\n".join(lines[:40])
    for title in ("Try it", "Your model on GSM8K", "Predict where a run ends"):
        assert f"## {title}" in README and f"[{title}" in first_screen, title


def test_the_readme_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


@pytest.mark.parametrize("doc", ["README.md", "docs/studies.md", "docs/training.md"])
def test_no_example_relies_on_a_max_time_flag_that_does_not_exist(doc: str) -> None:
    text = (ROOT / doc).read_text()
    for argv in _commands(text):
        build_parser(argv).parse_args(argv)  # SystemExit on an unknown flag


def test_the_python_example_uses_the_api_as_it_is() -> None:
    """The README's Python block compiles, calls `scalerl.train` with keywords its signature takes
    (the dotted overrides are config keys), and its reward function works in TRL's signature.
    `tests/test_api.py` trains through the API itself."""
    import ast
    import inspect

    import scalerl
    from tests.test_docs_keymaps import key_exists

    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "scalerl.train(" in b]
    tree = ast.parse(block)
    (call,) = [n for n in ast.walk(tree)
               if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "train"]
    params = inspect.signature(scalerl.train).parameters
    for kw in call.keywords:
        if kw.arg is None:  # **{"data.split": ...}: config keys
            assert all(key_exists(k.value) for k in kw.value.keys), ast.unparse(kw.value)
        else:
            assert kw.arg in params, kw.arg
    namespace: dict = {}
    exec(compile(ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef)], []), "README", "exec"),
         namespace)
    assert namespace["correct"](["q", "q"], ["the answer is 5", "7"], answer=["5", "5"]) == [1.0, 0.0]
