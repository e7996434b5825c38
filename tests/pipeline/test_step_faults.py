"""Faults inside a step, through the whole driver: counted, the run goes on through occasional ones
and stops with an error naming the limit after a configured number in a row; the optimizer is never
fed a NaN (scalerl/pipeline/faults.py).

Verifier crash, NaN reward and dynamic-sampling drops run on the fakes; a verifier worker that
hangs is a real `MathVerifier` process killed at its timeout; every group filtered and the
optimizer-state checks use the real `Trainer` on a tiny policy (fed by the fake engine).
"""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch

from scalerl.assembly.sections import driver_settings, trainer_settings
from scalerl.config import ModelConfig, RunConfig, TinyModelConfig
from scalerl.data.records import PromptRecord
from scalerl.pipeline import Driver
from scalerl.pipeline.faults import FaultLimitError
from scalerl.rewards.math_verifier import MathVerifier
from scalerl.rewards.router import RewardOutcome
from scalerl.training.policy import load_policy
from scalerl.training.trainer import Trainer

from .fakes import FakeEngine, FakeScorer, FakeTrainer
from .test_modes import build, make_config

MODES = [("sync", 1), ("ppo_offpolicy", 2), ("pipeline", 2)]
FAILURE_REWARD = -0.5


def config(mode: str = "sync", k: int = 1, *, steps: int = 8, n: int = 4, **sections: dict) -> RunConfig:
    cfg = make_config(mode, k, 2, n=n, steps=steps)
    tree = cfg.model_dump()
    tree["rewards"]["failure_reward"] = FAILURE_REWARD
    for section, values in sections.items():
        tree[section].update(values)
    return RunConfig.model_validate(tree)


class CountingScorer(FakeScorer):
    """The fake verifier, with faults: `crash(record, index)` raises, `nan(record, index)` is NaN."""

    def __init__(self, crash=lambda r, i: False, nan=lambda r, i: False, constant: float | None = None):
        super().__init__()
        self.crash, self.nan, self.constant = crash, nan, constant
        self.raised = 0
        self.nans = 0
        self._count = threading.Lock()

    def score(self, record: PromptRecord, completion_text: str) -> float:
        index = int(completion_text.split()[0])
        if self.crash(record, index):
            with self._count:
                self.raised += 1
            raise RuntimeError("verifier crashed")
        if self.nan(record, index):
            with self._count:
                self.nans += 1
            return math.nan
        if self.constant is not None:
            return self.constant
        return super().score(record, completion_text)


def number(record: PromptRecord) -> int:
    return int(record.id.lstrip("p"))


def total(rows, key: str) -> float:
    return sum(r[key] for _, r in rows.steps)


# ------------------------------------------------------------------------------- verifier crash
@pytest.mark.parametrize("mode,k", MODES)
def test_an_occasionally_crashing_verifier_is_counted_and_the_run_goes_on(mode: str, k: int) -> None:
    cfg = config(mode, k, rewards={"max_consecutive_failures": 3})
    # Samples 0 and 1 of every third prompt crash: 2 failures in a row, under the limit of 3.
    scorer = CountingScorer(crash=lambda r, i: number(r) % 3 == 0 and i < 2)
    trainer = FakeTrainer()
    comps, rows = build(cfg, scorer=scorer, trainer=trainer)
    driver = Driver(driver_settings(cfg), comps)
    assert driver.run().steps == cfg.max_steps
    assert scorer.raised > 0
    assert driver.generator.counters.verifier_failures == scorer.raised
    logged = total(rows, "verifier_failures")
    assert logged <= scorer.raised  # the rest belong to groups still in flight at the end
    trained = [g for _, groups in trainer.batches for g in groups]
    crashed = [g for g in trained if number(g.record) % 3 == 0]
    assert crashed, "no crashed group was trained"
    for g in crashed:
        assert g.rewards[:2] == [FAILURE_REWARD, FAILURE_REWARD] and g.correct[:2] == [False, False]
    assert logged == 2 * len(crashed) or mode == "pipeline"  # round modes log what they trained


