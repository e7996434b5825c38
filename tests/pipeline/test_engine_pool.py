"""ThreadedEnginePool: one Engine over several, least-loaded placement, min version, the lag bound."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from scalerl.assembly.sections import driver_settings
from scalerl.config import RunConfig
from scalerl.pipeline.driver import Components, Driver
from scalerl.pipeline.engine_pool import EngineThreadError, ThreadedEnginePool
from scalerl.rollout.emulated import EmulatedEngine
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest, SamplingParams
from scalerl.training.emulated import EmulatedTrainer
from tests.pipeline.fakes import FakeScorer, FakeSource, Rows, decode, encode


def emulated(**kwargs: Any) -> EmulatedEngine:
    options: dict[str, Any] = {"vocab_size": 100, "step_s": 0.001, "max_batch_size": 8, "length_median": 12}
    options.update(kwargs)
    return EmulatedEngine(**options)


def req(i: int, n: int = 2, max_new_tokens: int = 40) -> GenerationRequest:
    params = SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=500 + i)
    return GenerationRequest(f"r{i}", [1, 2], params)


def key(c: Completion) -> tuple:
    return (c.request_id, c.sample_index, c.token_ids, c.logprobs, c.versions, c.start_version)


def test_pool_generates_what_one_engine_generates() -> None:
    requests = [req(i) for i in range(7)]
    reference = emulated(step_s=0.0, sleep=False).generate(requests)
    with ThreadedEnginePool([emulated(), emulated(max_batch_size=2), emulated(slowdown=3.0)]) as pool:
        assert isinstance(pool, Engine)
        out = pool.generate(requests)
        assert [key(c) for c in out] == [key(c) for c in reference]
        assert pool.num_unfinished() == 0 and pool.step() == []


def test_step_streams_and_request_ids_may_repeat() -> None:
    with ThreadedEnginePool([emulated(), emulated()]) as pool:
        # The same request id twice (two callers): the pool keeps them apart.
        pool.submit([req(0), req(0), req(1)])
        got: list[Completion] = []
        deadline = time.monotonic() + 30
        while pool.num_unfinished():
            got.extend(pool.step())
            assert time.monotonic() < deadline
        assert sorted((c.request_id, c.sample_index) for c in got) == [
            ("r0", 0), ("r0", 0), ("r0", 1), ("r0", 1), ("r1", 0), ("r1", 1)
        ]


def test_finished_but_undelivered_counts_as_unfinished() -> None:
    # The engines finish (their threads deliver) before the caller looks: the caller must still see
    # work to collect, or a round-mode `fill` would stop stepping and lose the last group.
    with ThreadedEnginePool([emulated(), emulated()]) as pool:
        pool.submit([req(0), req(1)])
        deadline = time.monotonic() + 30
        while any(pool.loads()):
            time.sleep(0.001)
            assert time.monotonic() < deadline
        assert pool.num_unfinished() == 4
        assert len(pool.step()) == 4 and pool.num_unfinished() == 0


def test_groups_go_to_the_least_loaded_engine() -> None:
    engines = [emulated(step_s=0.05) for _ in range(3)]
    with ThreadedEnginePool(engines) as pool:
        pool.submit([req(0, n=4), req(1, n=2), req(2, n=3)])
        assert pool.loads() == [4, 2, 3]
        pool.submit([req(3, n=1)])  # to the engine with 2
        assert pool.loads() == [4, 3, 3]
        pool.submit([req(4, n=1)])  # tie 3/3: the lower index
        assert pool.loads() == [4, 4, 3]


def test_version_is_the_minimum_and_updates_reach_every_engine() -> None:
    engines = [emulated(initial_version=3), emulated(initial_version=1), emulated(initial_version=2)]
    with ThreadedEnginePool(engines) as pool:
        assert pool.version == 1
        pool.submit([req(i, max_new_tokens=200) for i in range(3)])
        pool.update_weights({}, 4)  # in flight: the engines are stepping
        assert [e.version for e in engines] == [4, 4, 4] and pool.version == 4
        while pool.num_unfinished():
            pool.step()


class _Broken(EmulatedEngine):
    def _step_locked(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("device lost")


def test_an_engine_failure_surfaces_on_the_callers_thread() -> None:
    with ThreadedEnginePool([emulated(), _Broken(vocab_size=100)]) as pool:
        pool.submit([req(0), req(1)])
        with pytest.raises(EngineThreadError, match="device lost"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                pool.step()


class _RecordingTrainer(EmulatedTrainer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sample_lags: list[int] = []
        self.token_lags: list[int] = []

    def step(self, groups: Sequence[Any]) -> dict[str, float]:
        for g in groups:
            for c in g.completions:
                self.sample_lags.append(self.version - c.start_version)
                self.token_lags.extend(self.version - v for v in c.versions)
        return super().step(groups)


def _config(mode: str, k: int, steps: int) -> RunConfig:
    return RunConfig.model_validate({
        "max_steps": steps,
        "generation": {"n": 3, "max_new_tokens": 48, "seed": 0, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": mode, "k": k, "prompts_per_step": 4},
        "eval": {"at_start": False},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1},
    })


@pytest.mark.parametrize("max_lag", [1, 3])
def test_a_slow_engine_does_not_break_the_lag_bound(max_lag: int) -> None:
    # Pipeline mode, 3 engines, one 8x slower (to step and to load weights), the trainer fast:
    # the slow engine holds the pool's version back and its groups finish late, the bound holds.
    engines = [emulated(update_s=0.002), emulated(update_s=0.002), emulated(update_s=0.002, slowdown=8.0)]
    trainer = _RecordingTrainer(step_s=0.004)
    cfg = _config("pipeline", max_lag, steps=24)
    with ThreadedEnginePool(engines) as pool:
        params = SamplingParams(n=3, max_new_tokens=48)
        components = Components(engine=pool, trainer=trainer, source=FakeSource(), scorer=FakeScorer(),
                                encode=encode, decode=decode, params=params, metrics=Rows())
        driver = Driver(driver_settings(cfg), components)
        result = driver.run()
    assert result.steps == 24 and trainer.version == 24
    assert result.max_version_lag <= max_lag
    assert 1 <= max(trainer.sample_lags) <= max_lag and max(trainer.token_lags) <= max_lag
    assert len(trainer.sample_lags) == 24 * 4 * 3
    # Placement by load: the slow engine, whose groups stay longer, took the fewest tokens.
    generated = [e.stats.generated_tokens for e in engines]
    assert generated[2] < min(generated[:2])
    # Every admitted group was consumed or is still outstanding (none dropped: no dynamic sampling).
    counters = result.counters
    assert counters["groups_consumed"] == 24 * 4 and counters["groups_dropped"] == 0
    assert counters["groups_admitted"] == counters["groups_consumed"] + driver.controller.outstanding


def test_round_modes_drive_a_pool() -> None:
    engines = [emulated(), emulated()]
    trainer = _RecordingTrainer(step_s=0.002)
    with ThreadedEnginePool(engines) as pool:
        params = SamplingParams(n=3, max_new_tokens=48)
        components = Components(engine=pool, trainer=trainer, source=FakeSource(), scorer=FakeScorer(),
                                encode=encode, decode=decode, params=params)
        result = Driver(driver_settings(_config("ppo_offpolicy", 4, steps=8)), components).run()
    assert result.steps == 8
    # PPO-off-policy-4: the round's 4 mini-batches were generated by one policy: lags 0, 1, 2, 3.
    per_step = [trainer.sample_lags[i * 12 : (i + 1) * 12] for i in range(8)]
    assert [set(lags) for lags in per_step] == [{0}, {1}, {2}, {3}] * 2

