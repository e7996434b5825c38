"""Study fits: each run fitted on the first half and extrapolated; seeds combined into variants;
the fixed-A refit; runs that cannot be fitted are reported, not dropped silently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from study_helpers import sigmoid, write_curve

from scalerl.config import RunConfig
from scalerl.studies.fitting import FitSettings, analyze_study, fit_run

SETTINGS = FitSettings(x="compute_device_hours", fraction=0.5, n_boot=100)


def test_a_run_is_fitted_on_the_first_half_and_predicts_its_end(tmp_path: Path) -> None:
    write_curve(tmp_path / "r", RunConfig(name="r"), A=0.6, B=1.5, C_mid=40.0, noise=0.002)
    f = fit_run(tmp_path / "r", "r", "g", SETTINGS)
    assert f.ok and f.error is None
    a = f.analysis
    assert a is not None
    assert float(a.fit.fit_compute.max()) <= 100.0 < float(a.curve.x[-1])  # half of 200
    assert f.extrapolates and f.final_x == 200.0
    truth = float(sigmoid(np.array([200.0]), 0.6, 1.5, 40.0, 0.2)[0])
    assert abs(f.predicted_final - truth) < 0.02  # type: ignore[operator]
    assert abs(a.fit.A - 0.6) < 0.03
    lo, hi = f.predicted_band  # type: ignore[misc]
    assert lo < f.observed_final < hi  # type: ignore[operator]


def test_an_absolute_window_wins_over_the_fraction(tmp_path: Path) -> None:
    write_curve(tmp_path / "r", RunConfig(name="r"), A=0.6)
    f = fit_run(tmp_path / "r", "r", "g", FitSettings(x="compute_device_hours", fraction=0.9, max_x=60.0,
                                                      n_boot=0))
    assert f.analysis is not None and float(f.analysis.fit.fit_compute.max()) <= 60.0
    assert f.analysis.boot is None and f.predicted_band is None


def test_too_short_a_curve_is_an_error_naming_the_run(tmp_path: Path) -> None:
    write_curve(tmp_path / "r", RunConfig(name="r"), A=0.6, n_evals=5)
    f = fit_run(tmp_path / "r", "short", "g", SETTINGS)
    assert not f.ok and "short" in f.error and "at least 4" in f.error  # type: ignore[operator]
    missing = fit_run(tmp_path / "nothing", "gone", "g", SETTINGS)
    assert "no metrics.jsonl" in missing.error  # type: ignore[operator]


def test_seeds_are_combined_and_the_fixed_A_refit_separates_efficiency(tmp_path: Path) -> None:
    fits = []
    # Same asymptote, "fast" reaches it with less compute (higher B, lower C_mid) than "slow".
    for group, B, C_mid in (("slow", 1.2, 60.0), ("fast", 2.0, 25.0)):
        for seed in range(2):
            name = f"{group}-seed{seed}"
            write_curve(tmp_path / name, RunConfig(name=name), A=0.6, B=B, C_mid=C_mid, noise=0.003,
                        seed=seed)
            fits.append(fit_run(tmp_path / name, name, group, SETTINGS))
    fits.append(fit_run(tmp_path / "absent", "broken", "broken", SETTINGS))
    study = analyze_study(fits, SETTINGS, order=["slow", "fast"])
    assert [r.group for r in study.rows] == ["slow", "fast"]  # the failed group has no row
    slow, fast = study.rows
    assert slow.runs == ("slow-seed0", "slow-seed1")
    assert abs(slow.A - 0.6) < 0.05 and abs(fast.A - 0.6) < 0.05
    assert slow.A_margin > 0 and slow.A_interval is not None
    assert study.fixed_A is not None and abs(study.fixed_A - (slow.A + fast.A) / 2) < 1e-9
    assert fast.B_fixed > slow.B_fixed  # type: ignore[operator]
    assert fast.B_fixed_interval is not None
    assert fast.B_fixed_interval[0] <= fast.B_fixed <= fast.B_fixed_interval[1]
    assert study.comparison is not None and study.comparison.A_fixed_refit is not None
    assert abs(slow.observed_final - 0.6) < 0.1


def test_no_fitted_run_gives_no_rows_and_says_so(tmp_path: Path) -> None:
    study = analyze_study([fit_run(tmp_path / "x", "x", "x", SETTINGS)], SETTINGS)
    assert study.rows == () and study.comparison is None and study.notes == ("no run could be fitted",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"fraction": 0.0}, "fit fraction"), ({"fraction": 1.5}, "fit fraction"), ({"max_x": -1.0}, "max x"),
     ({"n_boot": 5}, "bootstrap"), ({"level": 1.0}, "level")],
)
def test_bad_fit_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FitSettings(**kwargs)  # type: ignore[arg-type]
