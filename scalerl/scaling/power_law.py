"""Fit the bounded power law of ScaleRL Appendix A.4: ``R(C) = A - D / C^B`` with ``A <= a_max``.

The paper uses it as the foil for the sigmoid: fitted on the 8B run's (1.5k, 50k) GPU-hour window
with A <= 1 imposed, the power law drives A to the bound (1.0) while the curve saturates near
0.65 -- its asymptote is not identifiable from a pre-saturation window. ``PowerLawFit.A_at_bound``
reports exactly that.

Method (variable projection): for a fixed B the model is linear in (A, D), so A and D have closed
forms and only B is searched: a log-spaced grid of B, then bounded Brent refinement in ln B.
Compute is scaled by its geometric mean inside the fit, so FLOP-sized compute does not underflow
``C^-B``; D is reported in the caller's units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize_scalar

from scalerl.scaling.diagnostics import at_bound
from scalerl.scaling.forms import power_law_reward
from scalerl.scaling.validation import CurveError, as_curve, fit_window

#: Range searched for the power-law exponent B.
POWER_B_RANGE: tuple[float, float] = (1e-3, 10.0)


@dataclass(frozen=True, eq=False)
class PowerLawFit:
    """A fitted ``R = A - D / C^B``; ``A_at_bound`` is True when A sits on ``a_max``."""

    A: float
    B: float
    D: float
    a_max: float
    A_at_bound: bool
    B_at_bound: bool
    compute: NDArray[np.float64]
    reward: NDArray[np.float64]
    in_fit: NDArray[np.bool_]
    sse: float
    rmse: float
    warnings: tuple[str, ...]

    def predict(self, compute: ArrayLike) -> NDArray[np.float64]:
        """Reward predicted at ``compute`` (> 0)."""
        return power_law_reward(compute, self.A, self.B, self.D)

    def to_dict(self) -> dict[str, object]:
        fc = self.compute[self.in_fit]
        return {
            "A": self.A,
            "B": self.B,
            "D": self.D,
            "a_max": self.a_max,
            "A_at_bound": self.A_at_bound,
            "B_at_bound": self.B_at_bound,
            "fit_window": {
                "min_compute": float(fc.min()),
                "max_compute": float(fc.max()),
                "n_points": int(fc.size),
            },
            "sse": self.sse,
            "rmse": self.rmse,
            "warnings": list(self.warnings),
        }


def _profile(
    B: NDArray[np.float64], t: NDArray[np.float64], y: NDArray[np.float64], a_max: float
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """For each exponent ``B`` (shape (m,)): best ``(A, D', SSE)`` of ``y = A - D' exp(-B t)``.

    Unconstrained least squares: ``D' = -cov(x, y) / var(x)``, ``A = mean(y) + D' mean(x)`` with
    ``x = exp(-B t)``. If that A exceeds ``a_max``, A = a_max and ``D' = sum x (a_max - y) / sum x^2``.
    ``D' < 0`` (a falling curve) is clipped to 0, leaving the flat line A = min(mean(y), a_max).
    """
    x = np.exp(-B[:, None] * t[None, :])
    xm, ym = x.mean(axis=1), y.mean()
    var = ((x - xm[:, None]) ** 2).mean(axis=1)
    cov = ((x - xm[:, None]) * (y - ym)[None, :]).mean(axis=1)
    Dp = np.where(var > 0, -cov / np.where(var > 0, var, 1.0), 0.0)
    A = ym + Dp * xm
    over = a_max < A
    Dp = np.where(over, (x * (a_max - y)[None, :]).sum(axis=1) / (x * x).sum(axis=1), Dp)
    A = np.where(over, a_max, A)
    flat = Dp < 0
    Dp = np.where(flat, 0.0, Dp)
    A = np.where(flat, min(float(ym), a_max), A)
    resid = y[None, :] - (A[:, None] - Dp[:, None] * x)
    return A, Dp, (resid * resid).sum(axis=1)


def fit_power_law(
    compute: ArrayLike,
    reward: ArrayLike,
    a_max: float = 1.0,
    min_compute: float | None = None,
    max_compute: float | None = None,
    *,
    include: ArrayLike | None = None,
) -> PowerLawFit:
    """Fit ``R(C) = A - D / C^B`` with ``A <= a_max``, ``D >= 0``, ``B`` in ``POWER_B_RANGE`` (paper A.4).

    Pass ``a_max=math.inf`` for an unbounded asymptote. Raises ``ValueError`` for bad input.
    """
    c, r = as_curve(compute, reward)
    mask = fit_window(c, min_compute, max_compute, include)
    a_cap = float(a_max)
    if math.isnan(a_cap):
        raise CurveError("a_max must not be NaN")
    logc = np.log(c[mask])
    log_ref = float(logc.mean())
    t, y = logc - log_ref, r[mask]
    grid = np.geomspace(*POWER_B_RANGE, 400)
    _, _, sse = _profile(grid, t, y, a_cap)
    k = int(np.argmin(sse))
    lo, hi = math.log(grid[max(k - 1, 0)]), math.log(grid[min(k + 1, grid.size - 1)])

    def sse_at(u: float) -> float:
        return float(_profile(np.array([math.exp(u)]), t, y, a_cap)[2][0])

    best_u = math.log(grid[k])
    if hi > lo:
        res = minimize_scalar(sse_at, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
        if res.fun <= sse[k]:
            best_u = float(res.x)
    B = math.exp(best_u)
    A_arr, Dp_arr, sse_arr = _profile(np.array([B]), t, y, a_cap)
    A, Dp, sse_best = float(A_arr[0]), float(Dp_arr[0]), float(sse_arr[0])
    # Back to the caller's units: D' (C / C_ref)^-B = D C^-B  =>  D = D' C_ref^B.
    D = Dp * math.exp(B * log_ref)
    A_on_bound = bool(math.isfinite(a_cap) and a_cap - A <= 1e-9 * max(1.0, abs(a_cap)))
    B_on_bound = at_bound(math.log(B), math.log(POWER_B_RANGE[0]), math.log(POWER_B_RANGE[1]))
    notes: list[str] = []
    if A_on_bound:
        notes.append(
            f"A sits on its bound a_max = {a_cap:g}: the window does not pin down the asymptote "
            "(the paper's A.4 finding for pre-saturation windows); do not read A as a ceiling"
        )
    if B_on_bound:
        notes.append("B sits on its search bound")
    if Dp <= 0:
        notes.append("the curve does not rise (D = 0): a flat line, not a power law")
    return PowerLawFit(
        A=A,
        B=B,
        D=D,
        a_max=a_cap,
        A_at_bound=A_on_bound,
        B_at_bound=B_on_bound,
        compute=c,
        reward=r,
        in_fit=mask,
        sse=sse_best,
        rmse=math.sqrt(sse_best / y.size),
        warnings=tuple(notes),
    )
