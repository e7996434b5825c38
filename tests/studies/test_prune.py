"""The prune controller (studies/prune.py) on synthetic run folders: who is stopped, why, what the
request says, what the report counts as saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.assembly.forecast import STOP_REQUEST_FILE
from scalerl.scaling.io import read_rows
from scalerl.studies.prune import (
    BELOW_LEADER,
    SETTLED,
    PruneController,
    latest_forecast,
    prune_report,
    prune_text,
)

PER_STEP = 0.001  # compute per step of every synthetic run


def make_run(root: Path, name: str, forecasts: list[tuple[float, float, float, str]], *,
             steps_per_eval: int = 5, finished: bool = False, torn: bool = False) -> Path:
    """A run folder whose eval rows carry the given (A, lo, hi, status) forecasts in turn."""
    d = root / name
    d.mkdir()
    lines = []
    step = 0
    for a, lo, hi, status in forecasts:
        for _ in range(steps_per_eval):
            step += 1
            lines.append({"kind": "step", "step": step, "compute_device_hours": PER_STEP * step})
        lines.append({"kind": "eval", "step": step, "val_pass_rate": a,
                      "compute_device_hours": PER_STEP * step, "forecast_A": a, "forecast_A_lo": lo,
                      "forecast_A_hi": hi, "forecast_status": status})
    text = "".join(json.dumps(r) + "\n" for r in lines)
    if torn:  # another process is writing the next row
        text += '{"kind": "eval", "step": 99, "forecast_A": 0.1, "forecast_A_lo": 0.0, "forecast_A_h'
    (d / "metrics.jsonl").write_text(text)
    events = [{"event": "start"}] + ([{"event": "stop", "stop_reason": "max_steps"}] if finished else [])
    (d / "sessions.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return d


def test_below_the_leader_by_more_than_the_margin_or_settled_is_stopped_and_nothing_else(
    tmp_path: Path,
) -> None:
    runs = {
        "leader": make_run(tmp_path, "leader", [(0.70, 0.60, 0.80, "ok"), (0.70, 0.68, 0.73, "ok")]),
        "loser": make_run(tmp_path, "loser", [(0.50, 0.45, 0.55, "ok")]),
        "close": make_run(tmp_path, "close", [(0.64, 0.58, 0.67, "ok")]),  # 0.67 + 0.02 > 0.68: a chance
        "early": make_run(tmp_path, "early", [(0.30, 0.20, 1.00, "flagged:before_2x_C_mid")]),
        "collapsed": make_run(tmp_path, "collapsed", [(0.07, 0.05, 0.18, "flagged:A_at_bound,flat")]),
        "narrow_flagged": make_run(tmp_path, "narrow_flagged", [(0.70, 0.695, 0.705, "flagged:misfit")]),
        "settled": make_run(tmp_path, "settled", [(0.66, 0.645, 0.675, "ok")], torn=True),
        "done": make_run(tmp_path, "done", [(0.40, 0.35, 0.45, "ok")], finished=True),
        "new": tmp_path / "new",  # not started yet: no folder
    }
    c = PruneController(runs, margin=0.02, a_width=0.02)
    new = c.poll()
    assert {d.run: d.reason for d in new} == {"loser": BELOW_LEADER, "settled": SETTLED,
                                              "collapsed": BELOW_LEADER}
    request = json.loads((runs["loser"] / STOP_REQUEST_FILE).read_text())
    assert request["leader"] == "leader" and request["leader_lo"] == 0.68 and request["A_hi"] == 0.55
    for name in ("leader", "close", "early", "narrow_flagged", "done"):  # settled needs an ok fit
        assert not (runs[name] / STOP_REQUEST_FILE).exists(), name
    assert c.poll() == []  # each run is asked once
    # The torn last line is not read (it is being written); the complete rows are.
    rows = read_rows(runs["settled"] / "metrics.jsonl")
    assert latest_forecast("settled", rows, "compute_device_hours").A == 0.66  # type: ignore[union-attr]


def test_no_leader_without_an_unflagged_forecast(tmp_path: Path) -> None:
    runs = {"a": make_run(tmp_path, "a", [(0.9, 0.5, 1.0, "flagged:A_at_bound")]),
            "b": make_run(tmp_path, "b", [(0.2, 0.1, 0.3, "ok")])}
    assert PruneController(runs).poll() == []  # a flagged fit leads nobody; b is the only leader


def test_the_leader_keeps_its_last_unflagged_bound_when_its_newest_fit_is_flagged(
    tmp_path: Path,
) -> None:
    lead = [(0.30, 0.28, 1.0, "ok"), (0.31, 0.28, 1.0, "flagged:misfit")]
    runs = {"lead": make_run(tmp_path, "lead", lead),
            "collapsed": make_run(tmp_path, "collapsed", [(0.07, 0.18, 0.18, "flagged:A_at_bound,flat")])}
    new = PruneController(runs).poll()
    assert [(d.run, d.reason, d.leader, d.leader_lo) for d in new] == [
        ("collapsed", BELOW_LEADER, "lead", 0.28)]


def test_the_report_counts_the_compute_saved_against_running_to_max_steps(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a", [(0.7, 0.6, 0.8, "ok")] * 4)  # 20 steps of 40
    b = make_run(tmp_path, "b", [(0.5, 0.45, 0.55, "ok")] * 2)  # 10 steps of 40
    with (b / "sessions.jsonl").open("a") as fh:
        fh.write(json.dumps({"event": "stop", "stop_reason": "pruned"}) + "\n")
    c = PruneController({"a": a, "b": b})
    report = prune_report(c, {"a": 40, "b": 40})
    by = {r["run"]: r for r in report["runs"]}
    assert by["b"]["stopped_by"] == "pruned" and by["b"]["step"] == 10
    assert by["b"]["compute_full"] == pytest.approx(40 * PER_STEP)
    assert by["b"]["saved"] == pytest.approx(0.030)
    assert report["compute_saved"] == pytest.approx(0.020 + 0.030)
    assert report["saved_fraction"] == pytest.approx(0.05 / 0.08) and report["n_pruned"] == 1
    assert "compute saved: 0.05 of 0.08 (62.5%)" in prune_text(report)


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="margin"):
        PruneController({}, margin=-1)
    with pytest.raises(ValueError, match="a_width"):
        PruneController({}, a_width=0)


def test_a_run_in_this_process_is_decided_at_the_evaluation_it_just_logged(tmp_path: Path) -> None:
    """The controller's polling thread never gets a turn here (interval 1 h): the run's own
    stop-after-evaluation hook lets it decide on the rows just logged, and the run stops there.
    After `stop()` the controller no longer observes."""
    from scalerl.assembly.forecast import PRUNED, StopAfterEval
    from scalerl.config import ForecastConfig

    runs = {
        "leader": make_run(tmp_path, "leader", [(0.70, 0.68, 0.73, "ok")]),
        "loser": make_run(tmp_path, "loser", [(0.50, 0.45, 0.55, "ok")]),
        "other": make_run(tmp_path, "other", [(0.69, 0.66, 0.72, "ok")]),
    }
    (tmp_path / "elsewhere").mkdir()
    outsider = make_run(tmp_path / "elsewhere", "loser", [(0.10, 0.05, 0.15, "ok")])
    c = PruneController({"leader": runs["leader"], "loser": runs["loser"]}, margin=0.02, a_width=0.01,
                        interval_s=3600).start()
    try:
        assert StopAfterEval(ForecastConfig(), runs["leader"], None)(4) is None
        assert StopAfterEval(ForecastConfig(), outsider, None)(4) is None  # not this study's run
        assert StopAfterEval(ForecastConfig(), runs["loser"], None)(4) == PRUNED
    finally:
        c.stop()
    assert set(c.pruned) == {"loser"}
    late = PruneController({"other": runs["other"], "leader": runs["leader"]}, margin=0.2, a_width=0.4)
    assert StopAfterEval(ForecastConfig(), runs["other"], None)(4) is None  # never started: not observing
    assert late.pruned == {}
