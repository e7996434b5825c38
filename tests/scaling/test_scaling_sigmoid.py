"""fit_sigmoid: recovery of known parameters, conventions, windows, and bad input."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest

from scalerl.scaling import fit_sigmoid
from scalerl.scaling.diagnostics import rises
from scalerl.scaling.forms import sigmoid_reward

# The ``synthetic`` fixture (conftest.py): ``make(A, B, C_mid, R0, ...) -> (compute, reward)``.
SyntheticCurve = Callable[..., tuple[np.ndarray, np.ndarray]]


@pytest.mark.parametrize("seed", range(5))
def test_recovers_known_parameters_when_data_runs_past_C_mid(synthetic: SyntheticCurve, seed: int) -> None:
    c, y = synthetic(A=0.62, B=1.8, C_mid=5000, R0=0.4, c_max=50000, n=60, noise=0.005, seed=seed)
    fit = fit_sigmoid(c, y, r0=0.4)
    assert abs(fit.A - 0.62) <= 0.01
    assert abs(fit.B - 1.8) <= 0.15
    assert fit.C_mid == pytest.approx(5000, rel=0.1)
    assert fit.diagnostics.identifiable and fit.diagnostics.reliable
    assert fit.diagnostics.rmse == pytest.approx(0.005, rel=0.35)


def test_method_paper_recovers_within_grid_resolution(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(A=0.62, B=1.8, C_mid=5000, R0=0.4, n=30, noise=0.003, seed=3)
    a_grid = np.round(np.arange(0.55, 0.70001, 0.01), 3)
    fit = fit_sigmoid(c, y, r0=0.4, method="paper", A_grid=a_grid, C_mid_grid=np.linspace(1000, 10000, 19))
    assert fit.method == "paper"
    assert fit.A in a_grid and abs(fit.A - 0.62) <= 0.01
    assert fit.C_mid == pytest.approx(5000, rel=0.1)
    assert abs(fit.B - 1.8) <= 0.2


def test_invariant_to_compute_units_and_reward_scale(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(A=0.62, B=1.8, C_mid=5000, R0=0.4, seed=1)
    base = fit_sigmoid(c, y, r0=0.4)
    flops = fit_sigmoid(c * 3.6e18, y, r0=0.4)  # GPU-hours -> FLOPs
    assert pytest.approx(base.A, abs=1e-6) == flops.A
    assert pytest.approx(base.B, rel=1e-5) == flops.B
    assert flops.C_mid == pytest.approx(base.C_mid * 3.6e18, rel=1e-5)
    pm1 = fit_sigmoid(c, 2 * y - 1, r0=2 * 0.4 - 1)  # pass rate -> +-1 reward
    assert pytest.approx(2 * base.A - 1, abs=1e-5) == pm1.A
    assert pytest.approx(base.B, rel=1e-4) == pm1.B
    big = fit_sigmoid(c, 100 * y, r0=40.0)  # a 0..100 score: A must not be capped at 1
    assert big.bounds[0][1] == math.inf
    assert pytest.approx(100 * base.A, rel=1e-5) == big.A


def test_early_stop_warns_and_is_flagged(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(A=0.62, B=1.8, C_mid=5000, R0=0.4, c_max=4000, n=25, noise=0.004, seed=2)
    fit = fit_sigmoid(c, y, r0=0.4)
    d = fit.diagnostics
    assert not d.identifiable and not d.reliable
    assert d.C_max_over_C_mid < 2
    assert any("poorly determined" in w for w in d.warnings)


def test_r0_convention_first_point_zero_compute_and_argument(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(seed=4)
    first = fit_sigmoid(c, y)
    assert y[0] == first.R0 and first.r0_source == "first_point"
    assert first.in_fit[0]  # the first point is also fitted
    c0 = np.concatenate([[0.0], c])
    y0 = np.concatenate([[0.39], y])
    zero = fit_sigmoid(c0, y0)
    assert zero.R0 == 0.39 and zero.r0_source == "zero_compute_point"
    assert not zero.in_fit[0] and zero.in_fit[1:].all()
    arg = fit_sigmoid(c0, y0, r0=0.41)
    assert arg.R0 == 0.41 and arg.r0_source == "argument"
    # R0 is taken from the whole curve even when the window starts later (the paper skips ~1 epoch).
    late = fit_sigmoid(c, y, min_compute=c[10])
    assert y[0] == late.R0 and not late.in_fit[:10].any()


def test_fit_window_and_include_mask(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(seed=5)
    fit = fit_sigmoid(c, y, r0=0.4, min_compute=c[5], max_compute=c[40])
    np.testing.assert_array_equal(np.flatnonzero(fit.in_fit), np.arange(5, 41))
    assert fit.diagnostics.n_points == 36 and fit.diagnostics.n_held_out == 24
    keep = np.arange(c.size) % 2 == 0
    fit2 = fit_sigmoid(c, y, r0=0.4, include=keep)
    np.testing.assert_array_equal(fit2.in_fit, keep)
    with pytest.raises(ValueError, match="empty fit window"):
        fit_sigmoid(c, y, min_compute=10.0, max_compute=5.0)
    with pytest.raises(ValueError, match="include mask has shape"):
        fit_sigmoid(c, y, include=keep[:-1])


def test_fixed_A_refit(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(A=0.62, B=1.8, C_mid=5000, R0=0.4, seed=6)
    fit = fit_sigmoid(c, y, r0=0.4, fixed_A=0.62)
    assert fit.A == 0.62 and fit.A_fixed
    assert abs(fit.B - 1.8) < 0.1 and fit.C_mid == pytest.approx(5000, rel=0.05)
    assert fit.diagnostics.n_free_params == 2
    lit = fit_sigmoid(c, y, r0=0.4, fixed_A=0.62, method="paper", C_mid_grid=np.linspace(1000, 10000, 10))
    assert lit.A == 0.62 and lit.C_mid == 5000
    with pytest.raises(ValueError, match="fixed_A"):
        fit_sigmoid(c, y, r0=0.4, fixed_A=0.3)


def test_asymptote_on_its_bound_is_reported() -> None:
    # A curve still far from saturation whose true A (1.5) exceeds the pass-rate cap of 1.
    c = np.linspace(500, 20000, 30)
    y = sigmoid_reward(c, 1.5, 1.2, 20000, 0.3)
    fit = fit_sigmoid(c, y)
    assert fit.bounds[0][1] == 1.0
    assert fit.A == 1.0 and fit.diagnostics.A_at_bound
    assert any("upper bound 1" in w for w in fit.diagnostics.warnings)
    free = fit_sigmoid(c, y, a_max=math.inf)
    assert not free.diagnostics.A_at_bound and free.A > 1.0


def test_wrong_shape_is_flagged_as_misfit() -> None:
    # Noise-free but linear in log compute: no sigmoid with R0 at the first point follows it.
    c = np.geomspace(100, 1e4, 30)
    fit = fit_sigmoid(c, 0.3 + 0.3 * np.log10(c / 100))
    assert fit.diagnostics.misfit and not fit.diagnostics.reliable
    assert any("systematic misfit" in w for w in fit.diagnostics.warnings)


def test_result_is_json_ready(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(seed=7)
    out = fit_sigmoid(c, y, r0=0.4).to_dict()
    text = json.dumps(out)
    back = json.loads(text)
    assert {"A", "B", "C_mid", "R0", "r0_source", "diagnostics", "fit_window"} <= back.keys()
    assert back["diagnostics"]["n_points"] == 60
    assert back["D"] == pytest.approx((back["A"] - 0.4) * back["C_mid"] ** back["B"], rel=1e-9)


@pytest.mark.parametrize(
    ("compute", "reward", "message"),
    [
        ([1, 2, 3], [0.1, 0.2, 0.3], "at least 4"),
        ([1, 2, 3, 4, 5], [0.1, np.nan, 0.3, 0.4, 0.5], r"non-finite value\(s\) \(NaN/inf\) at index 1"),
        ([1, 2, np.inf, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5], "compute has 1 non-finite"),
        ([1, 2, 2, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5], "strictly increasing; index 2"),
        ([5, 4, 3, 2, 1], [0.1, 0.2, 0.3, 0.4, 0.5], "strictly increasing"),
        ([-1, 2, 3, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5], "compute must be >= 0; negative at index 0"),
        ([0, 0.5, 1, 2], [0.1, 0.2, 0.3, 0.4], "only 3 point"),
        ([1, 2, 3, 4], [0.1, 0.2, 0.3], "differ in length"),
        ([], [], "empty"),
        ([[1, 2], [3, 4]], [[1, 2], [3, 4]], "1-D"),
    ],
)
def test_bad_input_is_a_clear_error(compute: list, reward: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_sigmoid(compute, reward)


def test_unknown_method_and_bad_r0() -> None:
    c, y = np.arange(1.0, 11.0), np.linspace(0.3, 0.6, 10)
    with pytest.raises(ValueError, match="unknown method"):
        fit_sigmoid(c, y, method="magic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="r0 must be finite"):
        fit_sigmoid(c, y, r0=math.nan)
    with pytest.raises(ValueError, match="a_max"):
        fit_sigmoid(c, y, r0=0.5, a_max=0.4)


@pytest.mark.parametrize("shape", ["flat", "decreasing"])
def test_flat_or_decreasing_curves_are_flagged_not_crashing(shape: str) -> None:
    rng = np.random.default_rng(8)
    c = np.linspace(100, 10000, 40)
    base = np.full(c.size, 0.5) if shape == "flat" else 0.6 - 0.1 * c / c.max()
    y = base + rng.normal(0, 0.01, c.size)
    fit = fit_sigmoid(c, y)
    assert np.isfinite([fit.A, fit.B, fit.C_mid]).all()
    assert not fit.diagnostics.increasing
    assert not fit.diagnostics.reliable
    assert any("does not clearly rise" in w for w in fit.diagnostics.warnings)


def test_rises_uses_noise_not_just_sign() -> None:
    y = np.array([0.5, 0.52, 0.49, 0.51, 0.5, 0.52, 0.49, 0.51])
    ok, _rise, noise = rises(y, 0.5)
    assert not ok and noise > 0
    ok2, rise2, _ = rises(np.linspace(0.3, 0.6, 20), 0.3)
    assert ok2 and rise2 > 0.25


def test_predict_accepts_scalars_arrays_and_zero(synthetic: SyntheticCurve) -> None:
    c, y = synthetic(seed=9)
    fit = fit_sigmoid(c, y, r0=0.4)
    assert fit.predict(0.0) == pytest.approx(0.4)
    assert fit.predict(np.array([[fit.C_mid]])).shape == (1, 1)
    assert fit.predict(fit.C_mid) == pytest.approx(0.4 + (fit.A - 0.4) / 2)
