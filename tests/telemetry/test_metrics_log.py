from __future__ import annotations

import json
import math

import pytest

from scalerl.telemetry.metrics_log import MetricsLog, read_rows


def test_rows_are_flushed_and_tagged(tmp_path):
    log = MetricsLog(tmp_path)
    log.log_step(1, {"loss": 0.5, "n": 3, "flag": True})
    log.log_eval(1, {"val_pass_rate": 0.25, "compute_device_hours": 0.1})
    # Readable while the log is still open: every row is flushed as it is written.
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert rows == [
        {"kind": "step", "step": 1, "loss": 0.5, "n": 3, "flag": True},
        {"kind": "eval", "step": 1, "val_pass_rate": 0.25, "compute_device_hours": 0.1},
    ]
    assert [r["step"] for r in log.rows("eval")] == [1]
    log.close()


def test_non_finite_values_become_null_and_tensors_numbers(tmp_path):
    import torch

    with MetricsLog(tmp_path) as log:
        log.log_step(0, {"loss": math.nan, "x": torch.tensor(2.5), "inf": math.inf})
    line = (tmp_path / "metrics.jsonl").read_text()
    assert json.loads(line) == {"kind": "step", "step": 0, "loss": None, "x": 2.5, "inf": None}
    with MetricsLog(tmp_path) as log, pytest.raises(TypeError, match="not JSON"):
        log.log_step(0, {"bad": object()})
    with MetricsLog(tmp_path) as log, pytest.raises(ValueError, match="kind"):
        log.write("other", 0, {})  # type: ignore[arg-type]


def test_resume_truncates_after_checkpoint_step(tmp_path):
    with MetricsLog(tmp_path) as log:
        for step in range(1, 7):
            log.log_step(step, {"loss": float(step)})
            if step % 2 == 0:
                log.log_eval(step, {"val_pass_rate": step / 10})
    # A crash tore the last line.
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "step", "step": 7, "lo')
    with MetricsLog(tmp_path, resume_step=4) as log:
        assert [(r["kind"], r["step"]) for r in log.rows()] == [
            ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4), ("eval", 4)
        ]
        log.log_step(5, {"loss": 50.0})
    steps = [r["step"] for r in read_rows(tmp_path / "metrics.jsonl", "step")]
    assert steps == [1, 2, 3, 4, 5]  # no gap, no duplicate
    assert not list(tmp_path.glob(".metrics.jsonl*"))  # the atomic rewrite left no temp file


def test_fresh_log_replaces_old_file(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.log_step(1, {})
    with MetricsLog(tmp_path) as log:
        assert log.rows() == []