@pytest.mark.parametrize("mode,k", MODES)
def test_a_verifier_that_always_crashes_stops_the_run_naming_the_limit(mode: str, k: int) -> None:
    cfg = config(mode, k, rewards={"max_consecutive_failures": 6})
    scorer = CountingScorer(crash=lambda r, i: True)
    comps, _ = build(cfg, scorer=scorer)
    driver = Driver(driver_settings(cfg), comps)
    message = (r"^\d+ verifier calls failed in a row \(last: RuntimeError: verifier crashed "
               r"\(prompt 'p\d+'\)\); stopping \(rewards\.max_consecutive_failures=6\)")
    with pytest.raises(FaultLimitError, match=message):
        driver.run()
    assert 6 <= driver.generator.failure_run.count <= scorer.raised
    assert not driver.generator.running


# ------------------------------------------------------------------------------- verifier hang
class HangingMath:
    """A math verifier whose worker process hangs (sympy on 9^9^9^9) for the prompts `hangs` picks."""

    def __init__(self, hangs) -> None:
        self.verifier = MathVerifier(timeout_s=0.5, workers=1)
        self.hangs = hangs

    def score(self, record: PromptRecord, completion_text: str) -> RewardOutcome:
        index = int(completion_text.split()[0])
        answer = "9^{9^{9^{9}}}" if self.hangs(record) else str(index % 2)
        result = self.verifier.check(f"\\boxed{{{answer}}}", "0")
        return RewardOutcome(float(result.correct), result.correct, result.status, result.detail)


def test_a_hanging_verifier_worker_is_killed_counted_and_the_run_goes_on() -> None:
    cfg = config(n=2, steps=3, rewards={"max_consecutive_failures": 3, "max_workers": 1})
    scorer = HangingMath(hangs=lambda r: r.id == "p1")  # 2 samples hang: 2 in a row, limit 3
    trainer = FakeTrainer()
    comps, rows = build(cfg, scorer=scorer, trainer=trainer)  # type: ignore[arg-type]
    try:
        assert Driver(driver_settings(cfg), comps).run().steps == 3
    finally:
        scorer.verifier.close()
    assert scorer.verifier.restarts == 2 and total(rows, "verifier_failures") == 2
    hung = [g for _, gs in trainer.batches for g in gs if g.record.id == "p1"]
    assert len(hung) == 1 and hung[0].rewards == [0.0, 0.0]


def test_a_verifier_worker_that_hangs_every_time_stops_the_run() -> None:
    cfg = config(n=2, steps=3, rewards={"max_consecutive_failures": 3, "max_workers": 1})
    scorer = HangingMath(hangs=lambda r: True)
    comps, _ = build(cfg, scorer=scorer)  # type: ignore[arg-type]
    try:
        with pytest.raises(FaultLimitError, match=r"verifier calls failed in a row \(last: status 'timeout': "
                           r"math-verify exceeded 0\.5s .*rewards\.max_consecutive_failures=3"):
            Driver(driver_settings(cfg), comps).run()
    finally:
        scorer.verifier.close()
    assert 3 <= scorer.verifier.restarts <= 4  # one group of 2, then one more sample at most


# ------------------------------------------------------------------------------- NaN reward
@pytest.mark.parametrize("mode,k", MODES)
def test_a_nan_reward_is_a_counted_failure_and_never_reaches_the_trainer(mode: str, k: int) -> None:
    cfg = config(mode, k, rewards={"max_consecutive_failures": 2})
    scorer = CountingScorer(nan=lambda r, i: i == 3)
    trainer = FakeTrainer()
    comps, _ = build(cfg, scorer=scorer, trainer=trainer)
    driver = Driver(driver_settings(cfg), comps)
    driver.run()
    trained = [g for _, groups in trainer.batches for g in groups]
    assert trained and all(math.isfinite(x) for g in trained for x in g.rewards)
    assert all(g.rewards[3] == FAILURE_REWARD for g in trained)
    # One NaN per group (sample 3): every collected group counted exactly one failure. A group still
    # being scored when the run stopped was never collected (the scorer saw its NaN, nobody used it).
    counters = driver.generator.counters
    assert counters.verifier_failures == counters.groups_scored > 0 and scorer.nans >= counters.groups_scored


