"""`scalerl train` end to end on a tiny model: what a first run records and prints, and `--resume`
of a run that already finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scalerl.cli import main
from scalerl.model_identity import model_identity
from scalerl.scaling.io import read_run_dir
from tests.tiny_runs import warm_tiny_model

from .test_kill_resume import tiny_run_config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_tiny_model(tmp_path_factory)


def test_first_run_then_resume_of_the_finished_run(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "grpo-baseline"
    cfg = tiny_run_config(str(tiny_model), run_dir)
    cfg.max_steps = 3
    data = cfg.model_dump(mode="json")
    del data["name"]  # the user names nothing: the run is named after its folder
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 0
    err = capsys.readouterr().err
    assert "eval at step 0: val_pass_rate" in err and "eval at step 3" in err
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["name"] == "grpo-baseline"
    assert read_run_dir(run_dir).label == "grpo-baseline"
    identity = json.loads((run_dir / "start_model.json").read_text())
    assert identity["sha256"] and identity == model_identity(str(tiny_model))
    assert identity["warm_start_key"] == json.loads((tiny_model / "sft_info.json").read_text())["key"]

    final = run_dir / "checkpoints" / "step_000003" / "state.json"
    before = (final.stat().st_mtime_ns, (run_dir / "metrics.jsonl").read_text())
    assert main(["train", "-c", str(config), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "already finished at step 3" in err
    assert (final.stat().st_mtime_ns, (run_dir / "metrics.jsonl").read_text()) == before


def test_a_failure_before_the_first_row_leaves_no_run_directory(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import scalerl.assembly.build as assemble
    from scalerl.assembly.run import train_run
    from scalerl.config import ConfigError

    def broken(*args: object, **kwargs: object) -> None:
        raise ConfigError("rewards.verifiers.x: cannot import")  # bad input found while building

    monkeypatch.setattr(assemble, "train", broken)
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match="cannot import"):
        train_run(tiny_run_config(str(tiny_model), run_dir), run_dir)
    assert not run_dir.exists()


def test_an_internal_error_exits_1_with_its_traceback_logged_and_its_stop_recorded(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ValueError deep inside a run (a bug, a library's failure) is ours, not bad input: exit 1, the
    traceback on stderr and in RUN_DIR/error.log, the stop and its cause in sessions.jsonl."""
    import scalerl.training.trainer as trainer_mod

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("operands could not be broadcast together")  # what numpy says on a shape bug

    monkeypatch.setattr(trainer_mod.Trainer, "step", broken)
    run_dir = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config(str(tiny_model), run_dir).model_dump(mode="json")))
    assert main(["train", "-c", str(config), "eval.at_start=false"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert "scalerl train: internal error (ValueError, not a problem with your input)" in err
    assert "scalerl train: error:" not in err
    log = (run_dir / "error.log").read_text()
    assert log.startswith("Traceback") and "ValueError: operands could not be broadcast together" in log
    stop = [json.loads(line) for line in (run_dir / "sessions.jsonl").read_text().splitlines()][-1]
    assert stop["event"] == "stop" and stop["stop_reason"] == "internal_error" and stop["exit_status"] == 1
    assert stop["error"] == "ValueError: operands could not be broadcast together"
    assert stop["error_log"] == "error.log"
