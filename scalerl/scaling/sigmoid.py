"""Fit the ScaleRL sigmoid (paper eq. 1) to a reward-vs-compute curve.

``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)`` -- A is the asymptotic reward, B the compute
efficiency (steepness in log compute), C_mid the compute at half the gain, R0 the reward at zero
training compute. Two methods:

* ``"paper"``: the literal Appendix A.5 procedure (A grid 0.450..0.800 step 0.005, C_mid grid of
  100 linear values in [100, 40000], B by curve_fit in each cell, least SSE wins). Reproduces the
  paper's numbers, but the grids assume pass rates and GPU-hours.
* ``"fast"`` (default): the same search vectorized (identical winning cell on the same grids,
  ``grids.fast_grid_search``), on grids scaled to the data, then a continuous bounded
  Levenberg-Marquardt refinement of (A, ln B, ln C_mid) from the best few cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scalerl.scaling.diagnostics import Diagnostics, at_bound, build_diagnostics
from scalerl.scaling.forms import sigmoid_power_law_D, sigmoid_reward
from scalerl.scaling.grids import (
    B_RANGE,
    PAPER_A_GRID,
    PAPER_C_MID_GRID,
    GridOptimum,
    adaptive_grids,
    fast_grid_search,
    paper_grid_search,
)
from scalerl.scaling.refine import levenberg_marquardt
from scalerl.scaling.validation import CurveError, as_curve, fit_window, resolve_r0

Method = Literal["fast", "paper"]
METHODS: tuple[str, ...] = ("fast", "paper")
#: How far outside the fitted compute range C_mid may go in the continuous refinement.
C_MID_REACH = 1e3


@dataclass(frozen=True, eq=False)
class SigmoidFit:
    """A fitted sigmoid with its data, fit window and diagnostics.

    ``compute``/``reward`` are all points given (validated); ``in_fit`` marks those the fit used
    (the rest are held out: outside the window, or at zero compute). ``bounds`` are the search
    bounds ``((A_lo, A_hi), (B_lo, B_hi), (C_mid_lo, C_mid_hi))`` of the continuous refinement.
    """

    A: float
    B: float
    C_mid: float
    R0: float
    r0_source: str
    method: str
    A_fixed: bool
    compute: NDArray[np.float64]
    reward: NDArray[np.float64]
    in_fit: NDArray[np.bool_]
    bounds: tuple[tuple[float, float], tuple[float, float], tuple[float, float]]
    grid: GridOptimum | None
    diagnostics: Diagnostics

    def predict(self, compute: ArrayLike) -> NDArray[np.float64]:
        """Reward predicted at ``compute`` (any shape; ``compute = 0`` gives R0)."""
        return sigmoid_reward(compute, self.A, self.B, self.C_mid, self.R0)

    @property
    def D(self) -> float:
        """Coefficient of the equivalent high-compute power law ``A - D / C^B`` (paper A.4)."""
        return sigmoid_power_law_D(self.A, self.B, self.C_mid, self.R0)

    @property
    def fit_compute(self) -> NDArray[np.float64]:
        return self.compute[self.in_fit]

    @property
    def fit_reward(self) -> NDArray[np.float64]:
        return self.reward[self.in_fit]

    @property
    def residuals(self) -> NDArray[np.float64]:
        """Observed minus fitted reward over the fitted points."""
        return self.fit_reward - self.predict(self.fit_compute)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary: parameters, R0 convention, window, grid optimum, diagnostics."""
        grid = None
        if self.grid is not None:
            grid = {
                "A": self.grid.A,
                "B": self.grid.B,
                "C_mid": self.grid.C_mid,
                "sse": self.grid.sse,
                "A_range": list(self.grid.A_range),
                "C_mid_range": list(self.grid.C_mid_range),
                "n_A": self.grid.A_count,
                "n_C_mid": self.grid.C_mid_count,
            }
        fc = self.fit_compute
        return {
            "A": self.A,
            "B": self.B,
            "C_mid": self.C_mid,
            "R0": self.R0,
            "D": self.D,
            "r0_source": self.r0_source,
            "method": self.method,
            "A_fixed": self.A_fixed,
            "fit_window": {
                "min_compute": float(fc.min()),
                "max_compute": float(fc.max()),
                "n_points": int(fc.size),
                "n_total": int(self.compute.size),
            },
            "grid": grid,
            "diagnostics": self.diagnostics.to_dict(),
        }


def resolve_a_max(reward: NDArray[np.float64], R0: float, a_max: float | None) -> float:
    """Upper bound on A: ``a_max`` if given, else 1.0 when every reward is <= 1 (pass rates and
    +-1 rewards cannot exceed 1; the paper constrains 0 <= A <= 1), else unbounded (``inf``)."""
    if a_max is not None:
        value = float(a_max)
        if math.isnan(value) or value <= R0:
            raise CurveError(f"a_max = {a_max!r} must exceed R0 = {R0:.6g}")
        return value
    if np.all(reward <= 1.0) and R0 < 1.0:
        return 1.0
    return math.inf


