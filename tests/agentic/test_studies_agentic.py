"""`scalerl ablate` and `scalerl compare` on agentic runs: a grid study over `agentic.max_turns`
trains real trajectories through the study's run path (shared warm start, per-variant configs),
writes its summary, report and plot, and `scalerl compare` reads the two run directories it wrote.

The warm start (`tests/agentic/tool_run.py`) calls the calculator in most episodes, so the variants'
turn limits show in what the trajectories did. Its held-out pass rate is 0, so the fitted curves are
flat: the study and the comparison (with its plot) must still come out whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scalerl.cli
from scalerl.config import build_config, yaml_layer
from scalerl.telemetry import read_rows
from tests.agentic.tool_run import OVERRIDES, warm_start_tool_model


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return warm_start_tool_model(tmp_path_factory.mktemp("sft"))


def test_ablate_then_compare_agentic_runs(tmp_path: Path, tool_model: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study"
    args = ["ablate", "--grid", "agentic.max_turns=1,2", "--output-dir", str(study), "--x", "flops",
            "--fit-fraction", "1", "--bootstrap", "0", "--device", "cpu", *OVERRIDES,
            f"model.name_or_path={tool_model}"]
    assert scalerl.cli.main(args) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((study / "summary.json").read_text())
    names = ["max_turns-1", "max_turns-2"]
    assert summary["n_completed"] == 2 and summary["failed"] == []
    assert sorted(r["name"] for r in summary["runs"]) == names
    assert (study / "report.md").is_file() and (study / "curves.png").is_file()

    for turns, name in enumerate(names, start=1):
        run_dir = study / "runs" / name
        cfg = build_config([yaml_layer(run_dir / "config.yaml")])
        assert cfg.agentic.max_turns == turns and cfg.agentic.environment == "tools"
        assert cfg.model.name_or_path == tool_model  # the shared warm start
        rows = read_rows(run_dir / "metrics.jsonl")
        steps = [r for r in rows if r["kind"] == "step"]
        evals = [r for r in rows if r["kind"] == "eval"]
        assert [r["step"] for r in steps] == [1, 2, 3, 4] and [r["step"] for r in evals] == [0, 1, 2, 3, 4]
        assert all(r["agentic_turns_max"] <= turns for r in steps)
        assert all("val_agentic_turns_mean" in r for r in evals)
        assert sum(r["agentic_tool_calls_mean"] for r in steps) > 0  # the warm start calls the tool
        if turns == 1:  # a call ends the episode at its turn limit: no tool result is ever appended
            assert all(r["agentic_env_tokens_mean"] == 0 for r in steps)
            assert any(r["agentic_end_turn_limit"] > 0 for r in steps)
        else:  # calls are answered (environment tokens, loss-masked) and the model takes a second turn
            assert max(r["agentic_turns_max"] for r in steps) == 2
            assert any(r["agentic_env_tokens_mean"] > 0 for r in steps)
    capsys.readouterr()

    plot = tmp_path / "compare.png"
    runs = [str(study / "runs" / n) for n in names]
    assert scalerl.cli.main(["compare", *runs, "--x", "flops", "--fit-fraction", "1", "--bootstrap", "0",
                             "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["recipe"] for r in out["recipes"]] == names  # each variant is its own recipe (config.yaml)
    assert sorted(r["label"] for r in out["runs"]) == names
    assert out["same_start_model"] is True
    assert plot.is_file()
