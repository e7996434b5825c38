"""The collapse detector (`scalerl.pipeline.collapse`) against thresholds worked out by hand."""

from __future__ import annotations

import math

import pytest

from scalerl.config import RollbackConfig
from scalerl.pipeline.collapse import CollapseDetector, pass_rate_band


def test_band_is_z_standard_errors_of_a_difference_of_two_mean_at_k() -> None:
    # best 0.5, P = 8 prompts, k = 2, z = 2: 2 * sqrt(2 * 0.25 / 16) = 2 * sqrt(1/32) = 0.35355...
    assert pass_rate_band(0.5, 8, 2, 2.0) == pytest.approx(0.3535533906, rel=1e-9)
    # best 0.9, P = 100, k = 4, z = 3: 3 * sqrt(2 * 0.09 / 400) = 3 * 0.0212132 = 0.0636396
    assert pass_rate_band(0.9, 100, 4, 3.0) == pytest.approx(0.0636396103, rel=1e-9)
    assert pass_rate_band(1.0, 8, 2, 2.0) == 0.0
    with pytest.raises(ValueError, match="prompts=0"):
        pass_rate_band(0.5, 0, 2, 2.0)


def _detector(**rule: object) -> CollapseDetector:
    return CollapseDetector(RollbackConfig(enabled=True, **rule), heldout_prompts=8, k=2)


def test_pass_rate_fires_just_outside_the_band_and_not_inside() -> None:
    band = 2.0 * math.sqrt(2 * 0.5 * 0.5 / (8 * 2))  # 0.35355
    inside = _detector(pass_drop_se=2.0)
    assert inside.observe_eval(0, {"val_pass_rate": 0.5}) is None
    assert inside.observe_eval(2, {"val_pass_rate": 0.5 - band + 0.01}) is None
    assert not inside.trouble
    outside = _detector(pass_drop_se=2.0)
    outside.observe_eval(0, {"val_pass_rate": 0.5})
    trig = outside.observe_eval(2, {"val_pass_rate": 0.5 - band - 0.01})
    assert trig is not None and trig.kind == "pass_rate" and trig.step == 2
    # The best is the running maximum: a rise moves it, and the band is taken at the new best.
    rising = _detector(pass_drop_se=2.0)
    for step, v in enumerate((0.25, 0.5, 0.5)):
        assert rising.observe_eval(step, {"val_pass_rate": v}) is None
    assert rising.best == 0.5
    assert _detector(pass_drop_se=None).observe_eval(0, {"val_pass_rate": 0.0}) is None


def test_nonfinite_steps_in_a_row_fire_and_a_good_step_resets_the_count() -> None:
    det = _detector(nonfinite_steps=3)
    for step, bad in enumerate((1, 1, 0, 1, 1), start=1):
        assert det.observe_step(step, {"skipped_nonfinite": float(bad)}) is None
    trig = det.observe_step(6, {"skipped_nonfinite": 1.0})
    assert trig is not None and trig.kind == "nonfinite" and trig.step == 6


def test_truncation_and_entropy_excursions() -> None:
    det = _detector(truncation_rate=0.5, entropy_max=3.0, nonfinite_steps=None)
    assert det.observe_step(1, {"truncation_rate": 0.5, "entropy": 3.0}) is None  # at the limit: not above
    assert det.observe_step(2, {"truncation_rate": 0.75}).kind == "truncation"
    assert det.observe_step(3, {"truncation_rate": 0.1, "entropy": 3.5}).kind == "entropy"
    assert _detector().observe_step(1, {"truncation_rate": 1.0, "entropy": 99.0}) is None  # off by default


def test_a_checkpoint_is_stable_only_without_trouble_and_the_state_round_trips() -> None:
    det = _detector(nonfinite_steps=3)
    det.observe_step(1, {"skipped_nonfinite": 0.0})
    det.mark_checkpoint(2)
    det.observe_step(3, {"skipped_nonfinite": 1.0})  # one bad step: short of a trigger, still trouble
    det.mark_checkpoint(4)
    det.observe_step(5, {"skipped_nonfinite": 0.0})
    det.mark_checkpoint(6)
    assert det.stable_steps == [2, 6]
    det.observe_eval(6, {"val_pass_rate": 0.75})
    again = _detector(nonfinite_steps=3)
    again.load_state_dict(det.state_dict())
    assert again.stable_steps == [2, 6] and again.best == 0.75 and again.nonfinite_run == 0


class _Evals:
    """An evaluator whose pass rates are scripted: 0.5, 0.5, then 0.0 (a collapse)."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def run(self, generate: object) -> dict[str, float]:
        return {"val_pass_rate": self.values.pop(0)}


def test_the_driver_stops_on_a_pass_rate_collapse_without_saving_the_diverged_weights() -> None:
    from scalerl.assembly.sections import driver_settings
    from scalerl.pipeline import Driver

    from .fakes import FakeEngine, FakeSource, FakeTrainer
    from .test_modes import build, make_config

    cfg = make_config("sync", 2, 2, steps=8)
    cfg.eval.every, cfg.eval.at_start, cfg.checkpoint.every = 2, True, 2
    engine = FakeEngine(max_batch_size=8)
    comps, rows = build(cfg, engine=engine, trainer=FakeTrainer(engine), source=FakeSource())
    saved: list[int] = []
    comps.checkpoint = lambda step, state, **_: saved.append(step)
    comps.evaluator = _Evals([0.5, 0.5, 0.0, 0.5, 0.5, 0.5])
    # P 8, k 2, z 2: band 0.354 at best 0.5; 0.0 at step 4 is outside it.
    comps.collapse = CollapseDetector(RollbackConfig(enabled=True, pass_drop_se=2.0), heldout_prompts=8, k=2)
    result = Driver(driver_settings(cfg), comps).run()
    assert result.stop_reason == "rollback" and result.steps == 4
    assert result.rollback is not None and result.rollback.kind == "pass_rate" and result.rollback.step == 4
    assert saved == [2] and result.stable_steps == [2]  # step 4's weights are never written
    assert [s for s, _ in rows.steps] == [1, 2, 3, 4]
    assert all(row["rollbacks"] == 0.0 for _, row in rows.steps)
