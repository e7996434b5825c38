"""The engine pool end to end through the real driver: lag bound with one engine slowed down,
least-loaded placement, in-flight updates, engine deaths re-issued and counted, no engine left."""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import replace

import pytest
from pipeline.fakes import FakeEngine, FakeScorer, FakeSource, FakeTrainer, Rows, decode, encode
from ray_engines import CrashingEngine

from scalerl.assembly.sections import driver_settings
from scalerl.config import DistributedConfig, RunConfig
from scalerl.distributed.channel import RayWeightChannel
from scalerl.distributed.engine_actor import EngineFactory
from scalerl.distributed.pool import EnginePool, NoEngineLeftError
from scalerl.pipeline import Components, Driver
from scalerl.rollout.factory import EngineSpec
from scalerl.rollout.protocol import GenerationRequest, SamplingParams

pytestmark = pytest.mark.distributed

DIST = DistributedConfig(backend="ray", engine_num_cpus=0.25, timeout_s=60, startup_timeout_s=120)


def make_config(mode: str, k: int, b: int, n: int = 4, steps: int = 20) -> RunConfig:
    return RunConfig.model_validate({
        "max_steps": steps,
        "pipeline": {"off_policy": mode, "k": k, "prompts_per_step": b},
        "generation": {"n": n, "max_new_tokens": 64},
        "eval": {"at_start": False},
        "rewards": {"max_workers": 2},
    })


def run_driver(
    cfg: RunConfig, pool: EnginePool, trainer: FakeTrainer, source: FakeSource
) -> tuple[Driver, Rows]:
    rows = Rows()
    comps = Components(
        engine=pool, trainer=trainer, source=source, scorer=FakeScorer(), encode=encode, decode=decode,
        params=SamplingParams(n=cfg.generation.n, max_new_tokens=cfg.generation.max_new_tokens),
        metrics=rows, channel=RayWeightChannel(pool, mode="object_store", timeout_s=60),
    )
    driver = Driver(driver_settings(cfg), comps)
    return driver, rows


def lags(trainer: FakeTrainer) -> list[int]:
    return [u - c.start_version for u, groups in trainer.batches for g in groups for c in g.completions]


@pytest.mark.parametrize("k", [1, 3])
def test_slow_engine_keeps_the_lag_bound(ray_cluster: object, k: int) -> None:
    # Device emulators: the same timing model, one engine four times slower (sleeps, not CPU).
    def emulated(seed: int, slowdown: float) -> EngineFactory:
        options = {"step_s": 0.002, "slowdown": slowdown, "length_median": 12.0,
                   "length_sample_sigma": 0.8, "vocab_size": 64}
        return EngineFactory(EngineSpec(kind="emulated", model_path=None, fp32_lm_head=False, seed=seed,
                                        max_batch_size=8, eos_token_ids=(63,), options=options))

    pool = EnginePool.launch([emulated(1, 1.0), emulated(2, 4.0)], DIST)
    try:
        cfg = make_config("pipeline", k, b=2, steps=15)
        trainer = FakeTrainer(step_time=(0.0, 0.01))
        source = FakeSource()
        driver, _ = run_driver(cfg, pool, trainer, source)
        result = driver.run()
        assert result.steps == 15
        assert max(lags(trainer)) <= k and result.max_version_lag <= k
        fast_m, slow_m = pool.members
        assert slow_m.samples > 0 and fast_m.samples > 0
        if k == 3:
            # With slack, groups queue behind the slow engine: least-loaded placement then gives the
            # fast one more (at k=1 admission hands out so few groups that both engines idle-tie).
            assert slow_m.samples < fast_m.samples
        # In flight: some samples span more than one version (weights landed mid-generation).
        assert any(len(set(c.versions)) > 1 for _, gs in trainer.batches for g in gs for c in g.completions)
        trained = [g.record.id for _, gs in trainer.batches for g in gs]
        assert len(trained) == len(set(trained)) == 30
        assert pool.counters.engine_deaths == 0
    finally:
        pool.close()


def test_generate_keeps_order_and_other_completions(ray_cluster: object) -> None:
    pool = EnginePool.launch([functools.partial(FakeEngine, max_batch_size=4, seed=s) for s in (1, 2)], DIST)
    try:
        params = SamplingParams(n=3, max_new_tokens=16, seed=7)
        pool.submit([GenerationRequest("train/0", [1, 2], params)])
        reqs = [GenerationRequest(f"eval/{i}", [1], params) for i in range(5)]
        out = pool.generate(reqs)
        expected = [(f"eval/{i}", j) for i in range(5) for j in range(3)]
        assert [(c.request_id, c.sample_index) for c in out] == expected
        rest = []
        deadline = time.monotonic() + 30
        while pool.num_unfinished() and time.monotonic() < deadline:
            rest.extend(pool.step())
        assert sorted((c.request_id, c.sample_index) for c in rest) == [("train/0", j) for j in range(3)]
    finally:
        pool.close()


