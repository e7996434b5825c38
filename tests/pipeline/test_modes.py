"""The three schedules end to end with fake engine/trainer of random speeds: lag bound, in-flight
updates, idle engine during training in round modes, no prompt lost or duplicated."""

from __future__ import annotations

import pytest

from scalerl.assembly.sections import driver_settings
from scalerl.config import RunConfig
from scalerl.pipeline import Components, Driver
from scalerl.rollout.protocol import SamplingParams

from .fakes import FakeEngine, FakeScorer, FakeSource, FakeTrainer, Rows, decode, encode


def make_config(
    mode: str,
    k: int,
    b: int,
    n: int = 4,
    steps: int = 20,
    schedule: str = "threaded",
    train_ticks: int = 0,
    **algo: object,
) -> RunConfig:
    pipeline = {"off_policy": mode, "k": k, "prompts_per_step": b, "schedule": schedule,
                "decode_steps_per_train_step": train_ticks}
    return RunConfig.model_validate(
        {
            "max_steps": steps,
            "pipeline": pipeline,
            "generation": {"n": n, "max_new_tokens": 64},
            "algorithm": algo,
            "eval": {"at_start": False},
            "rewards": {"max_workers": 2},
        }
    )


def build(
    cfg: RunConfig,
    *,
    engine: FakeEngine | None = None,
    trainer: FakeTrainer | None = None,
    source: FakeSource | None = None,
    scorer: FakeScorer | None = None,
) -> tuple[Components, Rows]:
    engine = engine or FakeEngine()
    rows = Rows()
    comps = Components(
        engine=engine,
        trainer=trainer or FakeTrainer(engine),
        source=source or FakeSource(),
        scorer=scorer or FakeScorer(),
        encode=encode,
        decode=decode,
        params=SamplingParams(n=cfg.generation.n, max_new_tokens=cfg.generation.max_new_tokens),
        metrics=rows,
    )
    return comps, rows


def check_accounting(driver: Driver, source: FakeSource, trainer: FakeTrainer) -> list[str]:
    """Every drawn prompt is trained once, dropped (counted), or still outstanding; nothing else."""
    trained = [g.record.id for _, groups in trainer.batches for g in groups]
    outstanding = [o["record"]["id"] for o in driver.generator.state_dict()["outstanding"]]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert len(source.drawn) == len(set(source.drawn))
    assert not set(trained) & set(outstanding)
    dropped = set(source.reports) - set(trained) - set(outstanding)
    assert set(source.drawn) == set(trained) | set(outstanding) | dropped
    counters = driver.generator.counters
    assert counters.groups_dropped == len(dropped)
    assert counters.groups_consumed == len(trained)
    assert counters.prompts_drawn == len(source.drawn)
    assert source.lock_violations == 0
    return trained


@pytest.mark.parametrize("k,b", [(1, 2), (2, 3), (4, 4), (8, 2)])
def test_pipeline_lag_bound_under_random_speeds(k: int, b: int) -> None:
    cfg = make_config("pipeline", k, b, steps=25)
    engine = FakeEngine(max_batch_size=8, step_sleep=(0.0, 0.002), long_tail=0.15, max_len=60, seed=k)
    trainer = FakeTrainer(engine, step_time=(0.0, 0.01), seed=b)
    source = FakeSource()
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=source)
    driver = Driver(driver_settings(cfg), comps)
    result = driver.run()
    assert result.steps == 25 and result.stop_reason == "max_steps"

    lags = [u - c.start_version for u, groups in trainer.batches for g in groups for c in g.completions]
    assert max(lags) <= k
    assert max(row["version_lag_max"] for _, row in rows.steps) == max(lags)
    assert result.max_version_lag <= k
    # Weights went to the engine after every step, in flight (the generator kept stepping).
    assert engine.updates == list(range(1, 26))[: len(engine.updates)] and len(engine.updates) >= 24
    assert engine.busy_during_train > 0
    # Some samples span several versions (in-flight update mid-sequence).
    assert any(len(set(c.versions)) > 1 for _, gs in trainer.batches for g in gs for c in g.completions)
    for _, groups in trainer.batches:
        assert len(groups) == b
        for g in groups:
            assert len(g.completions) == cfg.generation.n
            assert sorted(c.sample_index for c in g.completions) == list(range(cfg.generation.n))
    check_accounting(driver, source, trainer)


