"""The pipeline simulator: closed-form runs, the lag bound under random speeds, conservation."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from scalerl.pipeline.simulate import SimConfig, Simulation, simulate
from scalerl.pipeline.staleness import StalenessError
from scalerl.rollout.emulated import LengthModel

CONSTANT = LengthModel(median=10.0, prompt_sigma=0.0, sample_sigma=0.0)
A, B_TOK = 0.01, 0.001  # decode step: a + b x in flight


def small(**kwargs: Any) -> SimConfig:
    base: dict[str, Any] = {
        "num_engines": 2, "slots": 8, "prompts_per_step": 4, "n": 3, "max_new_tokens": 100,
        "length": CONSTANT, "decode_step_s": A, "decode_token_s": B_TOK,
        "train_step_s": 0.2, "train_token_s": 0.001, "weight_transfer_s": 0.0, "weight_update_s": 0.0,
        "steps": 5,
    }
    base.update(kwargs)
    return SimConfig(**base)


def test_sync_closed_form() -> None:
    # 4 groups of 3 on 2 engines: 6 sequences each, all in flight, all 10 tokens long.
    r = simulate(small(mode="sync", k=1))
    gen = 10 * (A + 6 * B_TOK)
    train = 0.2 + 0.001 * 12 * 10
    assert r.seconds == pytest.approx(5 * (gen + train))
    assert r.samples_per_s == pytest.approx(12 / (gen + train))
    assert r.generator_idle_frac == pytest.approx(train / (gen + train))
    assert r.trainer_idle_frac == pytest.approx(gen / (gen + train))
    assert r.occupancy == pytest.approx(6 / 8 * gen / (gen + train))
    assert r.sample_lags == Counter({0: 60}) and r.token_lags == Counter({0: 600})
    assert r.tokens == 600 and r.truncated == 0


def test_sync_with_weight_transfers_and_loads() -> None:
    # Every round after the first waits for the weights (0.03 s) and loads them (0.05 s).
    r = simulate(small(mode="sync", k=1, weight_transfer_s=0.03, weight_update_s=0.05))
    gen, train = 10 * (A + 6 * B_TOK), 0.2 + 0.001 * 120
    assert r.seconds == pytest.approx(5 * (gen + train) + 4 * (0.03 + 0.05))
    assert r.update_frac == pytest.approx(4 * 0.05 / r.seconds)
    assert r.generator_idle_frac == pytest.approx(1 - (5 * gen + 4 * 0.05) / r.seconds)


def test_ppo_offpolicy_closed_form() -> None:
    # k=3 rounds: 3 x 2 groups of 2 = 12 sequences, 6 per engine; then 3 steps while engines idle.
    cfg = small(mode="ppo_offpolicy", k=3, steps=6, prompts_per_step=2, n=2)
    r = simulate(cfg)
    gen, train = 10 * (A + 6 * B_TOK), 0.2 + 0.001 * 4 * 10
    assert r.seconds == pytest.approx(2 * (gen + 3 * train))
    assert r.generator_idle_frac == pytest.approx(3 * train / (gen + 3 * train))
    # Mini-batch j of a round is trained j versions after the round's weights.
    assert r.sample_lags == Counter({0: 8, 1: 8, 2: 8})
    assert r.token_lags == Counter({0: 80, 1: 80, 2: 80})


def test_pipeline_trainer_bound_closed_form() -> None:
    # The trainer is the bottleneck (a 10-token batch takes 0.12 s, a step 0.5 s): after the first
    # batch it never waits, and every later group is admitted at version v, trained at v + 1.
    cfg = small(mode="pipeline", k=1, steps=6, prompts_per_step=2, n=2, slots=16, train_step_s=0.5,
                train_token_s=0.0)
    r = simulate(cfg)
    first = 10 * (A + 4 * B_TOK)  # 4 groups admitted at t=0: 4 sequences per engine
    assert r.seconds == pytest.approx(first + 6 * 0.5)
    assert r.trainer_idle_frac == pytest.approx(first / r.seconds)
    assert r.sample_lags == Counter({0: 4, 1: 20})
    assert r.token_lags == Counter({0: 40, 1: 200})


def test_pipeline_generation_bound_closed_form() -> None:
    # No training time: the slots never empty (admission keeps work waiting), one batch per 10 steps.
    cfg = small(mode="pipeline", k=2, steps=7, slots=6, train_step_s=0.0, train_token_s=0.0)
    r = simulate(cfg)
    dt = A + 6 * B_TOK
    assert r.seconds == pytest.approx(7 * 10 * dt)
    assert r.generator_idle_frac == pytest.approx(0.0, abs=1e-9)
    assert r.occupancy == pytest.approx(1.0)
    assert r.samples_per_s == pytest.approx(12 / (10 * dt))


def _random_config(rng: random.Random, mode: str) -> SimConfig:
    k = rng.choice([1, 2, 3, 5])
    engines = rng.randint(1, 5)
    return SimConfig(
        mode=mode,  # type: ignore[arg-type]
        k=k,
        steps=k * rng.randint(2, 6),
        prompts_per_step=rng.randint(1, 6),
        n=rng.randint(1, 5),
        num_engines=engines,
        slots=rng.randint(1, 12),
        max_new_tokens=rng.choice([20, 60, 200]),
        length=LengthModel(rng.uniform(5, 40), rng.uniform(0, 1), rng.uniform(0, 1.2)),
        decode_step_s=rng.uniform(0.001, 0.02),
        decode_token_s=rng.uniform(0, 0.002),
        train_step_s=rng.uniform(0, 0.5),
        train_token_s=rng.uniform(0, 0.001),
        weight_transfer_s=rng.uniform(0, 0.1),
        weight_update_s=rng.uniform(0, 0.05),
        slowdowns=tuple(rng.choice([1.0, 1.0, 0.5, 3.0, 10.0]) for _ in range(engines)),
        placement=rng.choice(["group", "sample"]),
        seed=rng.randint(0, 10_000),
    )


class _Recording(Simulation):
    """Keeps each trained sample's (sample lag, token lags); checks the proof's premise."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.per_sample: list[tuple[int, list[int]]] = []
        self.versions_by_group: dict[int, list[tuple[int, int]]] = {}

    def _take_batch(self) -> list[Any]:
        batch = super()._take_batch()
        for group in batch:
            for s in group.samples:
                # staleness.py's premise: a sample starts at a version >= its group's admission's.
                assert s.start_version >= group.admit_version
                lags = [self.trainer_version - v for v, count in s.token_versions for _ in range(count)]
                self.per_sample.append((self.trainer_version - s.start_version, lags))
                self.versions_by_group[group.gid] = s.token_versions
        return batch


