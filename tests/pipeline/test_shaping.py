"""Length shaping changes the training reward only, never the verdicts or the keep/drop decision."""

from __future__ import annotations

import pytest

from scalerl.assembly.sections import driver_settings
from scalerl.pipeline import Driver
from scalerl.pipeline.shaping import LengthShaping

from .fakes import FakeEngine, FakeTrainer
from .test_modes import build, make_config


def test_overlong_penalty_on_correct_samples_only() -> None:
    s = LengthShaping("overlong_penalty", max_new_tokens=20, cache_length=10, kimi_coef=0.1,
                      correct_threshold=0.5)
    # lengths 5 (no penalty), 15 (half way: -0.5), 20 (at the limit: -1); the wrong one unchanged.
    assert s.shape([1.0, 1.0, 1.0, 0.0], [5, 15, 20, 20]) == pytest.approx([1.0, 0.5, 0.0, 0.0])


def test_kimi_is_relative_to_the_group() -> None:
    s = LengthShaping("kimi", max_new_tokens=20, cache_length=10, kimi_coef=1.0, correct_threshold=0.5)
    # lambda = 0.5 - (len - min) / (max - min): shortest correct +0.5, longest -0.5 (wrong: min(0, .)).
    assert s.shape([1.0, 1.0, 0.0], [4, 8, 12]) == pytest.approx([1.5, 1.0, -0.5])


@pytest.mark.parametrize("kind", ["none", "interruption"])
def test_no_shaping_kinds(kind: str) -> None:
    s = LengthShaping(kind, max_new_tokens=20, cache_length=10, kimi_coef=1.0, correct_threshold=0.5)
    assert not s.active and s.shape([1.0, 0.0], [20, 20]) == [1.0, 0.0]


def test_driver_shapes_training_rewards_but_keeps_verdicts() -> None:
    cfg = make_config("sync", 1, 4, steps=4)
    cfg.generation.max_new_tokens = 24
    cfg.generation.length_control.kind = "overlong_penalty"
    cfg.generation.length_control.overlong_cache = 12
    engine = FakeEngine(max_len=24, long_tail=0.5)
    trainer = FakeTrainer(engine)
    comps, _ = build(cfg, engine=engine, trainer=trainer)
    comps.params = comps.params.__class__(n=cfg.generation.n, max_new_tokens=24)
    Driver(driver_settings(cfg), comps).run()
    shaped = 0
    for _, groups in trainer.batches:
        for g in groups:
            for c, r, ok in zip(g.completions, g.rewards, g.is_correct, strict=True):
                expected = (1.0 + min(0.0, (24 - c.num_tokens) / 12 - 1.0)) if ok else 0.0
                assert r == pytest.approx(expected)
                shaped += ok and c.num_tokens > 12
    assert shaped > 0


def test_kimi_length_reward_warms_up_over_the_trainers_steps() -> None:
    """Kimi k1.5 §2.3.3: no length reward for the first steps, then the constant weight."""
    version = [0]
    s = LengthShaping("kimi", max_new_tokens=20, cache_length=10, kimi_coef=1.0, correct_threshold=0.5,
                      kimi_warmup_steps=3, version=lambda: version[0])
    assert s.shape([1.0, 1.0, 0.0], [4, 8, 12]) == [1.0, 1.0, 0.0]
    version[0] = 3
    assert s.shape([1.0, 1.0, 0.0], [4, 8, 12]) == pytest.approx([1.5, 1.0, -0.5])
    ramp = LengthShaping("kimi", max_new_tokens=20, cache_length=10, kimi_coef=1.0, correct_threshold=0.5,
                         kimi_ramp_steps=2, version=lambda: 0)
    assert ramp.shape([1.0, 1.0, 0.0], [4, 8, 12]) == pytest.approx([1.25, 1.0, -0.25])
    with pytest.raises(ValueError, match="kimi_warmup_steps: a warm-up needs version"):
        LengthShaping("kimi", max_new_tokens=20, cache_length=10, kimi_coef=1.0, correct_threshold=0.5,
                      kimi_warmup_steps=3)


def test_the_driver_warms_the_kimi_reward_up_over_the_trainers_steps() -> None:
    # sync mode: each step's groups are generated (and shaped) at the version they are trained at.
    cfg = make_config("sync", 1, 4, steps=4)
    cfg.generation.length_control.kind = "kimi"
    cfg.generation.length_control.kimi_coef = 1.0
    cfg.generation.length_control.kimi_warmup_steps = 2
    engine = FakeEngine(max_len=24, long_tail=0.5)
    trainer = FakeTrainer(engine)
    comps, _ = build(cfg, engine=engine, trainer=trainer)
    Driver(driver_settings(cfg), comps).run()
    shaped_at = set()
    for version, groups in trainer.batches:
        for g in groups:
            verdicts = [1.0 if ok else 0.0 for ok in g.is_correct]
            if g.rewards != verdicts:
                shaped_at.add(version)
    assert shaped_at and min(shaped_at) >= 2
