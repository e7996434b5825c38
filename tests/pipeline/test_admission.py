"""`pipeline.admission`: the deadline rule wired through the real driver (both schedules).

The rule's own arithmetic is tested in `test_staleness.py`; here the key must change what the
driver does (more groups admitted behind a slow one, fewer generator ticks for the same steps, the
oldest groups trained first) while every sample stays within k versions of its start.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from scalerl.assembly.sections import driver_settings
from scalerl.config import PipelineConfig
from scalerl.pipeline import Driver
from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.pipeline.local import LocalGroupQueue
from scalerl.pipeline.modes import InterleavedBatches, PipelineBatches

from .fakes import FakeEngine, FakeSource, FakeTrainer
from .test_modes import build, check_accounting, make_config


def run(admission: str, schedule: str, k: int, b: int, train_ticks: int = 0, steps: int = 30,
        cap: int = 0, **engine_kw: Any) -> tuple[Driver, Any, FakeTrainer]:
    cfg = make_config("pipeline", k, b, steps=steps, schedule=schedule, train_ticks=train_ticks)
    cfg.pipeline.admission = admission  # type: ignore[assignment]
    cfg.pipeline.max_outstanding_groups = cap
    engine = FakeEngine(**{"max_batch_size": 32, "long_tail": 0.2, "max_len": 80, **engine_kw})
    trainer = FakeTrainer(engine, step_time=(0.0, 0.002) if schedule == "threaded" else (0.0, 0.0))
    source = FakeSource()
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=source)
    driver = Driver(driver_settings(cfg), comps)
    result = driver.run()
    assert result.steps == steps and result.stop_reason == "max_steps"
    check_accounting(driver, source, trainer)
    # The bound, by the test's own arithmetic: train version minus each sample's start version.
    lags = [u - c.start_version for u, groups in trainer.batches for g in groups for c in g.completions]
    assert max(lags) <= k
    assert result.max_version_lag <= k
    return driver, rows, trainer


@pytest.mark.parametrize("train_ticks", [0, 5, 20])
def test_deadline_key_changes_the_interleaved_run(train_ticks: int) -> None:
    """Same seed, same engine: the deadline rule needs fewer generator ticks (engine steps plus idle
    ticks) for the same 30 steps and idles less."""
    bounded, bounded_rows, _ = run("bounded", "interleaved", 2, 2, train_ticks)
    deadline, rows, _ = run("deadline", "interleaved", 2, 2, train_ticks)
    # The cost shows in the step rows: some batches waited for a group at its deadline.
    assert sum(row["deadline_wait"] for _, row in rows.steps) > 0
    assert all(row["deadline_wait"] == 0 for _, row in bounded_rows.steps)
    assert isinstance(deadline.batches, InterleavedBatches) and deadline.batches.select is not None
    assert isinstance(bounded.batches, InterleavedBatches) and bounded.batches.select is None
    assert deadline.controller.admission == "deadline"
    assert deadline.batches.ticks < bounded.batches.ticks
    assert deadline.generator.counters.idle_ticks <= bounded.generator.counters.idle_ticks
    if train_ticks:
        assert deadline.generator.counters.idle_ticks < bounded.generator.counters.idle_ticks


@pytest.mark.parametrize("k,b", [(1, 2), (2, 3), (4, 2)])
def test_deadline_threaded_keeps_the_bound_under_random_speeds(k: int, b: int) -> None:
    driver, rows, trainer = run("deadline", "threaded", k, b, steps=25, step_sleep=(0.0, 0.002), seed=k)
    assert {row["deadline_wait"] for _, row in rows.steps} <= {0.0, 1.0}
    assert isinstance(driver.batches, PipelineBatches) and driver.batches.select is not None
    assert max(row["version_lag_max"] for _, row in rows.steps) <= k
    assert all(len(groups) == b for _, groups in trainer.batches)


def run_partial(schedule: str, k: int, b: int, train_ticks: int = 0, steps: int = 30,
                **engine_kw: Any) -> tuple[Driver, Any, list[tuple[int, int, list[list[int]]]]]:
    """`admission: partial` through the real driver; returns, per trained group, (train version,
    its last admission version, each sample's token versions) as `Generator.consume` saw them."""
    cfg = make_config("pipeline", k, b, steps=steps, schedule=schedule, train_ticks=train_ticks)
    cfg.pipeline.admission = "partial"
    engine = FakeEngine(**{"max_batch_size": 32, "long_tail": 0.2, "max_len": 80, **engine_kw})
    trainer = FakeTrainer(engine, step_time=(0.0, 0.002) if schedule == "threaded" else (0.0, 0.0))
    source = FakeSource()
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=source)
    driver = Driver(driver_settings(cfg), comps)
    seen: list[tuple[int, int, list[list[int]]]] = []
    consume = driver.generator.consume

    def spy(items: Any, train_version: int) -> list[int]:
        seen.extend((train_version, it.admit_version, [c.versions for c in it.group.completions])
                    for it in items)
        return consume(items, train_version)

    driver.generator.consume = spy  # type: ignore[method-assign]
    result = driver.run()
    assert result.steps == steps and result.stop_reason == "max_steps"
    check_accounting(driver, source, trainer)
    assert result.max_version_lag <= k
    return driver, rows, seen


