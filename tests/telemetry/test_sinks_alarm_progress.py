from __future__ import annotations

import builtins
import io
import sys
import types
import warnings

import pytest

from scalerl.config import LoggingConfig
from scalerl.telemetry.alarms import TruncationAlarm, TruncationWarning
from scalerl.telemetry.compute import ComputeMeter
from scalerl.telemetry.progress import Progress
from scalerl.telemetry.run import RunTelemetry
from scalerl.telemetry.sinks import MissingDependencyError, TensorBoardSink, WandbSink, scalars


def _block_import(monkeypatch, name: str) -> None:
    real = builtins.__import__

    def fake(mod, *args, **kwargs):
        if mod == name or mod.startswith(name + "."):
            raise ImportError(f"No module named {name!r}")
        return real(mod, *args, **kwargs)

    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(builtins, "__import__", fake)


def test_missing_optional_packages_give_clear_errors(monkeypatch, tmp_path):
    _block_import(monkeypatch, "tensorboard")
    _block_import(monkeypatch, "wandb")
    with pytest.raises(MissingDependencyError, match=r"tensorboard=true needs .*pip install tensorboard"):
        TensorBoardSink(tmp_path)
    with pytest.raises(MissingDependencyError, match=r"pip install wandb"):
        RunTelemetry(tmp_path, LoggingConfig(wandb=True, progress=False), max_steps=3)
    assert not (tmp_path / "metrics.jsonl").exists()  # failed before touching the run directory


class FakeRun:
    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.id = kwargs.get("id") or "run-abc"
        self.logged: list[tuple[dict, int]] = []
        self.finished = False

    def log(self, data, step):
        self.logged.append((data, step))

    def finish(self):
        self.finished = True


def test_wandb_sink_namespaces_keys_and_resumes_run_id(monkeypatch, tmp_path):
    runs: list[FakeRun] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sink = WandbSink(tmp_path, "proj", "name", {"lr": 1})
    sink.log("eval", 3, {"kind": "eval", "step": 3, "val_pass_rate": 0.5, "note": "x", "ok": True})
    sink.close()
    assert runs[0].logged == [({"eval/val_pass_rate": 0.5}, 3)] and runs[0].finished
    WandbSink(tmp_path, "proj", "name", resume=True)
    assert runs[1].kwargs["id"] == "run-abc" and runs[1].kwargs["resume"] == "allow"


class FakeTable:
    def __init__(self, columns, data) -> None:
        self.columns, self.data = columns, data


def test_wandb_sink_logs_samples_as_a_table_at_their_step(monkeypatch, tmp_path):
    runs: list[FakeRun] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    fake.Table = FakeTable
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sink = WandbSink(tmp_path, "proj", "name")
    chat = [{"role": "user", "content": "2+2?"}]
    rows = [{"prompt_id": "p1", "task": "math", "sample": 1, "reward": 1.0, "correct": True, "lag": 2,
             "reward_fn": {"exact": 1.0},
             "tokens": 7, "finish_reason": "stop", "prompt": chat, "response": "4 | four\n", "extra": 0},
            {"prompt_id": "p2", "sample": 0, "reward": 0.0, "prompt": "Compute 1+1", "response": ""}]
    sink.log_samples(6, rows)
    [(data, step)] = runs[0].logged
    assert step == 6 and list(data) == ["samples"]
    table = data["samples"]
    assert table.columns == ["prompt_id", "task", "sample", "reward", "reward_fn", "correct", "lag", "tokens",
                             "finish_reason", "prompt", "response"]
    assert table.data == [
        ["p1", "math", 1, 1.0, '{"exact": 1.0}', True, 2, 7, "stop", '[{"role": "user", "content": "2+2?"}]',
         "4 | four\n"],
        ["p2", None, 0, 0.0, None, None, None, None, None, "Compute 1+1", ""],
    ]


def test_scalars_keep_finite_numbers_only():
    assert scalars({"a": 1, "b": float("nan"), "c": "s", "d": True, "e": 2.5}) == {"a": 1.0, "e": 2.5}


def test_truncation_alarm_warns_once_per_excursion():
    alarm = TruncationAlarm()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert alarm.check(1, 0.05) is None
        assert "12.0%" in alarm.check(2, 0.12)
        assert alarm.check(3, 0.30) is None  # still above: no repeat
        assert alarm.check(4, 0.08) is None  # re-armed
        assert alarm.check(5, 0.11) is not None
    assert [w.category for w in caught] == [TruncationWarning, TruncationWarning]
    assert alarm.fired == 2


def test_progress_bar_shows_metrics_and_resumes_position():
    out = io.StringIO()
    bar = Progress(10, initial_step=4, file=out)
    bar.update(5, {"loss": 0.123456, "other": 1})
    bar.close()
    text = out.getvalue()
    assert "5/10" in text and "loss=0.1235" in text
    silent = Progress(10, enabled=False)
    silent.update(3, {"loss": 1.0})
    assert silent.n == 0


def test_run_telemetry_stamps_compute_and_checks_alarm(tmp_path):
    meter = ComputeMeter(100)
    meter.add_generation(10, 2)
    with RunTelemetry(tmp_path, LoggingConfig(progress=False), max_steps=5, meter=meter) as tel:
        with pytest.warns(TruncationWarning):
            row = tel.log_step(1, {"loss": 1.0, "truncation_rate": 0.5})
        assert row["flops"] == 2 * 100 * 10
        ev = tel.log_eval(1, {"val_pass_rate": 0.3, "epoch": 0, "flops": -1.0})
        assert ev["flops"] == 2 * 100 * 10
        assert {"compute_device_hours", "flops", "samples", "tokens", "val_pass_rate", "epoch"} <= set(ev)
        with pytest.raises(ValueError, match="val_pass_rate"):
            tel.log_eval(2, {"loss": 0.0})
