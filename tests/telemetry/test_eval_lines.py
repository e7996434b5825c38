"""Each evaluation prints one line, on stderr, so a long run shows its curve as it goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.config import LoggingConfig
from scalerl.telemetry.run import RunTelemetry, eval_line


@pytest.mark.parametrize("progress", [True, False])
def test_eval_rows_print_a_line_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          progress: bool) -> None:
    with RunTelemetry(tmp_path, LoggingConfig(progress=progress), max_steps=20) as telemetry:
        telemetry.log_step(1, {"loss": 0.1})
        row = {"val_pass_rate": 0.5, "val_num_prompts": 64.0, "val_k": 4.0, "val_time_s": 3.2}
        telemetry.log_eval(10, row)
    out, err = capsys.readouterr()
    assert out == ""
    assert "eval at step 10: val_pass_rate 0.500 (64 prompts x 4 samples, 3 s)" in err


def test_eval_line_without_sizes() -> None:
    assert eval_line(0, {"val_pass_rate": 0.25}) == "eval at step 0: val_pass_rate 0.250"


def test_eval_line_prints_the_live_forecast_through_the_text_function_it_is_given() -> None:
    from scalerl.scaling.live import forecast_text

    row = {"val_pass_rate": 0.3, "forecast_A": 0.5, "forecast_A_lo": 0.4, "forecast_A_hi": 0.6,
           "forecast_status": "flagged:few_points", "forecast_shown": "flagged"}
    assert eval_line(5, row, forecast_text) == (
        "eval at step 5: val_pass_rate 0.300; forecast A in [0.400, 0.600], flagged:few_points")
    pinned = {**row, "forecast_A_lo": 0.49, "forecast_A_hi": 0.52, "forecast_status": "ok",
              "forecast_shown": "pinned"}
    assert eval_line(5, pinned, forecast_text).endswith("; forecast A 0.500 [0.490, 0.520] pinned")
    assert eval_line(5, row) == "eval at step 5: val_pass_rate 0.300"  # no text function: no forecast


def test_run_telemetry_prints_with_its_forecast_text(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with RunTelemetry(tmp_path, LoggingConfig(progress=False), max_steps=20,
                      forecast_text=lambda r: f"<{r['forecast_A']}>") as telemetry:
        telemetry.log_eval(10, {"val_pass_rate": 0.5, "forecast_A": 0.7})
    assert "eval at step 10: val_pass_rate 0.500; forecast <0.7>" in capsys.readouterr().err