def test_pipeline_with_large_lag_keeps_generator_busy() -> None:
    cfg = make_config("pipeline", 8, 2, steps=30)
    engine = FakeEngine(max_batch_size=8, step_sleep=(0.001, 0.002), long_tail=0.1, max_len=40)
    trainer = FakeTrainer(engine, step_time=(0.005, 0.015))
    comps, rows = build(cfg, engine=engine, trainer=trainer)
    Driver(driver_settings(cfg), comps).run()
    idle = [row["gen_idle_frac"] for _, row in rows.steps[5:]]
    assert sum(idle) / len(idle) < 0.1


def test_sync_mode_is_on_policy_and_engine_idle_while_training() -> None:
    cfg = make_config("sync", 8, 3, steps=12)
    engine = FakeEngine(max_batch_size=8, long_tail=0.2)
    trainer = FakeTrainer(engine, step_time=(0.0, 0.003))
    source = FakeSource()
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=source)
    driver = Driver(driver_settings(cfg), comps)
    driver.run()
    assert engine.busy_during_train == 0
    for u, groups in trainer.batches:
        assert all(c.start_version == u and set(c.versions) == {u} for g in groups for c in g.completions)
    assert all(row["version_lag_max"] == 0 for _, row in rows.steps)
    assert engine.updates == list(range(1, 12))  # loaded before each round but the first
    trained = check_accounting(driver, source, trainer)
    assert sorted(trained) == sorted(source.drawn)  # nothing outstanding at a round boundary


