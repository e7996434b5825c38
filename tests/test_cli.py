"""The `scalerl` command line: lazy registration (no torch for `fit`, `compare` and any `--help`)."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import scalerl.cli
from scalerl.cli import COMMANDS, build_parser, command_of
from scalerl.scaling.io import reference_csv

PROBE = """
import contextlib, io, json, sys
from scalerl.cli import main
report = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    report.append({"argv": argv, "code": code, "heavy": heavy, "chars": len(out.getvalue())})
print(json.dumps(report))
"""


def _probe(*commands: list[str]) -> list[dict[str, object]]:
    """Run `commands` one after the other in one fresh interpreter; after each, which heavy modules
    are loaded (they stay loaded, so the first command that pulls one in is the culprit)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(commands))], capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


HELP = [["--help"], *([name, "--help"] for name in COMMANDS), ["data", "check", "--help"],
        ["data", "synth", "--help"], ["data", "difficulty", "--help"], ["data", "curate", "--help"]]


def test_help_never_imports_torch() -> None:
    for result in _probe(*HELP):
        assert result["code"] == 0 and result["chars"] > 100, result
        assert result["heavy"] == [], f"`scalerl {' '.join(result['argv'])}` imported {result['heavy']}"


def test_fit_and_compare_never_import_torch(tmp_path: Path) -> None:
    ref = str(reference_csv("scalerl_8b_dense_fig1a"))
    other = str(reference_csv("scalerl_scout_moe_fig1a"))
    fit, cmp = _probe(["fit", ref, "--bootstrap", "20", "--plot", str(tmp_path / "fit.png")],
                      ["compare", ref, other, "--bootstrap", "20", "--json"])
    assert fit["code"] == 0 and fit["heavy"] == []
    assert cmp["code"] == 0 and cmp["heavy"] == []


def test_fit_cross_and_curate_never_import_torch(tmp_path: Path) -> None:
    runs = []
    for name, n in (("a", 1e9), ("b", 2e9)):
        rows = [{"flops": x, "val_pass_rate": 1 - (3e9 / n / x) ** 0.3} for x in (1e12, 1e13, 1e14, 1e15)]
        (path := tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(str(path))
    rated = tmp_path / "rated.jsonl"
    rated.write_text(json.dumps({"id": "q", "task": "math", "prompt": "Compute 1+1", "answer": "2",
                                 "metadata": {"model_difficulty": {"pass_rate": 0.5}}}) + "\n")
    cross, cur = _probe(["fit-cross", *runs, "--size", "a=1B", "--size", "b=2B"],
                        ["data", "curate", str(rated), "--out", str(tmp_path / "out.jsonl")])
    assert cross["code"] == 0 and cross["heavy"] == []
    assert cur["code"] == 0 and cur["heavy"] == []


def test_only_the_chosen_command_is_registered_in_full() -> None:
    parser = build_parser(["fit", "x.csv"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    # fit and compare come from one module: both in full; the others are one-line entries.
    assert any(a.dest == "predict_at" for a in sub.choices["fit"]._actions)
    assert any(a.dest == "margin_a" for a in sub.choices["compare"]._actions)
    assert not sub.choices["train"]._actions
    assert command_of(["--version"]) is None and command_of(["train", "--max-steps", "3"]) == "train"


def test_one_line_help_matches_each_module() -> None:
    """The lazy table's help text is what each module registers (so `scalerl --help` cannot drift)."""
    for name, (module, help_text) in COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).register(sub)
        helps = {a.dest: a.help for a in sub._choices_actions}
        assert helps[name] == help_text, name
    assert set(scalerl.cli.COMMAND_MODULES) == {m for m, _ in COMMANDS.values()}


def test_bad_input_is_one_line_unless_debug_asks_for_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scalerl.cli import main

    missing = str(tmp_path / "nope")
    assert main(["fit", missing]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "scalerl fit: error: " in err
    assert main(["--debug", "fit", missing]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "scalerl fit: error: " in err
    monkeypatch.setenv("SCALERL_DEBUG", "1")
    assert main(["fit", missing]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_an_error_of_ours_outside_a_run_is_exit_1_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import scalerl.cli.fit as fit_cli
    from scalerl.cli import main

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("setting an array element with a sequence")  # numpy's words, a bug of ours

    monkeypatch.setattr(fit_cli, "analyze_curve", broken)
    assert main(["fit", str(reference_csv())]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "internal error (ValueError" in err
    assert "scalerl fit: error:" not in err


def test_overrides_are_taken_anywhere_among_the_flags() -> None:
    from scalerl.cli import parse_args

    argv = ["train", "a.b=1", "--max-steps", "2", "eval.at_start=false", "--seed", "3", "c=4"]
    args = parse_args(build_parser(argv), argv)
    assert args.overrides == ["a.b=1", "eval.at_start=false", "c=4"]
    assert args.max_steps == 2 and args.seed == 3
    for argv in (["train", "--max-steps", "2", "--frobnicate"], ["fit", "m.jsonl", "--x", "flops", "k=v"]):
        try:
            parse_args(build_parser(argv), argv)
        except SystemExit as exit_:
            assert exit_.code == 2
        else:
            raise AssertionError(f"{argv} parsed")