def test_in_flight_update_lands_at_the_next_step_boundary() -> None:
    # One engine, one sample per group, B=1, k=1: groups 0 and 1 start at t=0. Group 0 (L0 tokens)
    # is trained at once (1 ms); its weights arrive in the middle of step L0 + 1, so group 1's
    # tokens are version 0 for steps 1..L0+1 and version 1 for the remaining L1 - L0 - 1.
    lengths = LengthModel(40.0, 0.0, 0.8)

    def first_two(seed: int) -> list[int]:  # group g of run `seed` is seeded (seed << 32) + g
        return [lengths.draw((seed << 32) + g, 1)[0] for g in (0, 1)]

    seed = next(s for s in range(100) if first_two(s)[0] + 2 < first_two(s)[1])
    l0, l1 = first_two(seed)
    cfg = small(mode="pipeline", k=1, steps=2, num_engines=1, slots=4, prompts_per_step=1, n=1,
                length=lengths, decode_token_s=0.0, train_step_s=0.001, train_token_s=0.0,
                max_new_tokens=10_000, seed=seed)
    sim = _Recording(cfg)
    r = sim.run()
    assert sim.versions_by_group == {0: [(0, l0)], 1: [(0, l0 + 1), (1, l1 - l0 - 1)]}
    assert r.sample_lags == Counter({0: 1, 1: 1})
    assert r.seconds == pytest.approx(l1 * A + 0.001)


