"""The driver's evaluation schedule (start, every N steps, end) in each mode, at the trainer's
current version, through `engine.generate` (round modes) or the generator loop (pipeline, either
schedule)."""

from __future__ import annotations

import pytest

from scalerl.assembly.sections import driver_settings
from scalerl.data.records import PromptRecord
from scalerl.evaluation import Evaluator
from scalerl.pipeline import Driver, GroupScorer
from scalerl.rollout.protocol import SamplingParams

from .fakes import FakeEngine, FakeScorer, FakeSource, FakeTrainer, decode, encode
from .test_modes import build, make_config


def heldout(counts: list[int]) -> list[PromptRecord]:
    return [
        PromptRecord(id=f"h{i}", task="fake", prompt=f"held-out {i}", metadata={"n_correct": c})
        for i, c in enumerate(counts)
    ]


@pytest.mark.parametrize(
    "mode,schedule,train_ticks",
    [("sync", "threaded", 0), ("ppo_offpolicy", "threaded", 0), ("pipeline", "threaded", 0),
     ("pipeline", "interleaved", 0), ("pipeline", "interleaved", 5)],
)
def test_driver_evaluates_at_start_every_n_and_end(mode: str, schedule: str, train_ticks: int) -> None:
    cfg = make_config(mode, 2, 2, steps=7, schedule=schedule, train_ticks=train_ticks)
    cfg.eval.every = 3
    cfg.eval.at_start = True
    engine = FakeEngine(max_batch_size=8, step_sleep=(0.0, 0.001))
    trainer = FakeTrainer(engine, step_time=(0.0, 0.003))
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=FakeSource())
    counts = [1, 3, 0, 2]
    scorer = GroupScorer(FakeScorer(), decode, max_workers=2)
    params = SamplingParams(max_new_tokens=64)
    comps.evaluator = Evaluator(heldout(counts), encode, scorer, k=4, params=params)
    Driver(driver_settings(cfg), comps).run()
    assert [s for s, _ in rows.evals] == [0, 3, 6, 7]
    for _, row in rows.evals:
        assert row["val_pass_rate"] == pytest.approx(sum(c / 4 for c in counts) / 4)
        # Every evaluation token came from the trainer's weights at that point.
        assert row["val_version_min"] == row["val_version_max"] == row["version"]
    assert [row["version"] for _, row in rows.evals] == [0, 3, 6, 7]


@pytest.mark.parametrize("mode", ["sync", "pipeline"])
def test_the_last_checkpoint_is_written_after_the_final_evaluation(mode: str) -> None:
    """A checkpoint at max_steps is what `--resume` takes for a finished run: written before the
    final evaluation, a kill between the two left the curve without its last point for good (CI saw
    it: the run "already finished" at step 8, its last eval row at step 6). So the last step's
    checkpoint comes after that evaluation and records it; the earlier ones keep their schedule."""
    cfg = make_config(mode, 2, 2, steps=8)
    cfg.eval.every, cfg.eval.at_start, cfg.checkpoint.every = 3, True, 2
    engine = FakeEngine(max_batch_size=8)
    comps, rows = build(cfg, engine=engine, trainer=FakeTrainer(engine), source=FakeSource())
    scorer = GroupScorer(FakeScorer(), decode, max_workers=1)
    params = SamplingParams(max_new_tokens=16)
    comps.evaluator = Evaluator(heldout([1, 2]), encode, scorer, k=2, params=params)
    order: list[tuple[str, int]] = []
    saved: dict[int, dict] = {}
    log_eval = rows.log_eval

    def logged_eval(step: int, row: dict) -> None:
        order.append(("eval", step))
        log_eval(step, row)

    def checkpoint(step: int, state: dict) -> None:
        order.append(("checkpoint", step))
        saved[step] = state

    rows.log_eval, comps.checkpoint = logged_eval, checkpoint
    Driver(driver_settings(cfg), comps).run()
    assert order == [("eval", 0), ("checkpoint", 2), ("eval", 3), ("checkpoint", 4), ("eval", 6),
                     ("checkpoint", 6), ("eval", 8), ("checkpoint", 8)]
    assert saved[8]["evaluated_at"] == 8 and saved[6]["evaluated_at"] == 6
