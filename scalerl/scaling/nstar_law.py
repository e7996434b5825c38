"""The IsoCompute law of the compute-optimal generations per prompt, n*(C).

IsoCompute (Cheng et al. 2026, "IsoCompute Playbook: Optimally Scaling Sampling Compute for LLM
RL", arXiv 2603.12151; design notes `003_*`) finds the compute-optimal number of rollouts per
prompt n* at each compute budget C from per-run sigmoid fits, and models n*(C) with "a similar
sigmoid scaling law" to ScaleRL's: n* grows with the budget and saturates. The notes give no
formula, so the form here is ScaleRL's compute sigmoid (Khatri et al. 2025, arXiv 2510.13786,
Eq. 1, ``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)``) with log2 n in place of the reward:

    log2 n*(C) = log2 n_lo + (log2 n_hi - log2 n_lo) / (1 + (C_mid / C)^b)

n_lo is n* at small budgets, n_hi its saturation level, C_mid the budget halfway between them in
log n, b the steepness (a logistic in ln C). log n rather than n because the studied values are
spaced geometrically (IsoCompute's grid n = 2^3 ... 2^11; scalerl's coupled axis halves and
doubles), so one step of the grid is one unit of the law wherever it happens.

Fitted by least squares in log2 n over the budgets; `n_bounds` keeps n_lo and n_hi inside the
studied range (a study's n* is one of its values, so the data say nothing beyond them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares

from scalerl.scaling.validation import CurveError

MIN_BUDGETS = 4  # four parameters
B_BOUNDS = (0.05, 50.0)


def log2_n_star(C: ArrayLike, n_lo: float, n_hi: float, C_mid: float, b: float) -> NDArray[np.float64]:
    """``log2 n*(C)`` of the law (module docstring)."""
    c = np.asarray(C, dtype=np.float64)
    lo, hi = math.log2(n_lo), math.log2(n_hi)
    return lo + (hi - lo) / (1.0 + np.power(C_mid / c, b))


@dataclass(frozen=True)
class NStarLaw:
    """A fitted n*(C); `rmse_log2` is the fit's error in log2 n (1 = a factor of 2 in n)."""

    n_lo: float
    n_hi: float
    C_mid: float
    b: float
    rmse_log2: float
    n_points: int
    budget_range: tuple[float, float]

    def n_star(self, C: ArrayLike) -> NDArray[np.float64]:
        return np.power(2.0, log2_n_star(C, self.n_lo, self.n_hi, self.C_mid, self.b))

    def to_dict(self) -> dict[str, object]:
        return {"n_lo": self.n_lo, "n_hi": self.n_hi, "C_mid": self.C_mid, "b": self.b,
                "rmse_log2": self.rmse_log2, "n_points": self.n_points,
                "budget_range": list(self.budget_range)}


def fit_n_star_law(budgets: Sequence[float], n_star: Sequence[float],
                   n_bounds: tuple[float, float] | None = None) -> NStarLaw:
    """Fit the law to the compute-optimal n at each budget (`CurveError` when it cannot be fitted).

    Starts: n_lo and n_hi from the first and last quarter of the budgets, C_mid where log2 n crosses
    its midpoint, b in (0.5, 2, 8); the best least-squares solution is kept. `n_bounds`: the
    smallest and largest n the law may saturate at (default: those observed).
    """
    C = np.asarray(budgets, dtype=np.float64)
    n = np.asarray(n_star, dtype=np.float64)
    if C.shape != n.shape or C.ndim != 1:
        raise CurveError("budgets and n* must be 1-D arrays of the same length")
    if not (np.all(np.isfinite(C)) and np.all(C > 0) and np.all(np.isfinite(n)) and np.all(n > 0)):
        raise CurveError("budgets and n* must be positive numbers")
    if C.size < MIN_BUDGETS:
        raise CurveError(f"the n*(C) law needs at least {MIN_BUDGETS} budgets, got {C.size}")
    y = np.log2(n)
    if np.ptp(y) == 0:
        raise CurveError(f"n* is {n[0]:g} at every budget: no trend for the law to fit")
    order = np.argsort(C)
    C, y = C[order], y[order]
    lo_b, hi_b = (float(y.min()), float(y.max())) if n_bounds is None else (
        math.log2(n_bounds[0]), math.log2(n_bounds[1]))
    if not lo_b < hi_b:
        raise CurveError(f"n bounds must be increasing, got {n_bounds}")
    lc = np.log(C)
    quarter = max(1, C.size // 4)
    y0, y1 = float(np.mean(y[:quarter])), float(np.mean(y[-quarter:]))
    crossed = np.nonzero((y - (y0 + y1) / 2) * np.sign(y1 - y0) >= 0)[0]
    lmid0 = float(lc[crossed[0]]) if crossed.size else float(np.mean(lc))
    span = float(lc[-1] - lc[0]) or 1.0
    lmid_bounds = (float(lc[0]) - 3 * span, float(lc[-1]) + 3 * span)

    def residuals(p: NDArray[np.float64]) -> NDArray[np.float64]:
        a, h, lmid, b = p
        return a + (h - a) / (1.0 + np.exp(-b * (lc - lmid))) - y

    lower = [lo_b, lo_b, lmid_bounds[0], B_BOUNDS[0]]
    upper = [hi_b, hi_b, lmid_bounds[1], B_BOUNDS[1]]
    best = None
    for b0 in (0.5, 2.0, 8.0):
        start = np.clip([y0, y1, lmid0, b0], np.array(lower) + 1e-9, np.array(upper) - 1e-9)
        fit = least_squares(residuals, start, bounds=(lower, upper), method="trf")
        if best is None or fit.cost < best.cost:
            best = fit
    assert best is not None
    a, h, lmid, b = best.x
    rmse = float(np.sqrt(np.mean(residuals(best.x) ** 2)))
    return NStarLaw(n_lo=float(2.0**a), n_hi=float(2.0**h), C_mid=float(math.exp(lmid)), b=float(b),
                    rmse_log2=rmse, n_points=int(C.size), budget_range=(float(C[0]), float(C[-1])))


__all__ = ["NStarLaw", "fit_n_star_law", "log2_n_star"]