def _check_partial_bound(seen: list[tuple[int, int, list[list[int]]]], k: int) -> None:
    """By the test's arithmetic: each group within k of its last admission, and its newest token
    (a re-admitted group was still generating, so tokens came after, at a version >= it) too."""
    for u, admitted, versions in seen:
        newest = max(v for vs in versions for v in vs)
        assert u - admitted <= k and admitted <= newest and u - newest <= k


@pytest.mark.parametrize("train_ticks", [0, 5, 20])
def test_partial_key_renews_blocking_groups_in_the_interleaved_run(train_ticks: int) -> None:
    """Same seed, same engine as the deadline run: with `partial` the trainer re-admits the groups
    it would wait for, so fewer batches wait and the same steps take fewer generator ticks; the
    step rows count the re-admissions, and some tokens are trained more than k versions old."""
    deadline, deadline_rows, _ = run("deadline", "interleaved", 2, 2, train_ticks)
    partial, rows, seen = run_partial("interleaved", 2, 2, train_ticks)
    _check_partial_bound(seen, 2)
    renewed = partial.generator.counters.groups_renewed
    assert renewed > 0 and partial.controller.renewed == renewed
    assert rows.steps[-1][1]["groups_renewed_total"] == renewed
    assert all(row["groups_renewed_total"] == 0 for _, row in deadline_rows.steps)
    waits = sum(row["deadline_wait"] for _, row in rows.steps)
    assert waits < sum(row["deadline_wait"] for _, row in deadline_rows.steps)
    assert partial.batches.ticks < deadline.batches.ticks
    assert max(row["token_lag_max"] for _, row in rows.steps) > 2


@pytest.mark.parametrize("k,b", [(1, 2), (2, 3), (4, 2)])
def test_partial_threaded_keeps_its_bound_under_random_speeds(k: int, b: int) -> None:
    driver, _rows, seen = run_partial("threaded", k, b, steps=25, step_sleep=(0.0, 0.002), seed=k)
    _check_partial_bound(seen, k)
    assert len(seen) == 25 * b
    assert isinstance(driver.batches, PipelineBatches) and driver.batches.select is not None


def test_max_outstanding_groups_caps_the_driver() -> None:
    """The cap reaches the real driver: no step row ever shows more outstanding groups than it,
    while the uncapped deadline run does hold more; the bound is kept either way."""
    _, free, _ = run("deadline", "interleaved", 4, 2, train_ticks=20)
    capped, rows, _ = run("deadline", "interleaved", 4, 2, train_ticks=20, cap=3)
    assert capped.controller.max_outstanding == 3
    # The step row is taken after the batch left: at most cap - B groups are still outstanding.
    assert max(row["outstanding_groups"] for _, row in rows.steps) <= 3 - 2
    assert max(row["outstanding_groups"] for _, row in free.steps) > 1


def test_deadline_needs_the_pipeline_mode() -> None:
    assert PipelineConfig().admission == "bounded"
    assert PipelineConfig(admission="deadline").admission == "deadline"
    assert PipelineConfig(admission="partial").admission == "partial"
    for rule in ("deadline", "partial"):
        with pytest.raises(ValidationError, match="admission: needs off_policy: pipeline"):
            PipelineConfig(off_policy="ppo_offpolicy", admission=rule)
    with pytest.raises(ValidationError):
        PipelineConfig(admission="later")
    assert PipelineConfig(max_outstanding_groups=8, prompts_per_step=8).max_outstanding_groups == 8
    with pytest.raises(ValidationError, match="max_outstanding_groups: must be 0 or >= prompts_per_step"):
        PipelineConfig(max_outstanding_groups=4, prompts_per_step=8)
    with pytest.raises(ValidationError, match="max_outstanding_groups: needs off_policy: pipeline"):
        PipelineConfig(off_policy="sync", max_outstanding_groups=8, prompts_per_step=8)


def _item(ticket: int, version: int) -> ReadyGroup:
    return ReadyGroup(ticket, version, None)  # type: ignore[arg-type]


def test_queue_select_takes_the_picked_items_or_waits() -> None:
    q = LocalGroupQueue()
    for t, v in enumerate([3, 1, 2, 1]):
        q.put(_item(t, v))
    assert [it.ticket for it in q.get_batch(2, timeout=0) or []] == [0, 1]  # FIFO without select
    oldest = lambda items: sorted(range(len(items)), key=lambda i: items[i].admit_version)[:2]  # noqa: E731
    q.put(_item(4, 0))
    assert [it.ticket for it in q.get_batch(2, timeout=0, select=oldest) or []] == [3, 4]
    assert [it.ticket for it in q.snapshot()] == [2]
    assert q.get_batch(1, timeout=0, select=lambda items: None) is None  # nothing valid: nothing taken
    assert len(q) == 1
    with pytest.raises(ValueError, match="distinct indices"):
        q.get_batch(1, timeout=0, select=lambda items: [0, 0])
