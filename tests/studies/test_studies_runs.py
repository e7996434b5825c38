"""The study runner: order, skip completed, resume or redo partial runs, contain failures, refuse a
study directory reused with other settings."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from study_helpers import FakeTrain

from scalerl.atomic import write_atomic
from scalerl.config import RunConfig, config_to_yaml
from scalerl.studies.runs import (
    STATUS_FILE,
    RunSpec,
    execute_runs,
    read_status,
    run_state,
    write_json_atomic,
)


def spec(tmp_path: Path, name: str, **changes: object) -> RunSpec:
    cfg = RunConfig(name=name, output_dir=str(tmp_path / "runs" / name), max_steps=20)
    for key, value in changes.items():
        setattr(cfg, key, value)
    return RunSpec(name=name, group=name.split("-seed")[0], config=cfg)


def quiet(_: str) -> None:
    pass


def test_a_library_caller_that_passes_no_sink_gets_log_records_not_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scalerl.studies.runs"):
        execute_runs([spec(tmp_path, "a")], train_fn=FakeTrain())
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    assert [r.getMessage() for r in caplog.records][-1].startswith("[1/1] a: completed in ")


def test_runs_in_order_then_skips_completed(tmp_path: Path) -> None:
    specs = [spec(tmp_path, n) for n in ("a", "b", "c")]
    train = FakeTrain()
    outcomes = execute_runs(specs, train_fn=train, say=quiet)
    assert train.names == ["a", "b", "c"]
    assert [(o.name, o.status, o.action) for o in outcomes] == [
        ("a", "completed", "trained"), ("b", "completed", "trained"), ("c", "completed", "trained")]
    assert all(run_state(s.run_dir) == "completed" for s in specs)
    again = FakeTrain()
    outcomes = execute_runs(specs, train_fn=again, say=quiet)
    assert again.calls == []
    assert [o.action for o in outcomes] == ["skipped"] * 3


def test_a_failure_is_reported_and_the_study_goes_on(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    specs = [spec(tmp_path, n) for n in ("a", "b", "c")]
    said: list[str] = []
    outcomes = execute_runs(specs, train_fn=FakeTrain(fail={"b"}), say=said.append)
    assert [o.status for o in outcomes] == ["completed", "failed", "completed"]
    assert outcomes[1].error == "RuntimeError: boom in b"
    tracebacks = [line for line in said if line.startswith("Traceback (most recent call last)")]
    assert len(tracebacks) == 1 and "RuntimeError: boom in b" in tracebacks[0]  # shown, through the sink
    assert capsys.readouterr().err == ""  # and only there
    status = read_status(specs[1].run_dir)
    assert status is not None and status["status"] == "failed" and "boom" in status["error"]
    # The rerun retries only the failed run; its partial log (no checkpoint) is cleared first.
    stale = specs[1].run_dir / "stale.txt"
    stale.write_text("from the failed attempt")
    retry = FakeTrain()
    outcomes = execute_runs(specs, train_fn=retry, say=quiet)
    assert retry.calls == [("b", None)]
    assert [o.action for o in outcomes] == ["skipped", "rerun", "skipped"]
    assert not stale.exists()


def test_a_non_zero_exit_counts_as_failure(tmp_path: Path) -> None:
    def returns_one(cfg: RunConfig, run_dir: Path, **_: object) -> int:
        return 1

    (outcome,) = execute_runs([spec(tmp_path, "a")], train_fn=returns_one, say=quiet)
    assert outcome.status == "failed" and outcome.error == "training exited with status 1"


def _checkpoint(run_dir: Path, step: int) -> Path:
    path = run_dir / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"step": step}))
    return path


def test_a_partial_run_with_a_checkpoint_is_resumed_from_it(tmp_path: Path) -> None:
    s = spec(tmp_path, "a")
    s.run_dir.mkdir(parents=True)
    (s.run_dir / "config.yaml").write_text(config_to_yaml(s.config))
    row = {"kind": "eval", "step": 0, "val_pass_rate": 0.1}
    (s.run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    _checkpoint(s.run_dir, 4)
    latest = _checkpoint(s.run_dir, 8)
    train = FakeTrain()
    (outcome,) = execute_runs([s], train_fn=train, say=quiet)
    assert train.calls == [("a", latest)]
    assert outcome.action == "resumed" and outcome.status == "completed"


def test_a_run_killed_after_its_last_checkpoint_is_recovered_without_training(tmp_path: Path) -> None:
    s = spec(tmp_path, "a")
    s.run_dir.mkdir(parents=True)
    (s.run_dir / "config.yaml").write_text(config_to_yaml(s.config))
    rows = [{"kind": "eval", "step": 0, "val_pass_rate": 0.1},
            {"kind": "eval", "step": 20, "val_pass_rate": 0.3}]
    (s.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _checkpoint(s.run_dir, 20)
    train = FakeTrain()
    (outcome,) = execute_runs([s], train_fn=train, say=quiet)
    assert train.calls == [] and outcome.status == "completed"
    assert read_status(s.run_dir)["status"] == "completed"  # type: ignore[index]


def test_a_study_dir_reused_with_other_settings_is_refused_before_training(tmp_path: Path) -> None:
    first = [spec(tmp_path, "a"), spec(tmp_path, "b")]
    execute_runs(first, train_fn=FakeTrain(), say=quiet)
    changed = [spec(tmp_path, "a"), spec(tmp_path, "b", max_steps=40)]
    train = FakeTrain()
    expected = r"runs/b: its config.yaml differs .* max_steps \(saved 20, planned 40\)"
    with pytest.raises(ValueError, match=expected):
        execute_runs(changed, train_fn=train, say=quiet)
    assert train.calls == []


def test_duplicate_run_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run name 'a' occurs twice"):
        execute_runs([spec(tmp_path, "a"), spec(tmp_path, "a")], train_fn=FakeTrain(), say=quiet)


def test_atomic_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    write_atomic(tmp_path / "out" / "report.md", "# hi\n")
    write_json_atomic(tmp_path / "out" / STATUS_FILE, {"status": "completed"})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.md", STATUS_FILE]
    assert (tmp_path / "out" / "report.md").read_text() == "# hi\n"
    with pytest.raises(ValueError):  # NaN is not JSON: nothing is written
        write_json_atomic(tmp_path / "out" / "bad.json", {"x": float("nan")})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.md", STATUS_FILE]
