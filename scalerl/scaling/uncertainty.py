"""Uncertainty of a sigmoid fit: bootstrap intervals and bands, a profile interval for A, and the
seed-to-seed margin.

* Bootstrap (Efron & Tibshirani 1993, ch. 9): refit the curve to resampled data, here all
  replicates at once with the batched Levenberg-Marquardt of ``refine.py`` (1000 refits in well
  under a second). ``kind="residual"`` resamples the fit's residuals (centred, inflated by
  ``sqrt(n / (n - p))`` for the degrees of freedom the fit used up) onto the fitted curve;
  ``block > 1`` resamples runs of consecutive residuals (moving-block bootstrap, Kunsch 1989),
  for curves whose errors are correlated from one evaluation to the next. ``kind="pairs"``
  resamples the points themselves. Percentile intervals; seeded, so reruns reproduce.
* Profile interval for A (Bates & Watts 1988, sec. 6.1): for each fixed A minimize SSE over
  (B, C_mid); A is inside the ``level`` interval while ``SSE(A) <= SSE_min (1 + F(level; 1, n-p) /
  (n-p))``. If the profile never crosses that line before A's bound, the interval is open on that
  side -- the honest answer for a curve that stops before saturating.
* Drift (the observation band beyond the fit window): an RL curve does not scatter independently
  around its trend; the policy wanders, and a later evaluation's distance from the fitted curve
  grows with how far beyond the data it lies. The residuals are read as a local-level model
  (Harvey 1989, sec. 2.3.2): ``e_t = u_t + eps_t`` with a random walk ``u_t = u_{t-1} + eta_t``.
  Its first differences have ``Var(d) = s_eta^2 + 2 s_eps^2`` and ``Cov(d_t, d_{t-1}) = -s_eps^2``,
  so ``s_eta^2 = max(Var(d) + 2 Cov, 0)`` (method of moments; 0 for independent residuals, where
  the band is the plain residual band). A point ``h`` evaluation intervals past the window's end
  (``h = (C - C_end) / spacing``, the fitted points' mean spacing in compute) gets a further
  ``N(0, h s_eta^2)`` on top of the replicate curve and the resampled residual. Calibrated in
  ``benchmarks/band_calibration.py`` (docs/fitting.md).
* Correlated errors inside the window (``errors="local_level"``, the live forecast's default): the
  same local-level model, used for the parameters' intervals rather than for the band. Each
  residual replicate gets a random walk on top, ``w_t = sum_{j<=t} eta_j``, ``eta ~ N(0, s_eta^2)``
  with ``s_eta^2`` the drift variance above, centred over the window (a constant offset is the
  fit's own to absorb; the residuals the variance came from have mean ~0 too). With independent
  residuals ``s_eta^2 = 0`` and this is the plain residual bootstrap. Why: a curve that wanders
  (the policy drifts between evaluations) carries less information about A than its point count
  says, and the iid bootstrap's interval of A then covers the full curve's A on 40% of the
  prefixes of the paper's 8B curve; with the walk, 97% (``benchmarks/forecast_calibration.py``,
  docs/scaling.md).
* Seed spread (paper A.5 / Fig. 8a): the spread of A and B over runs that differ only by seed;
  the paper reports an A margin of about +-0.02 from three seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit
from scipy.stats import f as f_dist

from scalerl.scaling.forms import log_compute
from scalerl.scaling.grids import adaptive_grids, best_cell_per_A
from scalerl.scaling.refine import levenberg_marquardt
from scalerl.scaling.sigmoid import SigmoidFit, resolve_a_max, theta_bounds
from scalerl.scaling.validation import CurveError

BootstrapKind = Literal["residual", "pairs"]
ErrorModel = Literal["iid", "local_level"]
PARAMS: tuple[str, ...] = ("A", "B", "C_mid")


@dataclass(frozen=True, eq=False)
class Bootstrap:
    """Bootstrap replicates of a sigmoid fit.

    ``samples`` is (K, 3) with rows ``(A, B, C_mid)`` of the finite replicates (``n_unconverged``
    of them were still moving along a flat valley when the iteration cap was hit);
    ``noise`` holds the (inflated) residuals used to widen a band into an observation band.
    """

    fit: SigmoidFit
    samples: NDArray[np.float64]
    n_requested: int
    n_failed: int
    n_unconverged: int
    kind: str
    block: int
    seed: int
    level: float
    noise: NDArray[np.float64]
    errors: str = "iid"
    # Local-level drift: variance added per evaluation interval past the window's end (see above).
    drift: float = 0.0
    spacing: float = math.inf
    fit_end: float = math.inf

    def interval(self, name: str, level: float | None = None) -> tuple[float, float]:
        """Percentile interval of parameter ``name`` (``"A"``, ``"B"`` or ``"C_mid"``)."""
        col = self.samples[:, PARAMS.index(name)]
        q = self.level if level is None else level
        lo, hi = np.quantile(col, [(1 - q) / 2, (1 + q) / 2])
        return float(lo), float(hi)

    def curves(self, compute: ArrayLike) -> NDArray[np.float64]:
        """Replicate curves at ``compute``: shape (K, len(compute))."""
        z = log_compute(np.atleast_1d(compute))[None, :] - np.log(self.samples[:, 2:3])
        A, B = self.samples[:, 0:1], self.samples[:, 1:2]
        return self.fit.R0 + (A - self.fit.R0) * expit(B * z)

    def band(
        self, compute: ArrayLike, level: float | None = None, observation: bool = False
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Pointwise percentile band of the curve at ``compute``.

        ``observation=False``: where the true curve lies (confidence band). ``True``: where a new
        evaluation would land (prediction band: each replicate curve plus a resampled residual,
        plus the drift term past the fit window's end), capped at 1 when every reward is <= 1
        (a pass rate cannot exceed 1: the rule that bounds A, `sigmoid.resolve_a_max`).
        """
        q = self.level if level is None else level
        c = np.atleast_1d(np.asarray(compute, dtype=np.float64))
        cur = self.curves(c)
        if observation:
            rng = np.random.default_rng([self.seed, 1])
            cur = cur + rng.choice(self.noise, size=cur.shape, replace=True)
            if self.drift > 0:
                h = np.maximum(c - self.fit_end, 0.0) / self.spacing
                cur = cur + rng.standard_normal(cur.shape) * np.sqrt(self.drift * h)[None, :]
        lo, hi = np.quantile(cur, [(1 - q) / 2, (1 + q) / 2], axis=0)
        if observation:
            ceiling = resolve_a_max(self.fit.reward, self.fit.R0, None)
            lo, hi = np.minimum(lo, ceiling), np.minimum(hi, ceiling)
        return lo, hi

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "errors": self.errors,
            "block": self.block,
            "seed": self.seed,
            "level": self.level,
            "n_requested": self.n_requested,
            "n_failed": self.n_failed,
            "n_unconverged": self.n_unconverged,
            **{name: list(self.interval(name)) for name in PARAMS if not (name == "A" and self.fit.A_fixed)},
        }