# ------------------------------------------------------------------------------- dynamic sampling
def test_groups_dropped_in_a_row_by_dynamic_sampling_stop_the_run() -> None:
    cfg = config(algorithm={"dynamic_sampling": True, "max_consecutive_dropped_groups": 5})
    scorer = CountingScorer(constant=1.0)  # every group solved: every group dropped
    trainer = FakeTrainer()
    comps, _ = build(cfg, scorer=scorer, trainer=trainer)
    driver = Driver(driver_settings(cfg), comps)
    message = (r"^5 groups dropped by dynamic sampling in a row \(last: prompt 'p\d+', rewards "
               r"\[1\.0, 1\.0, 1\.0, 1\.0\]\); stopping \(algorithm\.max_consecutive_dropped_groups=5\)")
    with pytest.raises(FaultLimitError, match=message):
        driver.run()
    assert trainer.batches == [] and driver.generator.counters.groups_dropped == 5


# ------------------------------------------------------------------------------- the real trainer
TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                       max_position_embeddings=128)


def real_trainer(cfg: RunConfig) -> Trainer:
    policy = load_policy(ModelConfig(tiny=TINY, init_seed=0), device="cpu")
    return Trainer.from_settings(trainer_settings(cfg), policy)


def optimizer_is_finite(trainer: Trainer) -> bool:
    state = trainer.optimizer.state_dict()["state"]
    return all(torch.isfinite(v).all() for s in state.values() for v in s.values() if torch.is_tensor(v))


def test_every_group_filtered_is_a_counted_noop_that_stops_after_the_limit() -> None:
    cfg = config(steps=10, optim={"max_consecutive_noop_steps": 3})
    trainer = real_trainer(cfg)
    params = copy.deepcopy(trainer.policy.model.state_dict())
    comps, rows = build(cfg, scorer=CountingScorer(constant=1.0), engine=FakeEngine(max_len=8),
                        trainer=trainer)  # type: ignore[arg-type]
    message = (r"^3 steps with every group filtered \(no learning signal\) in a row \(last: step 3\); "
               r"stopping \(optim\.max_consecutive_noop_steps=3\)")
    with pytest.raises(FaultLimitError, match=message):
        Driver(driver_settings(cfg), comps).run()
    assert [r["skipped_no_signal"] for _, r in rows.steps] == [1.0, 1.0, 1.0]
    assert trainer.version == 0 and trainer.noop_steps == 3 and trainer.optimizer.state_dict()["state"] == {}
    assert all(torch.equal(v, params[k]) for k, v in trainer.policy.model.state_dict().items())


@pytest.mark.parametrize("mode,k", [("sync", 1), ("pipeline", 2)])
def test_crashes_and_nan_rewards_leave_the_real_optimizer_finite_and_learning(mode: str, k: int) -> None:
    cfg = config(mode, k, steps=6, rewards={"max_consecutive_failures": 3})
    trainer = real_trainer(cfg)
    # Sample 3 is NaN everywhere, samples 0-1 of every other prompt crash.
    scorer = CountingScorer(crash=lambda r, i: number(r) % 2 == 0 and i < 2, nan=lambda r, i: i == 3)
    comps, rows = build(cfg, scorer=scorer, engine=FakeEngine(max_len=8), trainer=trainer)  # type: ignore[arg-type]
    assert Driver(driver_settings(cfg), comps).run().steps == 6
    assert scorer.raised > 0 and scorer.nans > 0
    assert total(rows, "skipped_nonfinite") == 0, "a NaN reached the loss"
    assert trainer.version == 6 - int(total(rows, "skipped_no_signal")) > 0
    assert optimizer_is_finite(trainer)
    assert all(torch.isfinite(p).all() for p in trainer.policy.model.parameters())
