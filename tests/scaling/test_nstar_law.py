"""The IsoCompute n*(C) law: fitted to data drawn from a law written out here with its own arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalerl.scaling.nstar_law import fit_n_star_law

TRUTH = {"n_lo": 4.0, "n_hi": 64.0, "C_mid": 1e3, "b": 1.5}


def true_n(C: np.ndarray) -> np.ndarray:
    """n*(C) = 2^(log2 n_lo + (log2 n_hi - log2 n_lo) / (1 + (C_mid / C)^b)), written out."""
    lo, hi = math.log2(TRUTH["n_lo"]), math.log2(TRUTH["n_hi"])
    frac = 1.0 / (1.0 + (TRUTH["C_mid"] / C) ** TRUTH["b"])
    return 2.0 ** (lo + (hi - lo) * frac)


def test_recovers_the_law_from_noisy_optima() -> None:
    C = np.geomspace(10.0, 1e5, 30)
    rng = np.random.default_rng(0)
    n = true_n(C) * 2.0 ** rng.normal(0, 0.05, C.size)  # 5% of a doubling of noise in log2 n
    law = fit_n_star_law(C, n)
    assert law.n_lo == pytest.approx(TRUTH["n_lo"], rel=0.1)
    assert law.n_hi == pytest.approx(TRUTH["n_hi"], rel=0.1)
    assert law.C_mid == pytest.approx(TRUTH["C_mid"], rel=0.15)
    assert law.b == pytest.approx(TRUTH["b"], rel=0.15)
    assert law.rmse_log2 < 0.08 and law.n_points == 30 and law.budget_range == (10.0, 1e5)
    # It extrapolates: at 1e7 (100x past the data) n* is at its saturation level.
    assert float(law.n_star(1e7)) == pytest.approx(float(true_n(np.array([1e7]))[0]), rel=0.1)


def test_a_staircase_of_studied_values_gives_the_law_back() -> None:
    """A study only sees its own n values: the truth rounded to the nearest power of 2 (in log2)."""
    C = np.geomspace(10.0, 1e5, 25)
    studied = 2.0 ** np.round(np.log2(true_n(C)))
    law = fit_n_star_law(C, studied, n_bounds=(4, 64))
    assert law.C_mid == pytest.approx(TRUTH["C_mid"], rel=0.3)
    assert law.n_lo == pytest.approx(4.0, rel=0.2) and law.n_hi == pytest.approx(64.0, rel=0.2)
    fitted = 2.0 ** np.round(np.log2(law.n_star(C)))
    assert np.mean(fitted == studied) >= 0.9  # rounded back, the law gives the staircase


def test_bounds_keep_saturation_inside_the_studied_range() -> None:
    C = np.geomspace(10.0, 1e5, 25)
    law = fit_n_star_law(C, true_n(C), n_bounds=(8, 32))
    assert law.n_lo >= 8 - 1e-9 and law.n_hi <= 32 + 1e-9


def test_errors() -> None:
    C = np.geomspace(10.0, 1e4, 8)
    with pytest.raises(ValueError, match="n\\* is 8 at every budget"):
        fit_n_star_law(C, np.full(8, 8.0))
    with pytest.raises(ValueError, match="at least 4 budgets"):
        fit_n_star_law(C[:3], [4, 8, 16])
    with pytest.raises(ValueError, match="positive"):
        fit_n_star_law(C, np.r_[0.0, np.full(7, 8.0)])
