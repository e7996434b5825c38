"""Checkpoint state at a step boundary and resume: no prompt trained twice, none skipped."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from scalerl.assembly.sections import driver_settings
from scalerl.pipeline import Driver

from .fakes import FakeEngine, FakeSource, FakeTrainer
from .test_modes import build, make_config


@pytest.mark.parametrize(
    "mode,schedule", [("pipeline", "threaded"), ("pipeline", "interleaved"), ("ppo_offpolicy", "threaded")]
)
def test_resume_reissues_outstanding_prompts(mode: str, schedule: str) -> None:
    cfg = make_config(mode, 2, 3, steps=8, schedule=schedule, dynamic_sampling=True)
    cfg.checkpoint.every = 4
    saved: dict[int, dict[str, Any]] = {}

    def checkpoint(step: int, state: dict[str, Any]) -> None:
        saved[step] = copy.deepcopy(json.loads(json.dumps(state)))  # must be JSON

    engine1 = FakeEngine(max_batch_size=8, step_sleep=(0.0, 0.001), long_tail=0.2)
    trainer1 = FakeTrainer(engine1, step_time=(0.0, 0.004))
    source1 = FakeSource()
    comps, _ = build(cfg, engine=engine1, trainer=trainer1, source=source1)
    comps.checkpoint = checkpoint
    Driver(driver_settings(cfg), comps).run()
    assert sorted(saved) == [4, 8]

    # "Crash" after step 4: everything run 1 trained after the checkpoint is lost with it.
    state = saved[4]
    assert state["step"] == 4
    trained1 = [g.record.id for _, gs in trainer1.batches[:4] for g in gs]
    outstanding = [o["record"]["id"] for o in state["generator"]["outstanding"]]
    if mode == "ppo_offpolicy":
        assert outstanding == []  # a round boundary (k=2: steps 4 ends round 2)
    else:
        assert outstanding, "the pipeline had groups in flight at the checkpoint"
    reported_before = {o["record"]["id"] for o in state["generator"]["outstanding"] if o["reported"]}

    engine2 = FakeEngine(max_batch_size=8, step_sleep=(0.0, 0.001), long_tail=0.2, seed=1, version=4)
    trainer2 = FakeTrainer(engine2)
    trainer2.load_version(trainer1.batches[3][0] + 1)
    source2 = FakeSource()
    comps2, rows2 = build(cfg, engine=engine2, trainer=trainer2, source=source2)
    driver2 = Driver(driver_settings(cfg), comps2, resume_state=state)
    result = driver2.run()
    assert result.steps == 8 and len(trainer2.batches) == 4
    assert [s for s, _ in rows2.steps] == [5, 6, 7, 8]

    trained2 = [g.record.id for _, gs in trainer2.batches for g in gs]
    assert not set(trained1) & set(trained2), "a prompt was trained before and after the resume"
    end_outstanding = {o["record"]["id"] for o in driver2.generator.state_dict()["outstanding"]}
    dropped1 = {pid for pid in source1.reports if pid not in trained1 and pid not in outstanding}
    dropped1 &= {f"p{i}" for i in range(state["generator"]["source"]["position"])}
    # Re-issued groups scored before the checkpoint are not reported again (see below), so a drop
    # in run 2 shows as: reported (in either run) and neither trained nor outstanding.
    dropped2 = (set(source2.reports) | reported_before) - set(trained2) - end_outstanding
    run2_drops = driver2.generator.counters.groups_dropped - state["generator"]["counters"]["groups_dropped"]
    assert run2_drops == len(dropped2)
    # The re-issued prompts come first and all end up trained, dropped or still outstanding.
    assert set(outstanding) <= set(trained2) | end_outstanding | dropped2
    everything = set(trained1) | set(trained2) | end_outstanding | dropped1 | dropped2
    assert everything == {f"p{i}" for i in range(source2.position)}
    # A group scored before the checkpoint is not reported to the curriculum a second time.
    assert not reported_before & set(source2.reports)
    assert driver2.generator.counters.prompts_reissued == len(outstanding)


def test_resuming_a_finished_run_keeps_its_checkpoint_and_its_lag() -> None:
    """A finished run resumed trains nothing, does not rewrite its final checkpoint, and reports the
    largest version lag of the whole run (not 0 for the empty session)."""
    cfg = make_config("pipeline", 3, 2, steps=6, schedule="interleaved")
    saved: dict[int, dict[str, Any]] = {}

    def checkpoint(step: int, state: dict[str, Any]) -> None:
        saved[step] = json.loads(json.dumps(state))

    engine = FakeEngine(max_batch_size=8)
    trainer = FakeTrainer(engine)
    comps, _ = build(cfg, engine=engine, trainer=trainer)
    comps.checkpoint = checkpoint
    first = Driver(driver_settings(cfg), comps).run()
    assert sorted(saved) == [6] and first.max_version_lag > 0
    final = saved.pop(6)
    assert final["max_version_lag"] == first.max_version_lag

    engine2 = FakeEngine(max_batch_size=8, version=6)
    trainer2 = FakeTrainer(engine2)
    trainer2.load_version(6)
    comps2, rows2 = build(cfg, engine=engine2, trainer=trainer2)
    comps2.checkpoint = checkpoint
    again = Driver(driver_settings(cfg), comps2, start_step=6, resume_state=final).run()
    assert again.steps == 6 and not rows2.steps and not trainer2.batches
    assert saved == {}, "the final checkpoint was written again"
    assert again.max_version_lag == first.max_version_lag
