"""Cross-model-size law of Tan et al. 2025 ("Scaling Behaviors of LLM Reinforcement Learning
Post-Training: An Empirical Study in Mathematical Reasoning", arXiv 2509.25300).

Test "loss" ``L = 1 - pass rate`` falls as a power of the training resource X (compute or data)
whose exponent, the learning efficiency, saturates with model size N:

    L(N, X) = 10^E0(N) * X^(-k(N)),    k(N) = k_max * N / (N + N0).

The intercept is tied to the same efficiency as in the authors' released fitting code:
``E0(N) = k(N) * (c0 + r * log10 N)``, i.e. ``L = (10^c0 * N^r / X)^k(N)``: each model's loss
line pivots at ``X* = 10^c0 N^r``. Four parameters (k_max, N0, c0, r) are fitted jointly to
``log10 L`` over runs of several sizes, which lets the law extrapolate to an unseen, larger N.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares, minimize_scalar

from scalerl.scaling.validation import CurveError, as_curve


def efficiency_k(N: ArrayLike, k_max: float, N0: float) -> NDArray[np.float64]:
    """Learning efficiency ``k(N) = k_max N / (N + N0)`` (Tan et al. 2025)."""
    n = np.asarray(N, dtype=np.float64)
    return k_max * n / (n + N0)


@dataclass(frozen=True, eq=False)
class CrossModelFit:
    """Fitted ``L(N, X) = 10^E0(N) X^-k(N)`` with ``E0(N) = k(N) (c0 + r log10 N)``."""

    k_max: float
    N0: float
    c0: float
    r: float
    rmse_log10: float
    n_points: int
    sizes: tuple[float, ...]
    x_range: tuple[float, float] = (math.nan, math.nan)  # the smallest and largest X fitted

    def k(self, N: ArrayLike) -> NDArray[np.float64]:
        return efficiency_k(N, self.k_max, self.N0)

    def E0(self, N: ArrayLike) -> NDArray[np.float64]:
        """log10 intercept of the loss line of a model of size N."""
        return self.k(N) * (self.c0 + self.r * np.log10(np.asarray(N, dtype=np.float64)))

    def loss(self, N: float, X: ArrayLike) -> NDArray[np.float64]:
        """Predicted ``L = 1 - pass`` for a model of size ``N`` after resource ``X`` (> 0)."""
        x = np.asarray(X, dtype=np.float64)
        if np.any(x <= 0):
            raise CurveError("X must be > 0")
        return np.power(10.0, self.E0(N) - self.k(N) * np.log10(x))

    def predict(self, N: float, X: ArrayLike) -> NDArray[np.float64]:
        """Predicted pass rate ``1 - L``."""
        return 1.0 - self.loss(N, X)

    def to_dict(self) -> dict[str, object]:
        return {
            "k_max": self.k_max,
            "N0": self.N0,
            "c0": self.c0,
            "r": self.r,
            "rmse_log10": self.rmse_log10,
            "n_points": self.n_points,
            "sizes": list(self.sizes),
            "x_range": list(self.x_range),
        }


def _residuals(
    p: NDArray[np.float64], logN: NDArray[np.float64], logX: NDArray[np.float64], logL: NDArray[np.float64]
) -> NDArray[np.float64]:
    k_max, lnN0, c0, r = p
    N = np.power(10.0, logN)
    k = k_max * N / (N + math.exp(lnN0))
    return k * (c0 + r * logN - logX) - logL


def fit_cross_model(runs: Sequence[tuple[float, ArrayLike, ArrayLike]]) -> CrossModelFit:
    """Fit the law to runs ``(N, X, pass_rate)`` of at least two model sizes.

    Start: per-size lines ``log10 L = e_N - k_N log10 X``; ``k(N)`` fitted to the ``k_N`` over a
    grid of N0 (k_max then closed-form); ``e_N / k_N = c0 + r log10 N`` by linear regression.
    Then all four parameters jointly by least squares on ``log10 L`` (N0 in log space).
    """
    sizes: list[float] = []
    logN, logX, logL = [], [], []
    per_size: dict[float, tuple[float, float]] = {}
    for N, X, pass_rate in runs:
        n = float(N)
        if not (math.isfinite(n) and n > 0):
            raise CurveError(f"model size N must be > 0, got {N!r}")
        x, p = as_curve(X, pass_rate)
        if np.any(x <= 0):
            raise CurveError(f"N = {n:g}: X must be > 0 (log scale)")
        loss = 1.0 - p
        if np.any(loss <= 0) or np.any(loss > 1):
            raise CurveError(f"N = {n:g}: pass rates must lie in [0, 1) so that L = 1 - pass is in (0, 1]")
        lx, ll = np.log10(x), np.log10(loss)
        slope, icept = np.polyfit(lx, ll, 1)
        per_size[n] = (-float(slope), float(icept))
        sizes.append(n)
        logN.append(np.full(x.size, math.log10(n)))
        logX.append(lx)
        logL.append(ll)
    distinct = sorted(set(sizes))
    if len(distinct) < 2:
        raise CurveError("the cross-model law needs runs of at least two model sizes")
    lN, lX, lL = np.concatenate(logN), np.concatenate(logX), np.concatenate(logL)
    if lN.size < 5:
        raise CurveError("the cross-model law needs at least 5 points in total (4 parameters)")
    Ns = np.array(distinct)
    ks = np.array([np.mean([per_size[n][0] for n in sizes if n == m]) for m in distinct])
    es = np.array([np.mean([per_size[n][1] for n in sizes if n == m]) for m in distinct])
    best = (math.inf, 1.0, float(np.median(Ns)))
    for N0 in np.geomspace(Ns.min() / 100, Ns.max() * 100, 200):
        h = Ns / (Ns + N0)
        k_max = float(h @ ks / (h @ h))
        err = float(np.sum((k_max * h - ks) ** 2))
        if err < best[0]:
            best = (err, k_max, float(N0))
    _, k_max0, N00 = best
    safe_k = np.where(np.abs(ks) > 1e-9, ks, 1e-9)
    r0, c00 = np.polyfit(np.log10(Ns), es / safe_k, 1)
    start = np.array([max(k_max0, 1e-6), math.log(N00), float(c00), float(r0)])
    fit = least_squares(_residuals, start, args=(lN, lX, lL), method="trf", x_scale="jac", max_nfev=5000)
    k_max, lnN0, c0, r = fit.x
    res = _residuals(fit.x, lN, lX, lL)
    return CrossModelFit(
        k_max=float(k_max),
        N0=float(math.exp(lnN0)),
        c0=float(c0),
        r=float(r),
        rmse_log10=float(np.sqrt(np.mean(res**2))),
        n_points=int(lN.size),
        sizes=tuple(distinct),
        x_range=(float(10.0 ** lX.min()), float(10.0 ** lX.max())),
    )


# ---------------------------------------------------------------------------------------------
# The compute-optimal model size


@dataclass(frozen=True)
class SizeChoice:
    """The size with the highest predicted pass rate at a budget, and how far to trust it.

    `extrapolated`: N lies outside the fitted sizes; `at_edge`: the continuous search ended on an
    edge of the fitted sizes (the law's optimum may lie beyond it); `budget_outside`: the budget lies
    outside the X range the law was fitted on. `candidates`: (N, predicted pass) of every size
    compared (the candidates given, or None for the continuous search)."""

    budget: float
    N: float
    pass_rate: float
    extrapolated: bool
    at_edge: bool
    budget_outside: bool
    candidates: tuple[tuple[float, float], ...] | None

    def to_dict(self) -> dict[str, object]:
        return {"budget": self.budget, "N": self.N, "pass_rate": self.pass_rate,
                "extrapolated": self.extrapolated, "at_edge": self.at_edge,
                "budget_outside": self.budget_outside,
                "candidates": None if self.candidates is None else [
                    {"N": n, "pass_rate": p} for n, p in self.candidates]}


def optimal_size(law: CrossModelFit, budget: float, candidates: Sequence[float] | None = None) -> SizeChoice:
    """Which model size N for a budget C: the N with the highest predicted pass rate ``1 - L(N, C)``.

    At a fixed budget C the law's ``log10 L = k(N) (c0 + r log10 N - log10 C)``: a larger model
    learns more per unit of compute (k(N) grows) but reaches its pivot ``X* = 10^c0 N^r`` later (at
    a fixed C it trains on fewer tokens; Tan et al. 2025's compute-constrained comparison, where
    32B beats 72B at small budgets). With ``u = log10 N`` and ``dk/du = ln(10) k N0 / (N + N0)``
    the stationary point solves ``ln(10) N0 / (N + N0) (c0 + r u - log10 C) + r = 0``: size N is
    optimal at ``log10 C*(N) = c0 + r log10 N + r (N + N0) / (N0 ln 10)`` (k_max cancels; for
    r <= 0 the loss falls with N at every budget and the largest size wins). The search below is
    numeric so that it also answers among arbitrary candidates; the tests check it against this
    closed form.

    Among `candidates` when given (any sizes, those outside the fitted ones flagged as an
    extrapolation); else continuous over the fitted sizes: the best of 801 sizes spaced evenly in
    log N, refined by a bounded scalar search around it.
    """
    C = float(budget)
    if not (math.isfinite(C) and C > 0):
        raise CurveError(f"budget must be a positive compute, got {budget!r}")
    lo, hi = min(law.sizes), max(law.sizes)
    inside = (not math.isnan(law.x_range[0])) and law.x_range[0] <= C <= law.x_range[1]
    if candidates is not None:
        cands = [float(n) for n in candidates]
        if not cands or not all(math.isfinite(n) and n > 0 for n in cands):
            raise CurveError(f"candidate sizes must be positive numbers, got {list(candidates)!r}")
        rated = tuple((n, float(law.predict(n, C))) for n in cands)
        N, p = max(rated, key=lambda t: t[1])
        return SizeChoice(C, N, p, not lo <= N <= hi, False, not inside, rated)
    u_lo, u_hi = math.log10(lo), math.log10(hi)
    grid = np.linspace(u_lo, u_hi, 801)
    losses = np.array([float(law.loss(10.0**u, C)) for u in grid])
    i = int(np.argmin(losses))
    u = float(grid[i])
    if 0 < i < grid.size - 1:
        res = minimize_scalar(lambda v: float(np.log10(law.loss(10.0**v, C))),
                              bounds=(float(grid[i - 1]), float(grid[i + 1])), method="bounded",
                              options={"xatol": 1e-6})
        u = float(res.x)
    N = 10.0**u
    edge = i in (0, grid.size - 1)
    return SizeChoice(C, N, float(law.predict(N, C)), False, edge, not inside, None)
