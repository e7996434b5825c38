"""The live forecast (scaling.live) on synthetic run folders: what each eval row logs, that
`scalerl fit` reproduces it digit for digit, and the stop rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scalerl.assembly.forecast import (
    FORECAST_KNOWN,
    PRUNED,
    STOP_REQUEST_FILE,
    ForecastingSink,
    StopAfterEval,
)
from scalerl.cli import main
from scalerl.config import ForecastConfig
from scalerl.scaling.forms import sigmoid_reward
from scalerl.scaling.io import curve_from_rows, read_run_dir
from scalerl.scaling.live import FORECAST_FILE, LiveForecast, forecast_rows
from scalerl.telemetry.metrics_log import MetricsLog


def eval_rows(n: int, *, A: float = 0.7, B: float = 1.6, C_mid: float = 0.01, R0: float = 0.2,
              c_max: float = 0.06, noise: float = 0.004, seed: int = 0) -> list[dict[str, float]]:
    """`n + 1` eval rows (the first at compute 0, as a run's at-start evaluation) on a known sigmoid."""
    rng = np.random.default_rng(seed)
    c = np.linspace(0.0, c_max, n + 1)
    y = np.concatenate([[R0], sigmoid_reward(c[1:], A, B, C_mid, R0)]) + rng.normal(0, noise, n + 1)
    return [{"step": 10 * i, "compute_device_hours": float(c[i]), "val_pass_rate": float(y[i])}
            for i in range(n + 1)]


def write_run(run_dir: Path, evals: list[dict[str, float]], cfg: ForecastConfig) -> list[dict]:
    """Log step and eval rows through the live forecast as a run does; the rows as written."""
    log = MetricsLog(run_dir)
    live = LiveForecast(cfg, run_dir, run_dir.name)
    sink = ForecastingSink(log, live)
    for r in evals:
        if r["step"] > 0:
            sink.log_step(int(r["step"]), {"loss": 0.1, "truncation_rate": 0.0})
        sink.log_eval(int(r["step"]), r)
    live.close()
    log.close()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_curve_from_rows_reads_what_read_run_dir_reads(tmp_path: Path) -> None:
    rows = write_run(tmp_path / "r", eval_rows(6), ForecastConfig())
    mem, disk = curve_from_rows(rows, label="r"), read_run_dir(tmp_path / "r")
    assert np.array_equal(mem.x, disk.x) and np.array_equal(mem.y, disk.y)
    assert np.array_equal(mem.truncation.rates, disk.truncation.rates)  # type: ignore[union-attr]


def test_no_forecast_before_min_evals_and_a_settled_one_on_a_long_clean_curve() -> None:
    cfg = ForecastConfig(min_evals=5)
    rows = eval_rows(30)
    assert forecast_rows(rows[:5], cfg) is None  # 4 evaluations with compute > 0
    early = forecast_rows(rows[:6], cfg)
    assert early is not None and early.evals == 5 and early.step == 50
    full = forecast_rows(rows, cfg)
    assert full is not None and full.status == "ok", full
    assert full.A_lo is not None and full.A_hi is not None and full.A_lo <= 0.7 <= full.A_hi
    assert full.width is not None and full.width < 0.05 and full.known(0.05) and not full.known(full.width)
    assert full.compute_to_pin == 0.0  # +-0.02 is pinned already
    # Few points, data before 2x C_mid: flagged with the reasons, never "known" however narrow.
    short = forecast_rows(eval_rows(4, c_max=0.012), ForecastConfig())
    assert short is not None and short.status.startswith("flagged:") and "before_2x_C_mid" in short.status
    assert not short.known(1.0)


def test_eval_rows_carry_the_forecast_of_the_rows_before_them_and_fit_reproduces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "live"
    rows = write_run(run_dir, eval_rows(8), ForecastConfig())
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [("forecast_A" in r) for r in evals] == [False] * 5 + [True] * 4  # first fit after 4 points
    for r in evals[5:]:
        assert r["forecast_step"] == evals[evals.index(r) - 1]["step"]
        assert r["forecast_A_lo"] <= r["forecast_A"] <= r["forecast_A_hi"]
        assert r["forecast_fit_s"] > 0 and r["forecast_wait_s"] >= 0 and r["forecast_evals"] >= 4
        # `scalerl fit` on the folder, cut where that forecast's data ended: the same digits.
        assert main(["fit", str(run_dir), "--json", "--errors", "local_level", "--max-step",
                     str(r["forecast_step"])]) == 0
        fit = json.loads(capsys.readouterr().out)["runs"][0]
        assert fit["A"] == r["forecast_A"]
        assert fit["intervals"]["A"] == [r["forecast_A_lo"], r["forecast_A_hi"]]
        assert fit["B"] == r["forecast_B"] and fit["C_mid"] == r["forecast_C_mid"]
    # forecast.json holds the fit of the whole curve: plain `scalerl fit RUN_DIR`.
    final = json.loads((run_dir / FORECAST_FILE).read_text())
    assert main(["fit", str(run_dir), "--json", "--errors", "local_level"]) == 0
    fit = json.loads(capsys.readouterr().out)["runs"][0]
    assert final["A"] == fit["A"] and [final["A_lo"], final["A_hi"]] == fit["intervals"]["A"]
    assert final["step"] == evals[-1]["step"]


def test_the_stop_hook_stops_on_a_request_or_a_pinned_unflagged_forecast(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    live = LiveForecast(ForecastConfig(), run_dir, "r")
    *before, last = eval_rows(30)
    live.rows.extend(before)
    live.after_eval(last)
    live.join()
    assert live.latest is not None and live.latest.status == "ok"
    width = live.latest.width
    assert width is not None
    assert StopAfterEval(ForecastConfig(stop_when_known=width * 1.01), run_dir, live)(300) == FORECAST_KNOWN
    assert StopAfterEval(ForecastConfig(stop_when_known=width * 0.99), run_dir, live)(300) is None
    assert StopAfterEval(ForecastConfig(), run_dir, live)(300) is None  # no stop rule set
    (run_dir / STOP_REQUEST_FILE).write_text('{"reason": "below the leader"}')
    assert StopAfterEval(ForecastConfig(), run_dir, None)(300) == PRUNED


def test_a_resumed_run_logs_the_forecast_the_uninterrupted_one_did(tmp_path: Path) -> None:
    """Resumed between two evaluations, the run refits the rows up to its last eval row (not the
    step rows after it): its next eval row carries the same forecast."""
    rows = write_run(tmp_path / "whole", eval_rows(7), ForecastConfig())
    cut = next(i for i, r in enumerate(rows) if r["kind"] == "eval" and r["step"] == 60)
    kept = [dict(r) for r in rows[: cut + 2]]  # eval row of step 60, then step 70's row (checkpointed)
    kept[-1]["truncation_rate"] = 0.9  # a step after the eval: not in the uninterrupted fit
    live = LiveForecast(ForecastConfig(), tmp_path / "whole", "whole", rows=kept)
    fields = live.before_eval()
    nxt = next(r for r in rows if r["kind"] == "eval" and r["step"] == 70)
    timed = ("forecast_fit_s", "forecast_fit_cpu_s", "forecast_wait_s")
    assert {k: v for k, v in fields.items() if k not in timed} == {
        k: v for k, v in nxt.items() if k.startswith("forecast_") and k not in timed}