@pytest.mark.parametrize("k", [2, 4])
def test_ppo_offpolicy_rounds(k: int) -> None:
    b = 2
    cfg = make_config("ppo_offpolicy", k, b, steps=3 * k)
    engine = FakeEngine(max_batch_size=8, long_tail=0.2)
    trainer = FakeTrainer(engine)
    source = FakeSource()
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=source)
    driver = Driver(driver_settings(cfg), comps)
    driver.run()
    assert engine.busy_during_train == 0
    # Round r generates with weights r * k; its j-th mini-batch is trained at version r * k + j.
    for step, (u, groups) in enumerate(trainer.batches):
        start = (step // k) * k
        samples = [c for g in groups for c in g.completions]
        assert all(c.start_version == start and set(c.versions) == {start} for c in samples)
        assert u - start == step % k
    assert [row["version_lag_max"] for _, row in rows.steps] == [float(s % k) for s in range(3 * k)]
    assert engine.updates == [k, 2 * k]
    check_accounting(driver, source, trainer)


def test_steps_without_update_do_not_stall_round_modes() -> None:
    cfg = make_config("sync", 1, 2, steps=6)
    engine = FakeEngine()
    trainer = FakeTrainer(engine, noop_every=2)  # every second step leaves the version unchanged
    comps, _ = build(cfg, engine=engine, trainer=trainer)
    result = Driver(driver_settings(cfg), comps).run()
    assert result.steps == 6 and trainer.version == 3


@pytest.mark.parametrize(
    "mode,schedule",
    [("sync", "threaded"), ("ppo_offpolicy", "threaded"), ("pipeline", "threaded"),
     ("pipeline", "interleaved")],
)
def test_dynamic_sampling_keeps_only_informative_groups(mode: str, schedule: str) -> None:
    cfg = make_config(mode, 2, 3, steps=8, schedule=schedule, dynamic_sampling=True)
    engine = FakeEngine(max_batch_size=8)
    trainer = FakeTrainer(engine)
    source = FakeSource()
    comps, rows = build(cfg, engine=engine, trainer=trainer, source=source)
    driver = Driver(driver_settings(cfg), comps)
    result = driver.run()
    assert result.steps == 8
    for _, groups in trainer.batches:
        assert len(groups) == 3
        assert all(len(set(g.rewards)) > 1 for g in groups)
    easy_drawn = sum(1 for pid in source.drawn if int(pid[1:]) % 5 == 0)
    dropped = result.counters["groups_dropped"]
    assert dropped > 0
    assert dropped <= easy_drawn
    assert sum(row["groups_dropped"] for _, row in rows.steps) <= dropped
    assert source.refills == result.counters["refill_prompts"] > 0
    # Every drop was reported to the curriculum, exactly once per group.
    assert all(len(v) == 1 for v in source.reports.values())
    check_accounting(driver, source, trainer)


def test_verifier_failures_score_zero_and_are_counted() -> None:
    cfg = make_config("sync", 1, 4, steps=5)
    engine = FakeEngine()
    trainer = FakeTrainer(engine)
    comps, rows = build(cfg, engine=engine, trainer=trainer, scorer=FakeScorer(fail_every=2))
    result = Driver(driver_settings(cfg), comps).run()
    failures = result.counters["verifier_failures"]
    assert failures > 0
    assert sum(row["verifier_failures"] for _, row in rows.steps) == failures
    failed = [
        (g, i) for _, gs in trainer.batches for g in gs for i, c in enumerate(g.completions)
        if int(g.record.id[1:]) % 7 == 0 and c.token_ids[0] % 2 == 0
    ]
    assert len(failed) == failures
    assert all(g.rewards[i] == 0.0 and not g.is_correct[i] for g, i in failed)


def test_finite_prompts_stop_the_run() -> None:
    for mode, schedule in (("sync", "threaded"), ("pipeline", "threaded"), ("pipeline", "interleaved")):
        cfg = make_config(mode, 2, 2, steps=100, schedule=schedule)
        engine = FakeEngine()
        trainer = FakeTrainer(engine)
        source = FakeSource(limit=9)
        comps, _ = build(cfg, engine=engine, trainer=trainer, source=source)
        result = Driver(driver_settings(cfg), comps).run()
        assert result.stop_reason == "prompts_exhausted"
        assert result.steps == 4


@pytest.mark.parametrize("schedule", ["threaded", "interleaved"])
def test_step_rows_carry_pipeline_metrics(schedule: str) -> None:
    cfg = make_config("pipeline", 2, 2, steps=4, schedule=schedule)
    comps, rows = build(cfg)
    Driver(driver_settings(cfg), comps).run()
    _, row = rows.steps[-1]
    for key in ("version_lag_mean", "version_lag_max", "token_lag_mean", "gen_tokens_per_s", "gen_idle_frac",
                "truncation_rate", "interruption_rate", "reward_mean", "response_length_mean",
                "groups_dropped", "prompts_drawn", "loss", "train_version", "gen_engine_steps"):
        assert key in row, key
    assert [s for s, _ in rows.steps] == [1, 2, 3, 4]
    # Every trained group was drawn before its step's row was taken: no draw escapes the rows.
    assert sum(row["prompts_drawn"] for _, row in rows.steps) >= 4 * 2
    assert rows.steps[0][1]["prompts_drawn"] > 0 and rows.steps[0][1]["gen_tokens"] > 0


def test_generator_thread_failure_surfaces() -> None:
    cfg = make_config("pipeline", 2, 2, steps=4)

    def bad_encode(record: object) -> list[int]:
        raise ValueError("prompt too long")

    comps, _ = build(cfg)
    comps.encode = bad_encode
    with pytest.raises(RuntimeError, match="generator thread failed"):
        Driver(driver_settings(cfg), comps).run()
