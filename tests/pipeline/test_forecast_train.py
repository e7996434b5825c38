"""`scalerl train` with the live forecast, end to end on a tiny model: the eval rows carry it, the
progress line shows it, `--stop-when-known` stops the run there with its last checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scalerl.cli import main

from .test_kill_resume import tiny_run_config
from .test_train_cli import tiny_model  # noqa: F401  (the module's warm-started tiny model fixture)


def _config(model: Path, run_dir: Path, tmp_path: Path, max_steps: int, eval_every: int = 1) -> Path:
    cfg = tiny_run_config(str(model), run_dir)
    cfg.max_steps = max_steps
    cfg.eval.every = eval_every
    cfg.checkpoint.every = 0
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_every_eval_row_past_min_evals_carries_the_forecast(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", "--recipe", "base", "-c", str(_config(tiny_model, run_dir, tmp_path, 6))]) == 0
    err = capsys.readouterr().err
    evals = [r for r in _rows(run_dir) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == list(range(7))
    # 4 evaluations with compute > 0 (steps 1-4) are fitted while step 5 trains: its row has them.
    assert [r["step"] for r in evals if "forecast_A" in r] == [5, 6]
    for r in evals[5:]:
        assert r["forecast_step"] == r["step"] - 1 and r["forecast_evals"] == r["step"] - 1
        assert r["forecast_status"] == "ok" or r["forecast_status"].startswith(("flagged:", "failed:"))
    # The progress line prints each row's forecast with the text function `scalerl watch` uses.
    from scalerl.scaling.live import forecast_text

    for r in evals[5:]:
        assert r["forecast_shown"] in ("pinned", "open", "flagged", "failed")
        line = next(ln for ln in err.splitlines() if f"eval at step {r['step']}: val_pass_rate" in ln)
        assert line.endswith(f"; forecast {forecast_text(r)}"), line
    final = json.loads((run_dir / "forecast.json").read_text())
    assert final["step"] == 6 and final["evals"] == 6


def test_stop_when_known_stops_at_that_evaluation_with_its_checkpoint(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    import scalerl.scaling.live as live

    # The tiny model's curve is noise: it never pins A. The rule itself is tested on curves that
    # do (tests/scaling/test_live_forecast.py); here any forecast counts as known, to test the stop.
    asked: list[float] = []
    monkeypatch.setattr(live.Forecast, "known", lambda self, w: asked.append(w) or True)
    run_dir = tmp_path / "run"
    config = _config(tiny_model, run_dir, tmp_path, 9)
    assert main(["train", "--recipe", "base", "-c", str(config), "--stop-when-known", "0.05"]) == 0
    assert asked == [0.05]
    assert max(r["step"] for r in _rows(run_dir)) == 5  # the first evaluation with a forecast
    assert (run_dir / "checkpoints" / "step_000005").is_dir()
    state = json.loads((run_dir / "checkpoints" / "step_000005" / "state.json").read_text())
    assert json.dumps(state).count("forecast_known") >= 1
    stops = [json.loads(line) for line in (run_dir / "sessions.jsonl").read_text().splitlines()]
    assert stops[-1]["stop_reason"] == "forecast_known" and stops[-1]["exit_status"] == 0


def test_a_stop_request_written_mid_run_stops_it_at_its_next_evaluation(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """What `ablate --prune` does to a variant: `stop_request.json` appears while it trains."""
    from scalerl.assembly import forecast

    run_dir = tmp_path / "run"
    logged = forecast.ForecastingSink.log_eval

    def log_eval(self: forecast.ForecastingSink, step: int, metrics: dict) -> object:
        row = logged(self, step, metrics)
        if step == 2:  # the controller's decision lands while step 2's row is written
            (run_dir / forecast.STOP_REQUEST_FILE).write_text('{"reason": "below_leader"}')
        return row

    monkeypatch.setattr(forecast.ForecastingSink, "log_eval", log_eval)
    assert main(["train", "--recipe", "base", "-c", str(_config(tiny_model, run_dir, tmp_path, 9))]) == 0
    assert max(r["step"] for r in _rows(run_dir)) == 2  # asked right after its step-2 evaluation
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
    stops = [json.loads(line) for line in (run_dir / "sessions.jsonl").read_text().splitlines()]
    assert stops[-1]["stop_reason"] == "pruned"


def test_a_stop_request_between_evaluations_stops_the_run_after_that_step(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """A pruned variant does not train on to its next evaluation: the request written while step 2
    is logged (evaluations every 4 steps) stops the run after step 2, which then evaluates once and
    checkpoints there."""
    from scalerl.assembly import forecast

    run_dir = tmp_path / "run"
    logged = forecast.ForecastingSink.log_step

    def log_step(self: forecast.ForecastingSink, step: int, metrics: dict) -> object:
        row = logged(self, step, metrics)
        if step == 2:
            (run_dir / forecast.STOP_REQUEST_FILE).write_text('{"reason": "below_leader"}')
        return row

    monkeypatch.setattr(forecast.ForecastingSink, "log_step", log_step)
    config = _config(tiny_model, run_dir, tmp_path, 9, eval_every=4)
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 0
    rows = _rows(run_dir)
    assert max(r["step"] for r in rows if r["kind"] == "step") == 2
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 2]  # at start, then the stop's
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
    stops = [json.loads(line) for line in (run_dir / "sessions.jsonl").read_text().splitlines()]
    assert stops[-1]["stop_reason"] == "pruned"