@pytest.mark.parametrize("seed", range(12))
def test_lag_bound_and_conservation_under_random_speeds(seed: int) -> None:
    rng = random.Random(seed)
    for mode in ("pipeline", "ppo_offpolicy", "sync"):
        cfg = _random_config(rng, mode)
        sim = _Recording(cfg)
        r = sim.run()
        assert r.steps == cfg.steps
        assert max(r.sample_lags) <= cfg.max_lag and max(r.token_lags) <= cfg.max_lag
        assert r.max_observed_lag <= cfg.max_lag
        # Every trained sample counted once, every token once; every admitted group is consumed
        # or still outstanding (generating or queued) at the end.
        assert r.samples == sum(r.sample_lags.values()) == cfg.steps * cfg.prompts_per_step * cfg.n
        assert r.tokens == sum(r.token_lags.values())
        assert r.groups_consumed == cfg.steps * cfg.prompts_per_step
        assert r.groups_admitted == r.groups_consumed + r.groups_outstanding
        generating = {x.group.gid for e in sim.engines for x in [*e.waiting, *e.inbox]}
        generating |= {x.group.gid for e in sim.engines for _, _, x in e.active}
        queued = {g.gid for g in sim.queue}
        assert not generating & queued
        assert r.groups_outstanding == len(generating) + len(queued)
        assert 0 <= r.generator_idle_frac <= 1 and 0 <= r.trainer_idle_frac <= 1
        for sample_lag, token_lags in sim.per_sample:
            # Tokens are never older than their sample's start; round modes never update in flight.
            assert all(0 <= t <= sample_lag for t in token_lags)
            if mode != "pipeline":
                assert set(token_lags) == {sample_lag}


def test_the_controller_is_what_holds_the_bound() -> None:
    # Admitting past the controller's capacity is refused by the controller itself.
    class Greedy(Simulation):
        def _admit(self) -> None:
            self.controller.admit(self.engine_version, self.controller.capacity(self.engine_version) + 1)

    with pytest.raises(StalenessError, match="exceeds the capacity"):
        Greedy(small(mode="pipeline", k=2)).run()


def test_modes_rank_as_in_the_paper_with_long_tails() -> None:
    # Long-tailed lengths, a trainer as fast as generation: pipeline > ppo_offpolicy > sync in
    # samples/s at the same k, and the pipeline's generators idle least.
    base = small(num_engines=4, slots=16, prompts_per_step=4, n=4, steps=16, max_new_tokens=400,
                 length=LengthModel(60.0, 0.5, 0.6), train_step_s=0.2, train_token_s=2e-4,
                 weight_update_s=0.01)
    sync = simulate(replace(base, mode="sync", k=1))
    ppo = simulate(replace(base, mode="ppo_offpolicy", k=4))
    pipe = simulate(replace(base, mode="pipeline", k=4))
    assert pipe.samples_per_s > ppo.samples_per_s > sync.samples_per_s
    assert pipe.generator_idle_frac < ppo.generator_idle_frac < sync.generator_idle_frac
    assert simulate(replace(base, mode="pipeline", k=4)) == pipe  # deterministic


def test_bad_configs_name_the_field() -> None:
    with pytest.raises(ValueError, match="mode"):
        SimConfig(mode="async")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of k=8"):
        SimConfig(mode="ppo_offpolicy", k=8, steps=12)
    with pytest.raises(ValueError, match="slowdowns: 2 values for 64 engines"):
        SimConfig(slowdowns=(1.0, 2.0))
    with pytest.raises(ValueError, match="slots"):
        SimConfig(slots=0)


@pytest.mark.parametrize("seed", range(12))
def test_deadline_admission_keeps_the_bound_under_random_lengths_and_speeds(seed: int) -> None:
    """The property test of the deadline rule (`SimConfig.admission`): random long-tailed lengths,
    engine speeds (one up to 10x slower), placements and trainer times; every trained sample and
    token within k of its start (checked here, by the simulator and by the controller), every
    group counted once."""
    rng = random.Random(1000 + seed)
    cfg = replace(_random_config(rng, "pipeline"), admission="deadline")
    sim = _Recording(cfg)
    r = sim.run()
    assert r.steps == cfg.steps
    lags = [sample_lag for sample_lag, _ in sim.per_sample]
    assert len(lags) == cfg.steps * cfg.prompts_per_step * cfg.n and max(lags) <= cfg.k
    assert all(0 <= t <= s for s, tokens in sim.per_sample for t in tokens)
    assert max(r.sample_lags) <= cfg.k and r.max_observed_lag <= cfg.k
    assert r.groups_admitted == r.groups_consumed + r.groups_outstanding
    assert 0 <= r.generator_idle_frac <= 1 and 0 <= r.trainer_idle_frac <= 1