def fit_sigmoid(
    compute: ArrayLike,
    reward: ArrayLike,
    r0: float | None = None,
    min_compute: float | None = None,
    max_compute: float | None = None,
    method: Method = "fast",
    *,
    include: ArrayLike | None = None,
    fixed_A: float | None = None,
    a_max: float | None = None,
    A_grid: ArrayLike | None = None,
    C_mid_grid: ArrayLike | None = None,
) -> SigmoidFit:
    """Fit ``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)`` (Khatri et al. 2025, eq. 1; A.5).

    Args:
        compute, reward: the curve, compute strictly increasing and >= 0 (any unit).
        r0: reward at zero training compute; default: the first evaluation of the whole curve
            (see ``validation.resolve_r0``; recorded as ``fit.r0_source``).
        min_compute, max_compute: fit window (inclusive); points outside are held out.
        method: ``"fast"`` (vectorized search + continuous refinement) or ``"paper"`` (literal A.5).
        include: extra boolean mask of usable points (e.g. a step or epoch window).
        fixed_A: refit with A held at this value (paper Sec. 4 fixed-A comparison of B).
        a_max: upper bound on A (default: 1 for rewards <= 1, else none).
        A_grid, C_mid_grid: override the grids (paper grids for ``"paper"``, data-scaled for ``"fast"``).

    Raises:
        ValueError: bad input (see ``validation.as_curve``) or an unknown method.
    """
    if method not in METHODS:
        raise CurveError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    c, r = as_curve(compute, reward)
    R0, r0_source = resolve_r0(c, r, r0)
    mask = fit_window(c, min_compute, max_compute, include)
    x, y = np.log(c[mask]), r[mask]
    A_hi = resolve_a_max(r, R0, a_max)
    A_lo = R0 + 1e-9 * max(1.0, abs(R0))
    if fixed_A is not None:
        fixed_value = float(fixed_A)
        if not math.isfinite(fixed_value) or fixed_value <= R0:
            raise CurveError(f"fixed_A = {fixed_A!r} must be finite and exceed R0 = {R0:.6g}")
        A_lo = A_hi = fixed_value
    c_lo, c_hi = float(c[mask].min()), float(c[mask].max())
    bounds = ((A_lo, A_hi), B_RANGE, (c_lo / C_MID_REACH, c_hi * C_MID_REACH))

    if method == "paper":
        a_grid = np.asarray(PAPER_A_GRID if A_grid is None else A_grid, dtype=np.float64)
        m_grid = np.asarray(PAPER_C_MID_GRID if C_mid_grid is None else C_mid_grid, dtype=np.float64)
        if fixed_A is not None:
            a_grid = np.array([A_lo])
        opt = paper_grid_search(x, y, R0, a_grid, m_grid)
        A, B, C_mid = opt.A, opt.B, opt.C_mid
        flags = (False, not (B_RANGE[0] <= B <= B_RANGE[1]), False)
    else:
        auto_a, auto_m = adaptive_grids(c[mask], y, R0, A_hi)
        a_grid = auto_a if A_grid is None else np.asarray(A_grid, dtype=np.float64)
        m_grid = auto_m if C_mid_grid is None else np.asarray(C_mid_grid, dtype=np.float64)
        if fixed_A is not None:
            a_grid = np.array([A_lo])
        opt = fast_grid_search(x, y, R0, a_grid, m_grid)
        A, B, C_mid = _refine(x, y, R0, opt, bounds, fixed=fixed_A is not None)
        flags = (
            fixed_A is None and at_bound(A, A_lo, A_hi),
            at_bound(math.log(B), math.log(B_RANGE[0]), math.log(B_RANGE[1])),
            at_bound(math.log(C_mid), math.log(bounds[2][0]), math.log(bounds[2][1])),
        )
    residuals = y - sigmoid_reward(c[mask], A, B, C_mid, R0)
    diagnostics = build_diagnostics(
        reward_fit=y,
        residuals=residuals,
        n_held_out=int((~mask).sum()),
        n_free_params=2 if fixed_A is not None else 3,
        R0=R0,
        A=A,
        C_mid=C_mid,
        max_fit_compute=c_hi,
        A_at_grid_edge=opt.A_at_edge,
        C_mid_at_grid_edge=opt.C_mid_at_edge,
        A_at_bound=flags[0],
        B_at_bound=flags[1],
        C_mid_at_bound=flags[2],
        A_upper=A_hi,
        A_fixed=fixed_A is not None,
    )
    return SigmoidFit(
        A=float(A),
        B=float(B),
        C_mid=float(C_mid),
        R0=R0,
        r0_source=r0_source,
        method=method,
        A_fixed=fixed_A is not None,
        compute=c,
        reward=r,
        in_fit=mask,
        bounds=bounds,
        grid=opt,
        diagnostics=diagnostics,
    )


def theta_bounds(
    bounds: tuple[tuple[float, float], tuple[float, float], tuple[float, float]],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Bounds in the refinement's coordinates ``(A, ln B, ln C_mid)``."""
    (a_lo, a_hi), (b_lo, b_hi), (m_lo, m_hi) = bounds
    lower = np.array([a_lo, math.log(b_lo), math.log(m_lo)])
    upper = np.array([a_hi, math.log(b_hi), math.log(m_hi)])
    return lower, upper


def _refine(
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    R0: float,
    opt: GridOptimum,
    bounds: tuple[tuple[float, float], tuple[float, float], tuple[float, float]],
    fixed: bool,
) -> tuple[float, float, float]:
    """Continuous refinement from the best grid cells; the lowest SSE wins (multi-start guards
    against a grid optimum that sits in the wrong basin)."""
    lower, upper = theta_bounds(bounds)
    starts = np.column_stack([opt.top[:, 0], np.log(opt.top[:, 1]), np.log(opt.top[:, 2])])
    if fixed:
        starts[:, 0] = lower[0]
    res = levenberg_marquardt(x, y, R0, starts, lower, upper, free=(not fixed, True, True))
    k = int(np.argmin(res.sse))
    if res.sse[k] > opt.sse:
        # The grid cell itself is better (can only happen when it lies outside the refinement bounds).
        return opt.A, opt.B, opt.C_mid
    A, u, v = res.theta[k]
    return float(A), float(math.exp(u)), float(math.exp(v))
