"""Record-breaking downsampling and the Tan et al. cross-model law."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl.scaling import efficiency_k, fit_cross_model, fit_sigmoid, record_breaking, sigmoid_reward


def test_record_breaking_by_hand() -> None:
    c = np.arange(1.0, 9.0)
    r = np.array([0.10, 0.12, 0.11, 0.25, 0.24, 0.26, 0.41, 0.30])
    # Bins of width 0.1 from 0.10: levels 0, 0, 0, 1, 1, 1, 3, 2 -> records at 0, 3, 6.
    np.testing.assert_array_equal(record_breaking(c, r, bin_width=0.1), [0, 3, 6])


def test_record_breaking_is_monotone_and_thins_noise() -> None:
    rng = np.random.default_rng(0)
    c = np.linspace(100, 50000, 500)
    r = sigmoid_reward(c, 0.62, 1.8, 5000, 0.4) + rng.normal(0, 0.01, c.size)
    keep = record_breaking(c, r, n_bins=25)
    assert keep[0] == 0 and 10 <= keep.size <= 26
    assert np.all(np.diff(r[keep]) > 0)
    # The record points still carry the curve: a fit on them lands near the truth.
    fit = fit_sigmoid(c[keep], r[keep], r0=0.4)
    assert abs(fit.A - 0.62) < 0.04


def test_record_breaking_edge_cases() -> None:
    c = np.arange(1.0, 6.0)
    np.testing.assert_array_equal(record_breaking(c, np.full(5, 0.3)), [0])
    with pytest.raises(ValueError, match="bin_width"):
        record_breaking(c, np.linspace(0, 1, 5), bin_width=0.0)
    with pytest.raises(ValueError, match="n_bins"):
        record_breaking(c, np.linspace(0, 1, 5), n_bins=0)
    with pytest.raises(ValueError, match="strictly increasing"):
        record_breaking(c[::-1], np.linspace(0, 1, 5))


def _tan_runs(
    sizes: list[float], k_max: float, N0: float, c0: float, r: float, noise: float = 0.0
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """Runs ``(N, X, pass)`` drawn from the law itself, with multiplicative log-normal noise."""
    rng = np.random.default_rng(1)
    runs = []
    for N in sizes:
        X = np.geomspace(1e17, 1e20, 15)
        k = efficiency_k(N, k_max, N0)
        loss = 10.0 ** (k * (c0 + r * np.log10(N) - np.log10(X)))
        loss = loss * 10.0 ** rng.normal(0, noise, X.size)
        runs.append((N, X, 1.0 - loss))
    return runs


def test_cross_model_recovers_parameters_and_extrapolates_to_a_larger_model() -> None:
    truth = {"k_max": 0.5, "N0": 5e9, "c0": 9.0, "r": 0.7}
    sizes = [0.5e9, 1.5e9, 3e9, 7e9, 14e9]
    law = fit_cross_model(_tan_runs(sizes, **truth, noise=0.002))
    assert law.k_max == pytest.approx(truth["k_max"], rel=0.05)
    assert pytest.approx(truth["N0"], rel=0.15) == law.N0
    assert law.sizes == tuple(sizes)
    # Extrapolate to 32B: the predicted pass rates match the law's truth.
    ((N, X, p_true),) = _tan_runs([32e9], **truth)
    np.testing.assert_allclose(law.predict(N, X), p_true, atol=0.01)
    assert law.k(32e9) > law.k(14e9)  # larger models learn more efficiently (saturating)
    assert law.to_dict()["n_points"] == 75


def test_cross_model_input_checks() -> None:
    X = np.geomspace(1e17, 1e19, 6)
    with pytest.raises(ValueError, match="at least two model sizes"):
        fit_cross_model([(1e9, X, np.linspace(0.1, 0.5, 6)), (1e9, X, np.linspace(0.1, 0.6, 6))])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        fit_cross_model([(1e9, X, np.linspace(0.1, 1.0, 6)), (2e9, X, np.linspace(0.1, 0.5, 6))])
    with pytest.raises(ValueError, match="N must be > 0"):
        fit_cross_model([(0.0, X, np.linspace(0.1, 0.5, 6)), (2e9, X, np.linspace(0.1, 0.5, 6))])
