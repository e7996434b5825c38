"""Bootstrap intervals and bands, the profile interval for A, and the seed spread."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from scalerl.scaling import bootstrap, fit_sigmoid, profile_A, seed_spread
from scalerl.scaling.io import Curve
from scalerl.scaling.validation import CurveError

# The ``synthetic`` fixture (conftest.py): ``make(A, B, C_mid, R0, ...) -> (compute, reward)``.
SyntheticCurve = Callable[..., tuple[np.ndarray, np.ndarray]]


def test_bootstrap_is_seeded_and_reproducible(synthetic: SyntheticCurve) -> None:
    fit = fit_sigmoid(*synthetic(seed=11), r0=0.4)
    a = bootstrap(fit, n_boot=200, seed=7)
    b = bootstrap(fit, n_boot=200, seed=7)
    c = bootstrap(fit, n_boot=200, seed=8)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert not np.array_equal(a.samples, c.samples)
    np.testing.assert_array_equal(a.band([1e5], observation=True)[0], b.band([1e5], observation=True)[0])


def test_thousand_refits_take_seconds_not_minutes(dense_8b: Curve) -> None:
    fit = fit_sigmoid(dense_8b.x, dense_8b.y, r0=0.4017, max_compute=50000)
    t0 = time.perf_counter()
    boot = bootstrap(fit, n_boot=1000, seed=0)
    elapsed = time.perf_counter() - t0
    assert boot.samples.shape == (1000, 3) and boot.n_failed == 0
    assert elapsed < 5.0, f"1000 bootstrap refits took {elapsed:.1f}s"
    lo, hi = boot.interval("A")
    assert lo < fit.A < hi and hi - lo < 0.03


def test_intervals_cover_the_truth_most_of_the_time(synthetic: SyntheticCurve) -> None:
    """Frequentist sanity check: 95% intervals from 12 independent noisy curves."""
    hits = {"A": 0, "B": 0, "profile": 0}
    for seed in range(12):
        fit = fit_sigmoid(*synthetic(A=0.62, B=1.8, C_mid=5000, n=40, noise=0.006, seed=seed), r0=0.4)
        boot = bootstrap(fit, n_boot=200, seed=seed)
        lo, hi = boot.interval("A")
        hits["A"] += lo <= 0.62 <= hi
        lo, hi = boot.interval("B")
        hits["B"] += lo <= 1.8 <= hi
        prof = profile_A(fit)
        hits["profile"] += prof.lo <= 0.62 <= prof.hi
    assert hits["A"] >= 9 and hits["B"] >= 9 and hits["profile"] >= 10, hits


def test_short_curve_gives_wide_or_open_intervals(synthetic: SyntheticCurve) -> None:
    """Data stopping before C_mid: A is not determined; the intervals must say so."""
    c, y = synthetic(A=0.62, B=1.8, C_mid=5000, c_max=4000, n=25, noise=0.004, seed=2)
    fit = fit_sigmoid(c, y, r0=0.4)
    prof = profile_A(fit)
    assert prof.hi_open or prof.hi - prof.lo > 0.1
    boot = bootstrap(fit, n_boot=300, seed=0)
    lo, hi = boot.interval("A")
    assert hi - lo > 0.08
    good = fit_sigmoid(*synthetic(A=0.62, B=1.8, C_mid=5000, noise=0.004, seed=2), r0=0.4)
    good_prof = profile_A(good)
    assert not good_prof.hi_open and not good_prof.lo_open
    assert good_prof.hi - good_prof.lo < 0.25 * (prof.hi - prof.lo)


def test_profile_interval_brackets_the_estimate_and_threshold(dense_8b: Curve) -> None:
    fit = fit_sigmoid(dense_8b.x, dense_8b.y, r0=0.4017)
    prof = profile_A(fit)
    assert prof.lo < fit.A < prof.hi
    assert prof.sse.min() == pytest.approx(fit.diagnostics.sse, rel=1e-6)
    inside = (prof.A_values > prof.lo) & (prof.A_values < prof.hi)
    assert np.all(prof.sse[inside] <= prof.threshold * (1 + 1e-9))
    outside = (prof.A_values < prof.lo - 1e-3) | (prof.A_values > prof.hi + 1e-3)
    assert np.all(prof.sse[outside] > prof.threshold)
    wider = profile_A(fit, level=0.99)
    assert wider.lo <= prof.lo and wider.hi >= prof.hi


def test_bands_widen_with_extrapolation_and_observation_noise(dense_8b: Curve) -> None:
    fit = fit_sigmoid(dense_8b.x, dense_8b.y, r0=0.4017, max_compute=20000)
    boot = bootstrap(fit, n_boot=400, seed=1)
    c = np.array([10000.0, 1e5, 1e6])
    lo, hi = boot.band(c)
    width = hi - lo
    assert width[0] < width[1] <= width[2] + 1e-12
    olo, ohi = boot.band(c, observation=True)
    assert np.all(ohi - olo > width)
    assert np.all(lo <= fit.predict(c)) and np.all(fit.predict(c) <= hi)


@pytest.mark.parametrize(("kind", "block"), [("pairs", 1), ("residual", 4), ("pairs", 3)])
def test_other_resampling_schemes(synthetic: SyntheticCurve, kind: str, block: int) -> None:
    fit = fit_sigmoid(*synthetic(seed=12), r0=0.4)
    boot = bootstrap(fit, n_boot=200, seed=0, kind=kind, block=block)  # type: ignore[arg-type]
    lo, hi = boot.interval("A")
    assert lo < fit.A < hi and np.isfinite([lo, hi]).all()
    assert boot.to_dict()["kind"] == kind and boot.block == block


def test_bootstrap_argument_checks(synthetic: SyntheticCurve) -> None:
    fit = fit_sigmoid(*synthetic(seed=13), r0=0.4)
    with pytest.raises(ValueError, match="too small"):
        bootstrap(fit, n_boot=5)
    with pytest.raises(ValueError, match="kind"):
        bootstrap(fit, kind="jackknife")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="level"):
        bootstrap(fit, level=1.5)


def test_fixed_A_fit_has_no_A_interval(synthetic: SyntheticCurve) -> None:
    fit = fit_sigmoid(*synthetic(seed=14), r0=0.4, fixed_A=0.62)
    boot = bootstrap(fit, n_boot=100, seed=0)
    assert np.all(boot.samples[:, 0] == 0.62)
    assert "A" not in boot.to_dict() and "B" in boot.to_dict()
    with pytest.raises(ValueError, match="fixed"):
        profile_A(fit)


def test_seed_spread_by_hand(synthetic: SyntheticCurve) -> None:
    fits = [fit_sigmoid(*synthetic(A=0.62, seed=s), r0=0.4) for s in range(3)]
    spread = seed_spread(fits)
    A = np.array([f.A for f in fits])
    assert spread.n_seeds == 3
    assert spread.A_mean == pytest.approx(A.mean())
    assert spread.A_std == pytest.approx(A.std(ddof=1))
    assert spread.A_margin == pytest.approx(np.max(np.abs(A - A.mean())))
    assert spread.A_margin < 0.02  # the paper's seed margin on A
    assert spread.C_mid_mean == pytest.approx(np.exp(np.mean(np.log([f.C_mid for f in fits]))))
    one = seed_spread(fits[:1])
    assert one.n_seeds == 1 and np.isnan(one.A_margin) and one.to_dict()["A_margin"] is None
    with pytest.raises(ValueError):
        seed_spread([])


def test_drift_variance_closed_forms() -> None:
    """Local-level model: ~0 for independent residuals, s_eta^2 for a random walk plus noise."""
    from scalerl.scaling.uncertainty import drift_variance

    rng = np.random.default_rng(0)
    iid = rng.normal(0.0, 0.01, 20000)
    assert drift_variance(iid) < 0.02 * 1e-4  # s_eps^2 = 1e-4, s_eta^2 = 0
    walk = np.cumsum(rng.normal(0.0, 0.005, 20000)) + rng.normal(0.0, 0.003, 20000)
    assert drift_variance(walk) == pytest.approx(0.005**2, rel=0.15)
    assert drift_variance(np.array([0.1, 0.2, 0.3])) == 0.0


def test_the_observation_band_widens_past_the_window_with_drift(synthetic: SyntheticCurve) -> None:
    """A curve whose residuals wander (a random walk on top of the sigmoid): the observation band
    grows with the distance past the fit window, and the plain one (drift = 0) does not."""
    from dataclasses import replace

    c, y = synthetic(A=0.62, B=1.8, C_mid=5000, c_max=40000, n=40, noise=0.002, seed=3)
    y = y + np.cumsum(np.random.default_rng(3).normal(0.0, 0.003, c.size))
    fit = fit_sigmoid(c, y, r0=0.4, max_compute=20000)
    boot = bootstrap(fit, n_boot=300, seed=0, level=0.9)
    assert boot.drift > 0 and boot.fit_end == pytest.approx(float(fit.fit_compute.max()))
    at = np.array([fit.fit_compute.max(), 30000.0, 40000.0])
    lo, hi = boot.band(at, observation=True)
    plo, phi = replace(boot, drift=0.0).band(at, observation=True)
    width, plain = hi - lo, phi - plo
    assert width[0] == pytest.approx(plain[0], rel=0.05)  # no drift at the window's end itself
    assert width[1] > 1.3 * plain[1] and width[2] > width[1]
    clo, chi = boot.band(at)  # the confidence band of the curve does not carry the drift
    np.testing.assert_array_equal((clo, chi), replace(boot, drift=0.0).band(at))


def test_the_observation_band_of_a_pass_rate_stays_below_one(synthetic: SyntheticCurve) -> None:
    """Near saturation with drift the band would pass 1; a pass rate cannot, so it is capped
    there (the rule that bounds A). Rewards above 1 are not capped."""

    c, y = synthetic(A=0.97, B=1.5, C_mid=5000, c_max=40000, n=40, noise=0.002, seed=3)
    y = np.minimum(y + np.cumsum(np.random.default_rng(3).normal(0.0, 0.01, c.size)), 1.0)
    fit = fit_sigmoid(c, y, r0=0.4, max_compute=20000)
    boot = bootstrap(fit, n_boot=300, seed=0, level=0.95)
    at = np.array([30000.0, 40000.0])
    assert boot.drift > 0
    uncapped = boot.curves(at) + np.sqrt(boot.drift * (at - boot.fit_end) / boot.spacing)[None, :] * 2
    assert uncapped.max() > 1.0  # without the cap the band would reach past 1
    lo, hi = boot.band(at, observation=True)
    assert np.all(hi <= 1.0) and np.all(lo < hi)
    scaled = bootstrap(fit_sigmoid(c, 10 * y, r0=4.0, max_compute=20000), n_boot=300, seed=0, level=0.95)
    assert scaled.band(at, observation=True)[1].max() > 9.0  # a 0-10 score: no cap at 1


def test_the_local_level_error_model_covers_a_wandering_curve_that_iid_does_not(
    synthetic: SyntheticCurve,
) -> None:
    """What the live forecast needs: the 95% interval of A fitted on the first half of a curve
    should contain the A of the whole curve. On curves whose errors are a random walk (a policy
    that wanders between evaluations) plus noise, the iid residual bootstrap's interval misses it
    most of the time; the local-level model's (uncertainty module docstring) much less often. On
    independent errors both hold their level, and without drift they are the same bootstrap."""
    from scalerl.scaling.forms import sigmoid_reward

    def coverage(walk_sd: float, noise_sd: float, trials: int = 20) -> dict[str, int]:
        hits = {"iid": 0, "local_level": 0}
        for seed in range(trials):
            rng = np.random.default_rng(100 + seed)
            c = np.linspace(1500.0, 45000.0, 30)
            y = (sigmoid_reward(c, 0.62, 1.8, 5000.0, 0.4) + np.cumsum(rng.normal(0, walk_sd, c.size))
                 + rng.normal(0, noise_sd, c.size))
            a_full = fit_sigmoid(c, y, r0=0.4).A
            half = fit_sigmoid(c[:15], y[:15], r0=0.4)
            for errors in hits:
                lo, hi = bootstrap(half, n_boot=200, seed=seed, errors=errors).interval("A")  # type: ignore[arg-type]
                hits[errors] += lo <= a_full <= hi
        return hits

    wandering = coverage(0.006, 0.003)
    assert wandering["iid"] <= 10 and wandering["local_level"] >= wandering["iid"] + 5, wandering
    steady = coverage(0.0, 0.006)
    assert min(steady.values()) >= 17, steady

    fit = fit_sigmoid(*synthetic(seed=3), r0=0.4)
    iid, ll = bootstrap(fit, n_boot=100, seed=1), bootstrap(fit, n_boot=100, seed=1, errors="local_level")
    if ll.drift == 0.0:
        np.testing.assert_array_equal(iid.samples, ll.samples)
    else:
        assert np.ptp(ll.samples[:, 0]) >= np.ptp(iid.samples[:, 0]) * 0.9
    with pytest.raises(CurveError, match="kind='residual'"):
        bootstrap(fit, n_boot=100, kind="pairs", errors="local_level")
