"""Recipe comparison: margins, who is ahead, crossovers, fixed-A refit, efficiency transform."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from scalerl.scaling import (
    bootstrap,
    compare,
    crossovers,
    efficiency_slope,
    efficiency_transform,
    fit_sigmoid,
    fixed_A_refit,
    recipe_name,
    sigmoid_reward,
)
from scalerl.scaling.compare import make_recipe, standing_at

# The ``synthetic`` fixture (conftest.py): ``make(A, B, C_mid, R0, ...) -> (compute, reward)``.
SyntheticCurve = Callable[..., tuple[np.ndarray, np.ndarray]]


@pytest.mark.parametrize(
    ("label", "recipe"),
    [
        ("scalerl-bs512-seed2", "scalerl-bs512"),
        ("cispo_s3", "cispo"),
        ("dapo.seed=1", "dapo"),
        ("Run-SEED10", "Run"),
        ("scalerl-8gen", "scalerl-8gen"),
        ("v2s2", "v2s2"),
        ("seed1", "seed1"),
    ],
)
def test_recipe_name_strips_only_a_trailing_seed_tag(label: str, recipe: str) -> None:
    assert recipe_name(label) == recipe


def test_crossover_of_slow_high_and_fast_low_recipes(synthetic: SyntheticCurve) -> None:
    """Paper Fig. 13b: the slower recipe with the higher asymptote overtakes the faster one."""
    slow = fit_sigmoid(*synthetic(A=0.66, B=1.6, C_mid=12000, seed=1), r0=0.4)
    fast = fit_sigmoid(*synthetic(A=0.60, B=2.0, C_mid=3000, seed=2), r0=0.4)
    roots = crossovers(slow, fast, 100.0, 1e7)
    assert len(roots) == 1
    (x,) = roots
    assert slow.predict(x) == pytest.approx(fast.predict(x), abs=1e-9)
    # The truth crosses where the two true curves meet; the fitted crossover is close to it.
    true = crossovers(_Curve(0.66, 1.6, 12000), _Curve(0.60, 2.0, 3000), 100.0, 1e7)
    assert x == pytest.approx(true[0], rel=0.15)
    early, late = standing_at([_recipe("slow", slow), _recipe("fast", fast)], x / 3), None
    late = standing_at([_recipe("slow", slow), _recipe("fast", fast)], x * 3)
    assert early.leader == "fast" and late.leader == "slow"
    with pytest.raises(ValueError):
        crossovers(slow, fast, 10.0, 1.0)


class _Curve:
    """A bare sigmoid with ``predict`` (R0 = 0.4), for checking crossovers of true curves."""

    def __init__(self, A: float, B: float, C_mid: float) -> None:
        self.A, self.B, self.C_mid = A, B, C_mid

    def predict(self, c: np.ndarray) -> np.ndarray:
        return sigmoid_reward(c, self.A, self.B, self.C_mid, 0.4)


def _recipe(name: str, fit: object) -> object:
    return make_recipe(name, {name: fit})  # type: ignore[dict-item]


def test_compare_groups_seeds_and_applies_margins(synthetic: SyntheticCurve) -> None:
    fits, boots = {}, {}
    for s in range(3):
        fits[f"hi-seed{s}"] = fit_sigmoid(*synthetic(A=0.65, B=1.8, C_mid=5000, seed=10 + s), r0=0.4)
        fits[f"lo-seed{s}"] = fit_sigmoid(*synthetic(A=0.60, B=1.8, C_mid=5000, seed=20 + s), r0=0.4)
        fits[f"twin-seed{s}"] = fit_sigmoid(*synthetic(A=0.65, B=1.8, C_mid=5000, seed=30 + s), r0=0.4)
    for label, f in fits.items():
        boots[label] = bootstrap(f, n_boot=200, seed=0)
    cmp = compare(fits, boots, at=(50000.0,))
    names = [r.name for r in cmp.recipes]
    assert names == ["hi", "lo", "twin"]
    assert all(len(r.fits) == 3 for r in cmp.recipes)
    verdicts = {(p.a, p.b): p for p in cmp.pairs}
    assert verdicts[("hi", "lo")].A_differs and verdicts[("hi", "lo")].A_diff > 0
    assert not verdicts[("hi", "twin")].A_differs
    assert not verdicts[("hi", "twin")].B_differs
    hi = cmp.recipes[0]
    assert hi.A_margin >= hi.spread.A_margin and hi.A_margin > 0
    assert verdicts[("hi", "lo")].A_margin == pytest.approx(math.hypot(hi.A_margin, cmp.recipes[1].A_margin))
    standing = cmp.standings[0]
    assert standing.leader in ("hi", "twin") and standing.ranking[-1][0] == "lo"
    assert standing.p_ahead is not None and 0.0 <= standing.p_ahead <= 1.0
    # A user floor on the margin (the paper's 0.02) can only make verdicts more cautious.
    strict = compare(fits, boots, margin_A=0.2, refit_fixed_A=False)
    assert not any(p.A_differs for p in strict.pairs)
    assert strict.A_fixed_refit is None


def test_explicit_recipes_override_label_grouping(synthetic: SyntheticCurve) -> None:
    fits = {
        "alpha": fit_sigmoid(*synthetic(seed=50), r0=0.4),
        "beta": fit_sigmoid(*synthetic(seed=51), r0=0.4),
        "gamma-seed1": fit_sigmoid(*synthetic(A=0.58, seed=52), r0=0.4),
    }
    cmp = compare(fits, recipes={"alpha": "base", "beta": "base"}, refit_fixed_A=False)
    assert [(r.name, r.labels) for r in cmp.recipes] == [
        ("base", ("alpha", "beta")),
        ("gamma", ("gamma-seed1",)),
    ]
    ((a, b),) = [(p.a, p.b) for p in cmp.pairs]
    assert (a, b) == ("base", "gamma")
    alone = compare(fits, recipes={"alpha": "base", "beta": "base"}, group_seeds=False, refit_fixed_A=False)
    assert len(alone.pairs) == 3
    assert [r.name for r in alone.recipes] == ["alpha", "beta", "gamma-seed1"]


def test_fixed_A_refit_moves_the_difference_into_B(synthetic: SyntheticCurve) -> None:
    """Same A, different efficiency: with A fixed to the mean, B ranks the recipes correctly."""
    steep = fit_sigmoid(*synthetic(A=0.62, B=2.4, C_mid=5000, seed=40), r0=0.4)
    shallow = fit_sigmoid(*synthetic(A=0.62, B=1.4, C_mid=5000, seed=41), r0=0.4)
    refit = fixed_A_refit({"steep": steep, "shallow": shallow})
    assert pytest.approx((steep.A + shallow.A) / 2) == refit.A
    assert all(f.A == refit.A and f.A_fixed for f in refit.fits.values())
    assert refit.fits["steep"].B > refit.fits["shallow"].B
    assert pytest.approx(2.4, abs=0.2) == refit.fits["steep"].B
    np.testing.assert_array_equal(refit.fits["steep"].in_fit, steep.in_fit)
    with pytest.raises(ValueError, match="not above its R0"):
        fixed_A_refit({"steep": steep}, A=0.3)


def test_efficiency_transform_is_C_to_the_B_on_the_curve() -> None:
    A, B, C_mid, R0 = 0.62, 1.8, 5000.0, 0.4
    c = np.geomspace(100, 1e6, 30)
    F = efficiency_transform(sigmoid_reward(c, A, B, C_mid, R0), A, B, C_mid, R0)
    np.testing.assert_allclose(F, c**B, rtol=1e-6)
    slope = np.polyfit(np.log(c), np.log(F), 1)[0]
    assert slope == pytest.approx(B, rel=1e-6)
    out = efficiency_transform(np.array([0.3, 0.4, 0.62, 0.7]), A, B, C_mid, R0)
    assert np.isnan(out).all()  # outside R0 < R < A


def test_efficiency_slope_of_a_fit_estimates_B(synthetic: SyntheticCurve) -> None:
    fit = fit_sigmoid(*synthetic(A=0.62, B=1.8, C_mid=5000, noise=0.002, c_max=20000, seed=3), r0=0.4)
    assert efficiency_slope(fit) == pytest.approx(fit.B, rel=0.1)


def test_compare_needs_runs() -> None:
    with pytest.raises(ValueError):
        compare({})


def test_replicate_crossovers_interpolate_in_log_space_and_ignore_parallel_pairs() -> None:
    """A sign change between grid points i and i+1 is interpolated geometrically; pairs that never
    cross give NaN, and their (meaningless) interpolation weight must not overflow."""
    from scalerl.scaling.compare import _replicate_crossovers

    grid = np.array([1.0, 10.0, 100.0, 1000.0])
    crossing = np.array([[0.1, 0.2, 0.4, 0.5]])
    other = np.array([[0.3, 0.3, 0.3, 0.3]])
    # Nearly parallel, never crossing: d0 / (d0 - d1) is about 2e15.
    near = np.array([[0.5, np.nextafter(0.5, 0.0), np.nextafter(0.5, 0.0), 0.4]])
    with np.errstate(over="raise", invalid="raise"):
        (x,) = _replicate_crossovers(crossing, other, grid, seed=0)
        (never,) = _replicate_crossovers(near, other, grid, seed=0)
    # Crossing between 10 (diff -0.1) and 100 (diff +0.1): halfway in log space.
    assert x == pytest.approx(math.sqrt(10.0 * 100.0))
    assert math.isnan(never)


def test_a_lead_under_the_paper_accuracy_is_said_to_decide_nothing(synthetic: SyntheticCurve) -> None:
    """`scalerl compare --at C`: where the predicted lead is under LEAD_MARGIN (0.02, the paper's
    accuracy on extrapolated points) the standing says so, whatever P(ahead); where the lead is
    larger it does not."""
    from scalerl.scaling.compare import LEAD_MARGIN

    a = fit_sigmoid(*synthetic(A=0.66, B=1.6, C_mid=3000, seed=1), r0=0.4)
    near = fit_sigmoid(*synthetic(A=0.65, B=1.6, C_mid=3000, seed=2), r0=0.4)
    far = fit_sigmoid(*synthetic(A=0.55, B=1.6, C_mid=3000, seed=3), r0=0.4)
    c = 3e4
    close = standing_at([_recipe("a", a), _recipe("near", near)], c)
    lead = close.ranking[0][1] - close.ranking[1][1]  # the predicted rewards, best first
    assert close.lead == lead and 0 < lead < LEAD_MARGIN == 0.02
    assert any(s.endswith("not a decision") and f"by {lead:.3f}" in s for s in close.caveats)
    clear = standing_at([_recipe("a", a), _recipe("far", far)], c)
    assert clear.ranking[0][1] - clear.ranking[1][1] > LEAD_MARGIN
    assert not any("not a decision" in s for s in clear.caveats)
