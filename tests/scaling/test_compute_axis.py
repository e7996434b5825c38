"""The FLOPs axis from token and step counts: closed-form arithmetic, the meter's constants, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.scaling import compute_axis
from scalerl.scaling.compute_axis import FlopsAxis
from scalerl.scaling.io import read_curves
from scalerl.scaling.validation import CurveError


def test_constants_are_the_meters() -> None:
    from scalerl.telemetry import compute

    assert compute_axis.FORWARD_FLOPS_PER_PARAM == compute.FORWARD_FLOPS_PER_PARAM == 2
    assert compute_axis.TRAIN_FLOPS_PER_PARAM == compute.TRAIN_FLOPS_PER_PARAM == 6


def _log(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    p = tmp_path / "log.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_generated_trained_and_scored_tokens_priced_apart(tmp_path: Path) -> None:
    rows = [{"gen": 100 * k, "train": 300 * k, "ref": 50 * k, "val_pass_rate": 0.1 * k} for k in (1, 2, 3)]
    axis = FlopsAxis.from_token_kinds(1000, generated="gen", trained="train", scored="ref")
    (curve,) = read_curves(_log(tmp_path, rows), axis=axis)
    # 2N per generated or scored token, 6N per trained token, N = 1000.
    assert list(curve.x) == [2000 * 100 * k + 6000 * 300 * k + 2000 * 50 * k for k in (1, 2, 3)]
    assert curve.x_name == "flops" and "gen x 2N + ref x 2N + train x 6N" in (curve.x_note or "")


def test_steps_times_flops_per_step_and_forward_fill(tmp_path: Path) -> None:
    # Evaluation rows without the step column take the last step logged before them.
    rows = [{"step": 1}, {"step": 2}, {"val_pass_rate": 0.2}, {"step": 3}, {"step": 4},
            {"val_pass_rate": 0.3}]
    (curve,) = read_curves(_log(tmp_path, rows), axis=FlopsAxis.from_steps("step", 2.5e15))
    assert list(curve.x) == [2 * 2.5e15, 4 * 2.5e15]


def test_evaluation_before_any_count_is_an_error(tmp_path: Path) -> None:
    rows = [{"val_pass_rate": 0.1}, {"tokens": 10, "val_pass_rate": 0.2}]
    with pytest.raises(CurveError, match=r"log.jsonl:1: row has val_pass_rate but no flops"):
        read_curves(_log(tmp_path, rows), axis=FlopsAxis.from_tokens("tokens", 10))
    with pytest.raises(CurveError, match="--params"):
        FlopsAxis.from_tokens("tokens", 0)
    with pytest.raises(CurveError, match=r"log.jsonl:2: tokens = -3"):
        read_curves(_log(tmp_path, [{"tokens": 1}, {"tokens": -3, "val_pass_rate": 0.1}]),
                    axis=FlopsAxis.from_tokens("tokens", 10, per_step=True))


def test_cli_prints_the_conversion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = [1, 2, 3, 4, 6, 8, 12, 16]
    rows = [{"step": s, "val_pass_rate": 0.1 + 0.5 / (1 + (4 / s) ** 1.5)} for s in c]
    log = _log(tmp_path, rows)
    argv = ["fit", str(log), "--flops-per-step", "1e15", "--bootstrap", "0"]
    assert main([*argv, "--r0", "0.1", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    # C_mid 4 steps = 4e15 FLOPs at 1e15 per step.
    assert run["x"] == "flops" and run["C_mid"] == pytest.approx(4e15, rel=1e-3)
    assert main(["fit", str(log), "--flops-per-step", "1e15", "--bootstrap", "0"]) == 0
    assert "x axis: flops = step x 1e+15 (--flops-per-step)" in capsys.readouterr().out
    assert main(["fit", str(log), "--flops-per-step", "1e15", "--params", "7"]) == 2
