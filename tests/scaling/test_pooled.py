"""Pooled seeds: one (A, B, C_mid) for several seeds with per-seed noise (scaling/pooled.py).

Seeds are generated from known parameters (A 0.62, B 1.8, C_mid 5000, R0 0.4) with noise levels
that differ by seed; the pooled fit must put A inside its interval, its interval must be narrower
than any single seed's, and its noise estimates must find which seed is noisier."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scalerl.cli import main
from scalerl.scaling.forms import sigmoid_reward
from scalerl.scaling.pooled import fit_pooled
from scalerl.scaling.sigmoid import fit_sigmoid
from scalerl.scaling.uncertainty import bootstrap

A, B, C_MID, R0 = 0.62, 1.8, 5000.0, 0.4
NOISE = (0.01, 0.025, 0.015)
C = np.linspace(0, 40000, 31)


def _seed(s: int, sd: float, A_true: float = A, offset: int = 0) -> np.ndarray:
    rng = np.random.default_rng(100 + s + offset)
    # The zero-compute point is exact, so every fit's R0 (its first evaluation) is the true R0.
    return sigmoid_reward(C, A_true, B, C_MID, R0) + np.concatenate([[0.0], rng.normal(0, sd, C.size - 1)])


def test_pooled_fit_recovers_A_with_a_narrower_interval() -> None:
    fits = [(f"s{s}", fit_sigmoid(C, _seed(s, sd))) for s, sd in enumerate(NOISE)]
    pooled = fit_pooled("r", fits, n_boot=300, seed=0)
    lo, hi = pooled.interval("A")  # type: ignore[misc]
    assert lo <= A <= hi
    pooled_width = hi - lo
    for _, f in fits:
        one = bootstrap(f, n_boot=300, seed=0).interval("A")
        assert pooled_width < one[1] - one[0]
    # Each seed's noise is estimated from its own residuals: the noisiest seed is found, each
    # estimate within 35% of the truth (30 points per seed: a sd's relative error ~ 1/sqrt(2 x 30)).
    assert int(np.argmax(pooled.sigmas)) == 1
    for est, true in zip(pooled.sigmas, NOISE, strict=True):
        assert est == pytest.approx(true, rel=0.35)
    assert pooled.warnings == ()


def test_noisy_seed_counts_less() -> None:
    # Weights 1 / sigma_s: adding a seed 10x noisier than two others (weight 1/100 of theirs per
    # point) moves the pooled A by less than 0.005 from the two precise seeds' pooled A; with equal
    # weights it would move it by 0.02-0.04 on these draws.
    sds = (0.01, 0.01, 0.1)
    for offset in (7, 8, 9):
        fits = [(f"s{s}", fit_sigmoid(C, _seed(s, sd, offset=offset))) for s, sd in enumerate(sds)]
        three = fit_pooled("r", fits, n_boot=0)
        two = fit_pooled("r", fits[:2], n_boot=0)
        assert abs(three.A - two.A) < 0.005
        assert three.sigmas[2] > 5 * max(three.sigmas[:2])


def test_seeds_with_different_asymptotes_are_flagged() -> None:
    fits = [(f"s{s}", fit_sigmoid(C, _seed(s, 0.005, A_true=a))) for s, a in enumerate((0.55, 0.62, 0.69))]
    pooled = fit_pooled("r", fits, n_boot=0)
    assert pooled.departures and any("may not share one curve" in w for w in pooled.warnings)


def test_fit_pool_and_compare_recipe_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         run_writer: Callable[..., Path]) -> None:
    write_run = run_writer
    good = [write_run(tmp_path, f"good-seed{s}", C, _seed(s, sd, A_true=0.66), config_name=f"good-seed{s}")
            for s, sd in enumerate(NOISE)]
    bad = [write_run(tmp_path, f"bad-seed{s}", C, _seed(s, sd, A_true=0.58, offset=3),
                     config_name=f"bad-seed{s}") for s, sd in enumerate(NOISE)]
    args = ["--bootstrap", "100", "--x", "compute_device_hours"]
    assert main(["fit", *map(str, good), "--pool", *args, "--json"]) == 0
    pooled = json.loads(capsys.readouterr().out)["pooled"]
    assert pooled["name"] == "good" and pooled["seeds"] == ["good-seed0", "good-seed1", "good-seed2"]
    assert pooled["A_interval"][0] <= 0.66 <= pooled["A_interval"][1]
    recipe_g = "good=" + ",".join(map(str, good))
    recipe_b = "bad=" + ",".join(map(str, bad))
    assert main(["compare", "--recipe", recipe_g, "--recipe", recipe_b, *args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    recipes = {r["recipe"]: r for r in out["recipes"]}
    assert recipes["good"]["A"] == pytest.approx(pooled["A"])  # the pooled fit, not the seeds' mean
    (pair,) = out["pairs"]
    assert pair["A_higher"] == "good"
    assert main(["compare", "--recipe", "good=" + str(good[0]), *args]) == 2
    assert "two or more seeds" in capsys.readouterr().err


def test_a_pooled_prediction_beyond_the_data_says_its_band_is_over_confident() -> None:
    """The pooled band's 1/sqrt(S) narrowing assumes the seeds' extrapolation errors independent;
    where they are shared (docs/studies.md, "Do early comparisons decide?") it is over-confident:
    compare says so for a pooled recipe past its data, and not inside it or for the seeds' own fits."""
    from scalerl.scaling.compare import compare

    fits = {f"r-seed{s}": fit_sigmoid(C, _seed(s, sd)) for s, sd in enumerate(NOISE)}
    pooled = {"r": fit_pooled("r", list(fits.items()), n_boot=50, seed=0)}
    recipes = {label: "r" for label in fits}
    beyond, inside = 2 * C[-1], C[-1] / 2
    with_pool = compare(fits, at=(inside, beyond), recipes=recipes, pooled=pooled, refit_fixed_A=False)
    caveats = {s.compute: s.caveats for s in with_pool.standings}
    assert any("r (pooled): its band assumes" in c for c in caveats[beyond])
    assert not any("(pooled)" in c for c in caveats[inside])
    own = compare(fits, at=(beyond,), recipes=recipes, refit_fixed_A=False)
    assert not any("(pooled)" in c for c in own.standings[0].caveats)