@pytest.mark.parametrize("how", ["ray_kill", "os_exit"])
def test_engine_death_reissues_its_groups(ray_cluster: object, how: str) -> None:
    ray = ray_cluster
    base = {"max_batch_size": 8, "step_sleep": (0.005, 0.01), "long_tail": 0.2, "max_len": 40}
    factories = [functools.partial(FakeEngine, seed=1, **base)]
    if how == "os_exit":
        factories.append(functools.partial(CrashingEngine, 60, seed=2, **base))
    else:
        factories.append(functools.partial(FakeEngine, seed=2, **base))
    pool = EnginePool.launch(factories, DIST)
    try:
        cfg = make_config("pipeline", 2, b=2, steps=14)
        trainer = FakeTrainer(step_time=(0.0, 0.01))
        source = FakeSource()
        driver, _ = run_driver(cfg, pool, trainer, source)
        if how == "ray_kill":
            def killer() -> None:
                while len(trainer.batches) < 3:
                    time.sleep(0.01)
                ray.kill(pool.members[1].actor)
            threading.Thread(target=killer, daemon=True).start()
        result = driver.run()
        assert result.steps == 14 and max(lags(trainer)) <= 2
        assert pool.counters.engine_deaths == 1 and not pool.members[1].alive
        assert pool.stats()["pool_engines_alive"] == 1.0
        # Every prompt drawn is trained exactly once or still outstanding; none is lost with the engine.
        trained = [g.record.id for _, gs in trainer.batches for g in gs]
        outstanding = [o["record"]["id"] for o in driver.generator.state_dict()["outstanding"]]
        assert len(trained) == len(set(trained))
        assert set(source.drawn) == set(trained) | set(outstanding)
        for _, groups in trainer.batches:
            for g in groups:
                assert sorted(c.sample_index for c in g.completions) == list(range(cfg.generation.n))
    finally:
        pool.close()


def test_no_engine_left_is_a_clear_error(ray_cluster: object) -> None:
    base = {"max_batch_size": 4, "step_sleep": (0.005, 0.01), "max_len": 40}
    pool = EnginePool.launch([functools.partial(CrashingEngine, 20, seed=s, **base) for s in (1, 2)], DIST)
    try:
        cfg = make_config("pipeline", 2, b=2, steps=50)
        driver, _ = run_driver(cfg, pool, FakeTrainer(), FakeSource())
        with pytest.raises(RuntimeError, match="every engine actor of the pool died") as info:
            driver.run()
        assert isinstance(info.value.__cause__, NoEngineLeftError) or "NoEngineLeftError" in str(info.value)
        assert pool.counters.engine_deaths == 2
    finally:
        pool.close()


def test_a_cache_key_stays_on_the_engine_that_holds_its_context(ray_cluster: object) -> None:
    """Later turns of an episode group (one `cache_key`) go where its context is cached, whatever
    the load; a key whose engine died goes to the least loaded survivor."""
    pool = EnginePool.launch([functools.partial(FakeEngine, max_batch_size=4, seed=s) for s in (1, 2)], DIST)
    params = SamplingParams(n=2, max_new_tokens=8, seed=3)

    def placed(request: GenerationRequest) -> int:
        pool.submit([request])
        return pool._flights[request.request_id].engine

    try:
        first = {key: placed(GenerationRequest(f"{key}#0", [1], params, cache_key=key)) for key in ("a", "b")}
        assert sorted(first.values()) == [0, 1]  # least loaded: one each
        pool.generate([])
        while pool.num_unfinished():
            pool.step()
        # Load engine a's way down with keyless work: its next turn still goes there.
        for i in range(3):
            assert placed(GenerationRequest(f"free/{i}", [1], params)) in (0, 1)
        busy = max(pool.members, key=lambda m: m.load).index
        key = "a" if first["a"] == busy else "b"
        assert placed(GenerationRequest(f"{key}#1", [1, 2], replace(params, n=1), cache_key=key)) == busy
        assert pool.counters.sticky_requests == 1
        pool.mark_dead(pool.members[busy], "test")  # re-issues its flights: the key moves with them
        assert pool._flights[f"{key}#1"].engine == 1 - busy
        assert placed(GenerationRequest(f"{key}#2", [1, 2], replace(params, n=1), cache_key=key)) == 1 - busy
        assert pool.counters.sticky_requests == 2
    finally:
        pool.close()


def _serve(pool: EnginePool, until: object, timeout_s: float = 180) -> None:
    """Keep the pool stepping (it advances restarts there) until `until()` or the timeout."""
    deadline = time.monotonic() + timeout_s
    while not until():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        pool.step()


def test_a_dead_engine_is_restarted_rejoins_at_the_current_weights_and_restarts_are_bounded(
    ray_cluster: object,
) -> None:
    import torch

    ray = ray_cluster
    base = {"max_batch_size": 4, "step_sleep": (0.001, 0.002), "max_len": 8}
    dist = DIST.model_copy(update={"engine_restarts": 1, "engine_restart_backoff_s": 0.2})
    pool = EnginePool.launch([functools.partial(FakeEngine, seed=s, **base) for s in (1, 2)], dist)
    try:
        pool.update_weights({"w": torch.ones(3)}, 5)
        assert [m.version for m in pool.members] == [5, 5]
        ray.kill(pool.members[1].actor)
        params = SamplingParams(n=2, max_new_tokens=4)
        # The death is seen by a poll; the engine restarts after the backoff and loads version 5.
        _serve(pool, lambda: pool.counters.engine_deaths == 1)
        assert pool.stats()["pool_engines_restarting"] == 1.0
        _serve(pool, lambda: pool.counters.engine_restarts == 1)
        assert pool.members[1].alive and pool.members[1].version == 5 and pool.version == 5
        assert pool.restarts_left == 0 and pool.stats()["pool_engines_alive"] == 2.0
        # It serves: a batch of requests lands on both engines again, every sample back.
        requests = [GenerationRequest(f"r{i}", [1, 2, 3], params) for i in range(6)]
        done = pool.generate(requests)
        assert len(done) == 12 and pool.members[1].samples > 0
        # Restarts exhausted: a second death is final, the run goes on with one engine.
        ray.kill(pool.members[1].actor)
        _serve(pool, lambda: pool.counters.engine_deaths == 2)
        assert not pool._restarting and not pool.members[1].alive
        assert len(pool.generate([GenerationRequest("last", [1, 2], params)])) == 2
    finally:
        pool.close()