def _block_indices(rng: np.random.Generator, n: int, k: int, block: int) -> NDArray[np.intp]:
    """(k, n) indices of a moving-block resample: random runs of ``block`` consecutive positions."""
    if block <= 1:
        return rng.integers(0, n, size=(k, n))
    n_blocks = -(-n // block)
    starts = rng.integers(0, n - block + 1, size=(k, n_blocks))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(k, -1)
    return idx[:, :n]


def bootstrap(
    fit: SigmoidFit,
    n_boot: int = 1000,
    seed: int = 0,
    kind: BootstrapKind = "residual",
    block: int = 1,
    level: float = 0.95,
    errors: ErrorModel = "iid",
) -> Bootstrap:
    """Refit ``fit`` to ``n_boot`` resampled curves (R0 and the fit window kept fixed).

    ``errors="local_level"`` adds the centred random walk of the module docstring to each residual
    replicate (``kind="residual"`` only).

    Each replicate starts at the point estimate and is refined within the fit's bounds, so the
    replicates of an unidentifiable fit pile up at the bounds, and the intervals show it.
    """
    if n_boot < 10:
        raise CurveError(f"n_boot = {n_boot} is too small for percentile intervals (use >= 10)")
    if not 0 < level < 1:
        raise CurveError(f"level must be in (0, 1), got {level}")
    if kind not in ("residual", "pairs"):
        raise CurveError(f"unknown bootstrap kind {kind!r}; choose 'residual' or 'pairs'")
    if errors not in ("iid", "local_level"):
        raise CurveError(f"unknown error model {errors!r}; choose 'iid' or 'local_level'")
    if errors == "local_level" and kind != "residual":
        raise CurveError("the local-level error model resamples residuals: use kind='residual'")
    x = np.log(fit.fit_compute)
    y = fit.fit_reward
    n = y.size
    yhat = fit.predict(fit.fit_compute)
    p = fit.diagnostics.n_free_params
    res = fit.residuals
    noise = (res - res.mean()) * math.sqrt(n / max(n - p, 1))
    rng = np.random.default_rng(seed)
    block = max(1, min(int(block), n))
    drift = drift_variance(res)
    if kind == "residual":
        targets = yhat[None, :] + noise[_block_indices(rng, n, n_boot, block)]
        if errors == "local_level" and drift > 0:
            targets = targets + centred_walks(rng, n_boot, n, drift)
        weights = None
    else:
        idx = _block_indices(rng, n, n_boot, block)
        weights = np.zeros((n_boot, n))
        np.add.at(weights, (np.repeat(np.arange(n_boot), idx.shape[1]), idx.ravel()), 1.0)
        targets = np.broadcast_to(y, (n_boot, n))
    lower, upper = theta_bounds(fit.bounds)
    theta0 = np.array([fit.A, math.log(fit.B), math.log(fit.C_mid)])
    # Looser tolerances than the point fit: a replicate's parameters matter to ~1e-6, not 1e-10.
    out = levenberg_marquardt(
        x,
        targets,
        fit.R0,
        theta0[None, :],
        lower,
        upper,
        weights=weights,
        free=(not fit.A_fixed, True, True),
        max_iter=300,
        ftol=1e-10,
        xtol=1e-8,
    )
    # Replicates still creeping along a flat valley at max_iter are kept: every point of such a
    # valley fits the resampled data equally well, and dropping them would shrink the interval
    # exactly where the data says least. Only non-finite results are discarded.
    ok = np.all(np.isfinite(out.theta), axis=1) & np.isfinite(out.sse)
    th = out.theta[ok]
    samples = np.column_stack([th[:, 0], np.exp(th[:, 1]), np.exp(th[:, 2])])
    if samples.shape[0] < 10:
        raise CurveError("fewer than 10 bootstrap refits converged; the fit is too ill-posed for intervals")
    return Bootstrap(
        fit=fit,
        samples=samples,
        n_requested=n_boot,
        n_failed=int((~ok).sum()),
        n_unconverged=int((ok & ~out.converged).sum()),
        kind=kind,
        block=block,
        seed=seed,
        level=level,
        noise=noise,
        errors=errors,
        drift=drift,
        spacing=_spacing(fit.fit_compute),
        fit_end=float(fit.fit_compute.max()),
    )


def centred_walks(rng: np.random.Generator, k: int, n: int, variance: float) -> NDArray[np.float64]:
    """(k, n) random walks ``w_t = sum_{j<=t} eta_j``, ``eta ~ N(0, variance)``, each minus its mean
    over the n points (module docstring, "Correlated errors inside the window")."""
    walks = np.cumsum(rng.standard_normal((k, n)) * math.sqrt(variance), axis=1)
    return walks - walks.mean(axis=1, keepdims=True)


def drift_variance(residuals: NDArray[np.float64]) -> float:
    """Random-walk variance per evaluation of the local-level model of the residuals (module
    docstring): ``max(Var(d) + 2 Cov(d_t, d_{t-1}), 0)`` for the first differences ``d``; 0 with
    fewer than 4 residuals."""
    d = np.diff(np.asarray(residuals, dtype=np.float64))
    if d.size < 3:
        return 0.0
    g0 = float(np.mean(d * d))
    g1 = float(np.mean(d[1:] * d[:-1]))
    return max(g0 + 2.0 * min(g1, 0.0), 0.0)


def _spacing(compute: NDArray[np.float64]) -> float:
    """Mean spacing of the fitted points in compute (inf for a single point)."""
    if compute.size < 2:
        return math.inf
    return float(compute.max() - compute.min()) / (compute.size - 1)


@dataclass(frozen=True, eq=False)
class ProfileInterval:
    """Likelihood-ratio (F) interval for A; ``lo_open``/``hi_open`` mean the profile never rose above
    ``threshold`` before A's search bound on that side, so the data cannot exclude it."""

    lo: float
    hi: float
    lo_open: bool
    hi_open: bool
    level: float
    threshold: float
    A_values: NDArray[np.float64]
    sse: NDArray[np.float64]

    def to_dict(self) -> dict[str, object]:
        return {
            "lo": self.lo,
            "hi": self.hi,
            "lo_open": self.lo_open,
            "hi_open": self.hi_open,
            "level": self.level,
        }


def _profile_sse(fit: SigmoidFit, A_values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Minimum SSE over (B, C_mid) for each fixed A (two starts each: coarse grid and the optimum)."""
    return profile_curves(fit, A_values)[0]


def profile_curves(
    fit: SigmoidFit, A_values: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """For each fixed A: the minimum SSE over (B, C_mid) and the ``(A, B, C_mid)`` that reach it
    (two starts each: the coarse grid's best cell and the point fit's optimum)."""
    x = np.log(fit.fit_compute)
    y = fit.fit_reward
    # Starting points only (the refinement below is exact), so a coarser C_mid grid will do.
    _, m_grid = adaptive_grids(fit.fit_compute, y, fit.R0, math.inf, n_C_mid=40)
    starts = best_cell_per_A(x, y, fit.R0, A_values, m_grid)
    lower, upper = theta_bounds(fit.bounds)
    lower = lower.copy()
    upper = upper.copy()
    lower[0], upper[0] = -math.inf, math.inf  # A is fixed per row; its bounds were applied upstream
    k = A_values.size
    theta0 = np.empty((2 * k, 3))
    theta0[:, 0] = np.concatenate([A_values, A_values])
    theta0[:k, 1:] = starts
    theta0[k:, 1] = math.log(fit.B)
    theta0[k:, 2] = math.log(fit.C_mid)
    # SSE to ~1e-10 relative is ample for locating where the profile crosses its threshold.
    out = levenberg_marquardt(
        x, y, fit.R0, theta0, lower, upper, free=(False, True, True), max_iter=150, ftol=1e-10, xtol=1e-8
    )
    second = out.sse[k:] < out.sse[:k]
    theta = np.where(second[:, None], out.theta[k:], out.theta[:k])
    curves = np.column_stack([A_values, np.exp(theta[:, 1]), np.exp(theta[:, 2])])
    return np.minimum(out.sse[:k], out.sse[k:]), curves


def _crossing(a0: float, s0: float, a1: float, s1: float, level: float) -> float:
    """A at which the segment (a0, s0)-(a1, s1) crosses SSE = level (linear interpolation)."""
    if s1 == s0:
        return 0.5 * (a0 + a1)
    return a0 + (level - s0) * (a1 - a0) / (s1 - s0)


def profile_A(fit: SigmoidFit, level: float = 0.95, n_grid: int = 48) -> ProfileInterval:
    """Profile-likelihood interval for the asymptote A (see module docstring).

    The search runs from R0 to A's upper bound (or, when A is unbounded, to ``A + 20 (A - R0)``);
    each side's crossing is located on a coarse grid, then on a fine grid inside the bracket.
    """
    if fit.A_fixed:
        raise ValueError("A was fixed in this fit; it has no interval")
    if not 0 < level < 1:
        raise CurveError(f"level must be in (0, 1), got {level}")
    n, p = fit.diagnostics.n_points, fit.diagnostics.n_free_params
    dof = n - p
    sse_min = float(fit.residuals @ fit.residuals)
    a_lo, a_hi = fit.bounds[0]
    if not math.isfinite(a_hi):
        a_hi = fit.A + 20.0 * max(fit.A - fit.R0, 1e-12)
    if dof < 1:
        return ProfileInterval(
            a_lo, a_hi, True, True, level, math.inf, np.array([fit.A]), np.array([sse_min])
        )
    span = a_hi - a_lo
    coarse = np.unique(np.concatenate([np.linspace(a_lo + 1e-6 * span, a_hi, n_grid), [fit.A]]))
    sse = _profile_sse(fit, coarse)
    i_fit = int(np.argmin(np.abs(coarse - fit.A)))
    sse[i_fit] = min(sse[i_fit], sse_min)
    # The profile may undercut the point fit (e.g. a paper-grid cell, or a refinement that stopped
    # in a shallower basin): measure the threshold from the lowest SSE seen.
    i_best = int(np.argmin(sse))
    threshold = float(sse[i_best]) * (1.0 + f_dist.ppf(level, 1, dof) / dof)
    grids = [coarse]
    sses = [sse]
    ends: list[tuple[float, bool]] = []
    for side in (-1, 1):
        j = i_best
        while 0 <= j + side < coarse.size and sse[j + side] <= threshold:
            j += side
        if not 0 <= j + side < coarse.size:
            ends.append((float(coarse[j]), True))
            continue
        fine = np.linspace(coarse[j], coarse[j + side], 24)
        fine_sse = _profile_sse(fit, fine)
        grids.append(fine)
        sses.append(fine_sse)
        k = 0
        while k + 1 < fine.size and fine_sse[k + 1] <= threshold:
            k += 1
        if k + 1 >= fine.size:
            ends.append((float(fine[-1]), False))
        else:
            ends.append((_crossing(fine[k], fine_sse[k], fine[k + 1], fine_sse[k + 1], threshold), False))
    (lo, lo_open), (hi, hi_open) = ends
    all_a = np.concatenate(grids)
    order = np.argsort(all_a)
    return ProfileInterval(
        lo=min(lo, fit.A, float(coarse[i_best])),
        hi=max(hi, fit.A, float(coarse[i_best])),
        lo_open=lo_open,
        hi_open=hi_open,
        level=level,
        threshold=threshold,
        A_values=all_a[order],
        sse=np.concatenate(sses)[order],
    )


@dataclass(frozen=True)
class SeedSpread:
    """Spread of A, B and C_mid over runs of one recipe that differ only by seed.

    ``*_margin`` is the largest deviation of a seed from the mean (the paper's "+-0.02 on A");
    ``*_std`` the sample standard deviation. Both are NaN with a single seed.
    """

    n_seeds: int
    A_mean: float
    A_std: float
    A_margin: float
    B_mean: float
    B_std: float
    B_margin: float
    C_mid_mean: float
    C_mid_margin: float

    def to_dict(self) -> dict[str, object]:
        from dataclasses import asdict

        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }


def _spread(values: NDArray[np.float64]) -> tuple[float, float, float]:
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    return mean, float(values.std(ddof=1)), float(np.max(np.abs(values - mean)))


def seed_spread(fits: Sequence[SigmoidFit]) -> SeedSpread:
    """Seed-to-seed spread of the fitted parameters (C_mid on a log scale: geometric mean, and
    the margin as the largest factor away from it)."""
    if not fits:
        raise ValueError("seed_spread needs at least one fit")
    A = np.array([f.A for f in fits])
    B = np.array([f.B for f in fits])
    logm = np.log([f.C_mid for f in fits])
    a_mean, a_std, a_margin = _spread(A)
    b_mean, b_std, b_margin = _spread(B)
    m_mean, _, m_margin = _spread(logm)
    return SeedSpread(
        n_seeds=len(fits),
        A_mean=a_mean,
        A_std=a_std,
        A_margin=a_margin,
        B_mean=b_mean,
        B_std=b_std,
        B_margin=b_margin,
        C_mid_mean=math.exp(m_mean),
        C_mid_margin=math.exp(m_margin) if math.isfinite(m_margin) else math.nan,
    )
