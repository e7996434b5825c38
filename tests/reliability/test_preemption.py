"""SIGTERM / SIGINT during `scalerl train`: a checkpoint at the next safe point, the reason recorded,
a non-zero exit, and a resume that loses and repeats nothing. `max_time_s` inside a long round."""

from __future__ import annotations

import copy
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pipeline.fakes import FakeEngine, FakeSource, FakeTrainer
from pipeline.test_modes import build, make_config

from scalerl.assembly.sections import driver_settings
from scalerl.pipeline import Driver
from scalerl.pipeline.preemption import StopRequest, exit_status

from .helpers import (
    deterministic,
    eval_steps,
    final_weights,
    finish,
    launch,
    run_config,
    sessions,
    step_rows,
    wait_for_step,
    write_config,
)

MAX_STEPS = 24


def _state(run_dir: Path, step: int) -> dict[str, Any]:
    return json.loads((run_dir / "checkpoints" / f"step_{step:06d}" / "state.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "mode", "schedule"), [
    (signal.SIGTERM, "pipeline", "interleaved"),
    # Ctrl-C in the other reproducible schedule: with the long suite (`make test-kill-cycles`).
    pytest.param(signal.SIGINT, "ppo_offpolicy", "threaded", marks=pytest.mark.kill_cycles),
])
def test_a_signal_checkpoints_exits_nonzero_and_resumes_exactly(
    tmp_path: Path, tiny_model: str, sig: signal.Signals, mode: str, schedule: str
) -> None:
    ref_dir = tmp_path / "ref"
    ref_config = write_config(run_config(tiny_model, ref_dir, mode, schedule), tmp_path / "r.yaml")
    code, err = finish(launch(ref_config))
    assert code == 0, err[-3000:]

    run_dir = tmp_path / "run"
    config = write_config(run_config(tiny_model, run_dir, mode, schedule), tmp_path / "run.yaml")
    proc = launch(config)
    wait_for_step(proc, run_dir, 10)  # step 10: between the checkpoints of steps 9 and 12
    sent = time.monotonic()
    proc.send_signal(sig)
    code, err = finish(proc)
    latency = time.monotonic() - sent
    assert code == exit_status(sig.name) == 128 + int(sig), err[-3000:]
    assert f"{sig.name} received" in err and "--resume" in err
    stopped = step_rows(run_dir)[-1]["step"]
    assert 10 <= stopped < MAX_STEPS
    # Checkpointed where it stopped (not at the last scheduled checkpoint), and says why.
    assert _state(run_dir, stopped)["extra"]["pipeline"]["stopped_by"] == sig.name
    stop = [s for s in sessions(run_dir) if s["event"] == "stop"][-1]
    assert stop["stop_reason"] == "signal" and stop["signal"] == sig.name and stop["exit_status"] == code
    assert latency < 60, f"{latency:.1f} s from the signal to the exit"
    print(f"{sig.name}: exit {code} {latency:.2f} s after the signal, checkpoint at step {stopped}")

    code, err = finish(launch(config, "--resume"))
    assert code == 0, err[-3000:]
    rows, ref_rows = step_rows(run_dir), step_rows(ref_dir)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1))
    assert eval_steps(run_dir) == eval_steps(ref_dir) == list(range(0, MAX_STEPS + 1, 4))
    assert [deterministic(r) for r in rows] == [deterministic(r) for r in ref_rows]
    w, ref = final_weights(run_dir, MAX_STEPS), final_weights(ref_dir, MAX_STEPS)
    assert all(torch.equal(w[k], ref[k]) for k in w)


