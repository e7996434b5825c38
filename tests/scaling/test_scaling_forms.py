"""Exact-form tests of the sigmoid and power law (paper eq. 1 and A.4)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from scalerl.scaling import power_law_reward, sigmoid_power_law_D, sigmoid_reward


@pytest.mark.parametrize(("A", "B", "C_mid", "R0"), [(0.645, 1.7, 10920.0, 0.4017), (0.9, 0.6, 3e21, -0.5)])
def test_midpoint_is_half_the_gain(A: float, B: float, C_mid: float, R0: float) -> None:
    assert sigmoid_reward(np.array([C_mid]), A, B, C_mid, R0)[0] == pytest.approx(
        R0 + (A - R0) / 2, abs=1e-15
    )


def test_limits_zero_and_infinite_compute() -> None:
    r = sigmoid_reward(np.array([0.0, 1e300]), 0.7, 1.5, 1000.0, 0.3)
    assert r[0] == 0.3
    assert r[1] == pytest.approx(0.7, abs=1e-12)


def test_log_form_equals_literal_formula() -> None:
    c = np.geomspace(10, 1e6, 50)
    A, B, C_mid, R0 = 0.61, 1.92, 2542.0, 0.35
    literal = R0 + (A - R0) / (1 + (C_mid / c) ** B)
    np.testing.assert_allclose(sigmoid_reward(c, A, B, C_mid, R0), literal, rtol=1e-13)


def test_flop_scale_compute_does_not_overflow() -> None:
    # (C_mid / C)^B overflows float64 here; the log form must stay finite and silent.
    c = np.array([1e-200, 1.0, 1e18, 1e24])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = sigmoid_reward(c, 0.7, 3.0, 1e22, 0.2)
    assert np.all(np.isfinite(r))
    assert r[0] == pytest.approx(0.2) and r[-1] == pytest.approx(0.7, abs=1e-5)


def test_high_compute_limit_is_the_power_law() -> None:
    """For C >> C_mid the sigmoid tends to A - D / C^B with D = (A - R0) C_mid^B (paper A.4)."""
    A, B, C_mid, R0 = 0.645, 1.7, 10920.0, 0.4017
    D = sigmoid_power_law_D(A, B, C_mid, R0)
    assert pytest.approx((A - R0) * C_mid**B) == D
    c = C_mid * np.array([10.0, 100.0, 1000.0])
    gap_sigmoid = A - sigmoid_reward(c, A, B, C_mid, R0)
    gap_power = A - power_law_reward(c, A, B, D)
    ratio = gap_sigmoid / gap_power  # = 1 / (1 + (C_mid/C)^B) -> 1
    np.testing.assert_allclose(ratio, 1 / (1 + (C_mid / c) ** B), rtol=1e-10)
    assert abs(ratio[-1] - 1) < 1e-5
    assert abs(ratio[0] - 1) > abs(ratio[1] - 1) > abs(ratio[2] - 1)


def test_power_law_values_and_input_checks() -> None:
    assert power_law_reward(np.array([100.0]), 1.0, 0.5, 2.0)[0] == pytest.approx(1.0 - 2.0 / 10.0)
    np.testing.assert_array_equal(power_law_reward(np.array([1.0, 5.0]), 0.6, 1.0, 0.0), [0.6, 0.6])
    with pytest.raises(ValueError, match="compute > 0"):
        power_law_reward(np.array([0.0]), 1.0, 0.5, 2.0)
    with pytest.raises(ValueError, match="D must be"):
        power_law_reward(np.array([1.0]), 1.0, 0.5, -1.0)


def test_sigmoid_rejects_bad_parameters_and_negative_compute() -> None:
    with pytest.raises(ValueError, match="C_mid"):
        sigmoid_reward(np.array([1.0]), 0.6, 1.0, 0.0, 0.4)
    with pytest.raises(ValueError, match="compute must be >= 0"):
        sigmoid_reward(np.array([-1.0]), 0.6, 1.0, 10.0, 0.4)


def test_power_law_coefficient_of_a_steep_fit_is_infinite_without_a_warning() -> None:
    """B = 50 on a FLOPs axis: C_mid^B overflows; D is +inf, quietly (short runs produce such fits)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sigmoid_power_law_D(0.6, 50.0, 1e12, 0.3) == float("inf")
        assert sigmoid_power_law_D(0.6, 1.5, 1e12, 0.3) == pytest.approx(0.3 * 1e18)
