"""The compute-needed advice, checked on synthetic curves whose true parameters are known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scalerl.scaling import bootstrap, fit_sigmoid, profile_A
from scalerl.scaling.compute_needed import (
    _FACTORS,
    _design,
    a_half_widths,
    ar1_inflation,
    compute_needed,
    lag1_autocorrelation,
)
from scalerl.scaling.forms import sigmoid_reward

A, B, C_MID, R0, SIGMA = 0.7, 1.5, 1000.0, 0.2, 0.01


def _points(end: float, n: int = 10) -> np.ndarray:
    return np.linspace(end / n, end, n)


def _noisy(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return sigmoid_reward(x, A, B, C_MID, R0) + rng.normal(0.0, SIGMA, x.size)


def _extend(x: np.ndarray, factor: float) -> np.ndarray:
    """The run continued at its evaluation spacing to factor x its end (what the advice assumes)."""
    return _design(x, factor)


def _oracle_factor(x: np.ndarray) -> float:
    """The factor the true curve needs for +-0.02 (the linearised width at the true parameters)."""
    for f in _FACTORS:
        w = a_half_widths(_extend(x, f), np.array([A]), np.array([B]), np.array([C_MID]), R0, SIGMA, 0.95)
        if w[0] <= 0.02:
            return float(f)
    raise AssertionError("the true curve is never pinned")


def test_linearised_width_matches_monte_carlo_refits() -> None:
    """At the true parameters, 1.96 x the spread of A over 60 noisy refits is the formula's width."""
    rng = np.random.default_rng(0)
    x = _extend(_points(500.0), 8.0)  # 80 points up to 4x C_mid: A is identifiable here
    predicted = a_half_widths(x, np.array([A]), np.array([B]), np.array([C_MID]), R0, SIGMA, 0.95)[0]
    a_hat = [fit_sigmoid(x, _noisy(x, rng), r0=R0).A for _ in range(60)]
    measured = 1.96 * float(np.std(a_hat))
    assert 0.7 < measured / predicted < 1.4, (measured, predicted)
    assert abs(float(np.mean(a_hat)) - A) < 0.01


def test_width_shrinks_as_the_run_goes_further() -> None:
    x = _points(500.0)
    w = [a_half_widths(_extend(x, f), np.array([A]), np.array([B]), np.array([C_MID]), R0, SIGMA, 0.95)[0]
         for f in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in itertools.pairwise(w))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_stopping_before_its_midpoint_is_told_how_far_to_go(seed: int) -> None:
    """Data to 0.5 x C_mid: the advice brackets what the true curve needs (within 2x either way)."""
    rng = np.random.default_rng(seed)
    x = _points(500.0)
    fit = fit_sigmoid(np.concatenate([[0.0], x]), np.concatenate([[R0], _noisy(x, rng)]), r0=R0)
    advice = compute_needed(fit, bootstrap(fit, n_boot=300, seed=seed), profile_A(fit))
    assert advice is not None and not advice.pinned
    oracle = _oracle_factor(x)  # 6.8x for these parameters
    assert advice.needed is not None and advice.needed_hi is not None
    needed, needed_hi = advice.needed / advice.fit_end, advice.needed_hi / advice.fit_end
    assert needed <= needed_hi
    assert oracle / 4 <= needed and oracle <= 2 * needed_hi, (needed, needed_hi, oracle)
    assert advice.evals_more is not None and advice.evals_more > 0
    assert "continue to" in advice.sentence("flops")


def test_a_run_well_past_its_midpoint_needs_no_more() -> None:
    rng = np.random.default_rng(3)
    x = np.linspace(200.0, 20000.0, 60)
    fit = fit_sigmoid(x, _noisy(x, rng), r0=R0)
    advice = compute_needed(fit, bootstrap(fit, n_boot=200, seed=0), profile_A(fit))
    assert advice is not None and advice.pinned and advice.now <= 0.02
    assert "none more" in advice.sentence()


def test_a_tighter_target_needs_more_compute() -> None:
    rng = np.random.default_rng(4)
    x = _points(1500.0)
    fit = fit_sigmoid(x, _noisy(x, rng), r0=R0)
    loose = compute_needed(fit, half_width=0.05)
    tight = compute_needed(fit, half_width=0.01)
    assert loose is not None and tight is not None and loose.needed is not None
    assert tight.needed is None or tight.needed > loose.needed


def test_fixed_a_has_no_advice_and_bad_width_is_an_error() -> None:
    x = _points(3000.0)
    fit = fit_sigmoid(x, sigmoid_reward(x, A, B, C_MID, R0), r0=R0, fixed_A=0.7)
    assert compute_needed(fit) is None
    free = fit_sigmoid(x, sigmoid_reward(x, A, B, C_MID, R0) + 0.001 * np.sin(x), r0=R0)
    with pytest.raises(ValueError, match="half-width"):
        compute_needed(free, half_width=0.0)


def test_autocorrelation_and_inflation_closed_forms() -> None:
    rng = np.random.default_rng(5)
    e = np.zeros(4000)
    for t in range(1, e.size):  # AR(1), rho = 0.6
        e[t] = 0.6 * e[t - 1] + rng.normal()
    assert lag1_autocorrelation(e) == pytest.approx(0.6, abs=0.04)
    assert ar1_inflation(0.6) == pytest.approx(4.0)
    assert ar1_inflation(-0.5) == 1.0 and ar1_inflation(0.99) == pytest.approx(19.0)
    assert lag1_autocorrelation(np.array([1.0, 2.0])) == 0.0
