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
from scipy.optimize import least_squares

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
    )