class _StopAfter(FakeEngine):
    """Asks a stop (as a signal handler would) after `after` engine steps."""

    def __init__(self, stop: StopRequest, after: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.stop_request, self.after = stop, after

    def step(self):  # type: ignore[override]
        if self.steps >= self.after:
            self.stop_request.request("SIGTERM")
        return super().step()


@pytest.mark.parametrize(("mode", "schedule"), [("ppo_offpolicy", "threaded"), ("pipeline", "interleaved"),
                                                ("pipeline", "threaded"), ("sync", "threaded")])
def test_a_stop_inside_a_long_round_checkpoints_without_finishing_it(mode: str, schedule: str) -> None:
    """k=8 rounds of 8 x 3 groups: a stop asked during the first round's generation is honoured
    at the next engine step; no step is taken, the state (with the round's groups) is saved."""
    cfg = make_config(mode, 8, 3, steps=16, schedule=schedule)
    cfg.checkpoint.every = 0
    stop = StopRequest()
    engine = _StopAfter(stop, after=5, max_batch_size=8)
    trainer = FakeTrainer(engine)
    comps, _ = build(cfg, engine=engine, trainer=trainer)
    saved: dict[int, dict[str, Any]] = {}
    comps.checkpoint = lambda step, state, snapshot=None: saved.setdefault(step, copy.deepcopy(state))
    result = Driver(driver_settings(cfg), comps, stop=stop).run()
    assert result.stop_reason == "signal" and result.signal == "SIGTERM"
    if mode == "pipeline" and schedule == "threaded":
        # The generator thread does not wait for the driver: a batch it queued while the driver
        # was polling may be trained first; the stop then comes at that step's end.
        assert result.steps <= 1 and set(saved) <= {1}
    else:
        assert result.steps == 0 and trainer.batches == [] and saved == {}  # nothing to save at step 0
        assert engine.steps == 6  # the fill stopped at the engine step after the request


def test_a_stop_after_some_steps_saves_the_round_in_flight_and_the_resume_finishes_it() -> None:
    cfg = make_config("ppo_offpolicy", 4, 2, steps=12)
    stop = StopRequest()
    engine = _StopAfter(stop, after=10**9, max_batch_size=8)
    trainer = FakeTrainer(engine)
    source = FakeSource()
    comps, _ = build(cfg, engine=engine, trainer=trainer, source=source)
    saved: dict[int, dict[str, Any]] = {}

    def checkpoint(step: int, state: dict[str, Any], snapshot: Any = None) -> None:
        saved[step] = json.loads(json.dumps(state))

    comps.checkpoint = checkpoint
    driver = Driver(driver_settings(cfg), comps, stop=stop)
    real_next = driver.batches.next_batch

    def next_batch():
        if driver.step == 4:  # round 1 (steps 1-4) done: stop during round 2's generation
            engine.after = engine.steps + 3
        return real_next()

    driver.batches.next_batch = next_batch  # type: ignore[method-assign]
    result = driver.run()
    assert result.stop_reason == "signal" and result.steps == 4
    state = saved[4]
    assert state["stopped_by"] == "SIGTERM"
    trained1 = [g.record.id for _, gs in trainer.batches for g in gs]
    outstanding = [o["record"]["id"] for o in state["generator"]["outstanding"]]
    assert len(outstanding) == 4 * 2  # round 2, admitted and generating when the stop came

    engine2 = FakeEngine(max_batch_size=8, version=trainer.version)
    trainer2 = FakeTrainer(engine2)
    trainer2.load_version(trainer.version)
    comps2, rows2 = build(cfg, engine=engine2, trainer=trainer2, source=FakeSource())
    result2 = Driver(driver_settings(cfg), comps2, start_step=4, resume_state=state).run()
    assert result2.steps == 12 and [s for s, _ in rows2.steps] == list(range(5, 13))
    trained2 = [g.record.id for _, gs in trainer2.batches for g in gs]
    assert not set(trained1) & set(trained2)
    assert set(outstanding) <= set(trained2)  # re-issued first: none lost


def test_max_time_is_honoured_inside_a_long_round() -> None:
    """A ppo_offpolicy round of 8 x 4 groups outlasts the limit: the run stops in the round's
    generation (a fake clock that engine steps advance), not after the k updates that follow it."""
    cfg = make_config("ppo_offpolicy", 8, 4, steps=40)
    cfg.max_time_s = 1.0
    now = [0.0]

    class Slow(FakeEngine):
        def step(self):  # type: ignore[override]
            now[0] += 0.01  # 100 engine steps = the limit
            return super().step()

    engine = Slow(max_batch_size=4)
    trainer = FakeTrainer(engine)
    comps, _ = build(cfg, engine=engine, trainer=trainer)
    saved: list[int] = []
    comps.checkpoint = lambda step, state, snapshot=None: saved.append(step)
    result = Driver(driver_settings(cfg), comps, clock=lambda: now[0]).run()
    assert result.stop_reason == "max_time_s"
    assert result.steps == 0 and trainer.batches == []
    assert now[0] < 1.0 + 0.02  # one engine step past the limit at most