def test_deadline_admission_keeps_generators_busier_under_a_long_tail() -> None:
    """Long tail, several engines: the deadline rule idles the generators less and trains more
    samples per second than the bounded rule, at the same bound."""
    base = small(mode="pipeline", k=4, num_engines=4, slots=16, prompts_per_step=4, n=4, steps=24,
                 max_new_tokens=400, length=LengthModel(60.0, 0.5, 0.6), train_step_s=0.2,
                 train_token_s=2e-4, weight_update_s=0.01)
    bounded = simulate(base)
    deadline = simulate(replace(base, admission="deadline"))
    assert deadline.generator_idle_frac < bounded.generator_idle_frac
    assert deadline.samples_per_s > bounded.samples_per_s
    assert max(deadline.sample_lags) <= 4 and max(bounded.sample_lags) <= 4
    assert deadline.groups_admitted > bounded.groups_admitted


class _RecordingGroups(Simulation):
    """Keeps each trained group's (trainer version, last admission version, newest token version)."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.per_group: list[tuple[int, int, int]] = []

    def _take_batch(self) -> list[Any]:
        batch = super()._take_batch()
        for group in batch:
            newest = max(v for s in group.samples for v, _ in s.token_versions)
            self.per_group.append((self.trainer_version, group.admit_version, newest))
        return batch


@pytest.mark.parametrize("seed", range(12))
def test_partial_rollouts_bound_the_newest_segment_under_random_lengths_and_speeds(seed: int) -> None:
    """The property test of `admission="partial"` on the random settings of the deadline test:
    every trained group within k of its last admission (by the test's arithmetic, the simulator's
    and the controller's), and so its newest token too (a re-admitted group was still generating:
    its later tokens carry a version >= the one it was re-admitted at); every group counted once."""
    rng = random.Random(1000 + seed)
    cfg = replace(_random_config(rng, "pipeline"), admission="partial")
    sim = _RecordingGroups(cfg)
    r = sim.run()
    assert r.steps == cfg.steps and len(sim.per_group) == cfg.steps * cfg.prompts_per_step
    for u, admitted, newest in sim.per_group:
        assert u - admitted <= cfg.k
        assert newest >= admitted and u - newest <= cfg.k
    assert r.max_observed_lag <= cfg.k and r.groups_renewed == sim.controller.renewed
    assert r.groups_admitted == r.groups_consumed + r.groups_outstanding
    assert sum(r.token_lags.values()) == r.tokens


def test_the_partial_property_settings_do_renew() -> None:
    """The property test above checks renewals only where they happen: most of its settings must
    renew groups, or it would only repeat the deadline rule's test."""
    renewing = [simulate(replace(_random_config(random.Random(1000 + seed), "pipeline"),
                                 admission="partial")).groups_renewed > 0 for seed in range(12)]
    assert sum(renewing) >= 6


def test_partial_rollouts_stop_the_trainer_waiting_at_deadlines() -> None:
    """Long tail, 4 engines, a trainer fast next to generation (the emulated Ray pool's regime):
    the deadline rule's trainer waits for each long group at its deadline; re-admitting those
    groups instead trains more samples per second. The price shows: tokens trained more than k
    versions after they were generated, which the deadline rule never has."""
    base = small(mode="pipeline", k=4, num_engines=4, slots=16, prompts_per_step=8, n=4, steps=48,
                 max_new_tokens=96, length=LengthModel(24.0, 0.5, 0.6), decode_step_s=0.004,
                 decode_token_s=0.0001, train_step_s=0.005, train_token_s=1e-5, weight_update_s=0.002,
                 admission="deadline")
    deadline = simulate(base)
    partial = simulate(replace(base, admission="partial"))
    assert partial.samples_per_s > 1.1 * deadline.samples_per_s
    assert partial.groups_renewed > 0 and deadline.groups_renewed == 0
    assert deadline.stale_token_frac() == 0.0 < partial.stale_token_frac()
    assert max(deadline.token_lags) <= 4 < max(partial.token_lags)


def test_deadline_admission_is_a_pipeline_rule() -> None:
    for rule in ("deadline", "partial"):
        with pytest.raises(ValueError, match="admission"):
            SimConfig(mode="ppo_offpolicy", admission=rule)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="admission"):
        SimConfig(admission="later")  # type: ignore[arg-type]
