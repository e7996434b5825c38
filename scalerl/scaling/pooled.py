"""One sigmoid for several seeds of a recipe: a pooled fit with per-seed noise.

Model (seeds ``s = 1..S`` of one recipe, evaluations ``i`` of seed ``s``)::

    y_si = R0_s + (A - R0_s) / (1 + (C_mid / C_si)^B) + e_si,    e_si ~ N(0, sigma_s^2)

The seeds share the curve's ``(A, B, C_mid)`` (ScaleRL eq. 1, Khatri et al. 2025, arXiv
2510.13786); each keeps its own ``R0_s`` (its single fit's R0: the first evaluation unless
``--r0``) and its own noise level ``sigma_s`` (evaluation noise differs between seeds: a noisier
seed should count less). The fit is weighted least squares, iterated: fit with equal weights,
estimate ``sigma_s^2 = SSR_s / (n_s - 3 n_s / N)`` from each seed's residuals (the 3 shared
parameters' degrees of freedom spread over the ``N`` points), refit with weights ``1 / sigma_s``,
three rounds (feasible generalised least squares).

Interval: a residual bootstrap that keeps the noise model: each replicate resamples every seed's
own residuals (scaled by ``sqrt(n_s / (n_s - 3 n_s / N))``) onto that seed's fitted curve and
refits the pooled model with the same weights; the interval is the replicates' percentile
interval. With S seeds of equal noise its width shrinks like ``1 / sqrt(S)`` against one seed's.

What the model does not cover: seeds whose asymptotes really differ (a seed-to-seed spread in A
beyond the evaluation noise). ``departures`` flags a seed whose residuals around the common curve
are more than ``DEPARTURE_RATIO`` x its own single fit's RMSE: the seeds do not share one curve,
and the pooled interval understates the spread (compare the seeds' own fits instead).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares
from scipy.special import expit

from scalerl.scaling.diagnostics import IDENTIFIABLE_SPAN, at_bound
from scalerl.scaling.forms import log_compute
from scalerl.scaling.grids import B_RANGE
from scalerl.scaling.sigmoid import C_MID_REACH, SigmoidFit
from scalerl.scaling.validation import CurveError

#: A seed whose RMSE around the pooled curve exceeds this multiple of its own fit's RMSE departs
#: from the common curve (see the module docstring).
DEPARTURE_RATIO = 1.5
WEIGHT_ROUNDS = 3
PARAMS = ("A", "B", "C_mid")


@dataclass(frozen=True, eq=False)
class PooledFit:
    """The pooled fit of one recipe's seeds: shared ``(A, B, C_mid)``, per-seed R0 and noise."""

    name: str
    labels: tuple[str, ...]
    A: float
    B: float
    C_mid: float
    R0s: tuple[float, ...]
    sigmas: tuple[float, ...]
    n_points: tuple[int, ...]
    seed_rmse: tuple[float, ...]  # each seed's RMSE around the pooled curve
    own_rmse: tuple[float, ...]  # each seed's RMSE around its own single fit
    samples: NDArray[np.float64]  # (K, 3) bootstrap replicates of (A, B, C_mid); (0, 3) without
    level: float
    A_bounds: tuple[float, float]
    max_compute: float

    @property
    def R0(self) -> float:
        return float(np.mean(self.R0s))

    def predict(self, compute: ArrayLike, R0: float | None = None) -> NDArray[np.float64]:
        """The common curve at the seeds' mean R0 (or ``R0``)."""
        r0 = self.R0 if R0 is None else R0
        return r0 + (self.A - r0) * expit(self.B * (log_compute(compute) - math.log(self.C_mid)))

    def interval(self, name: str) -> tuple[float, float] | None:
        """Percentile interval of ``name`` over the bootstrap (None without one)."""
        if self.samples.shape[0] == 0:
            return None
        col = self.samples[:, PARAMS.index(name)]
        lo, hi = np.quantile(col, [(1 - self.level) / 2, (1 + self.level) / 2])
        return float(lo), float(hi)

    def curves(self, compute: ArrayLike) -> NDArray[np.float64] | None:
        """(K, len(compute)) replicate curves at the mean R0 (None without a bootstrap)."""
        if self.samples.shape[0] == 0:
            return None
        z = log_compute(compute)[None, :] - np.log(self.samples[:, 2:3])
        return self.R0 + (self.samples[:, :1] - self.R0) * expit(self.samples[:, 1:2] * z)

    @property
    def departures(self) -> tuple[str, ...]:
        """Seeds that do not follow the common curve (see the module docstring)."""
        pairs = zip(self.labels, self.seed_rmse, self.own_rmse, strict=True)
        return tuple(label for label, pooled, own in pairs if own > 0 and pooled > DEPARTURE_RATIO * own)

    @property
    def warnings(self) -> tuple[str, ...]:
        out = [f"{label}: its residuals around the common curve are > {DEPARTURE_RATIO:g}x its own fit's; "
               "the seeds may not share one curve, and the pooled interval understates their spread"
               for label in self.departures]
        if at_bound(self.A, *self.A_bounds):
            out.append(f"A = {self.A:.4g} is on its bound")
        if self.max_compute < IDENTIFIABLE_SPAN * self.C_mid:
            out.append(f"data stops at {self.max_compute / self.C_mid:.2f}x C_mid (A needs >= "
                       f"{IDENTIFIABLE_SPAN:g}x)")
        return tuple(out)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name, "seeds": list(self.labels), "A": self.A, "B": self.B, "C_mid": self.C_mid,
            "A_interval": self.interval("A"), "B_interval": self.interval("B"),
            "C_mid_interval": self.interval("C_mid"), "level": self.level,
            "R0": dict(zip(self.labels, self.R0s, strict=True)),
            "noise_sd": dict(zip(self.labels, self.sigmas, strict=True)),
            "n_points": dict(zip(self.labels, self.n_points, strict=True)),
            "warnings": list(self.warnings),
            "model": "y_si = R0_s + (A - R0_s) / (1 + (C_mid / C_si)^B) + e_si, e_si ~ N(0, sigma_s^2)",
        }


Arrays = Sequence[NDArray[np.float64]]


def _residuals(theta: NDArray[np.float64], xs: Arrays, ys: Arrays,
               r0s: Sequence[float], w: NDArray[np.float64]) -> NDArray[np.float64]:
    A, B, m = theta[0], math.exp(theta[1]), theta[2]
    return np.concatenate([wi * (y - (r0 + (A - r0) * expit(B * (x - m))))
                           for x, y, r0, wi in zip(xs, ys, r0s, w, strict=True)])


def _jacobian(theta: NDArray[np.float64], xs: Arrays, ys: Arrays,
              r0s: Sequence[float], w: NDArray[np.float64]) -> NDArray[np.float64]:
    """d residual / d (A, ln B, ln C_mid): with s = expit(B (x - m)), the curve's derivatives are
    s, (A - R0) s (1 - s) B (x - m) and -(A - R0) s (1 - s) B; the residual is minus them, weighted."""
    A, B, m = theta[0], math.exp(theta[1]), theta[2]
    rows = []
    for x, r0, wi in zip(xs, r0s, w, strict=True):
        sg = expit(B * (x - m))
        g = (A - r0) * sg * (1 - sg) * B
        rows.append(-wi * np.column_stack([sg, g * (x - m), -g]))
    return np.concatenate(rows)


def _solve(starts: Sequence[NDArray[np.float64]], xs: Sequence[NDArray[np.float64]],
           ys: Sequence[NDArray[np.float64]], r0s: Sequence[float], w: NDArray[np.float64],
           lower: NDArray[np.float64], upper: NDArray[np.float64]) -> NDArray[np.float64]:
    """The lowest-cost bounded least-squares solution over ``starts`` (coordinates (A, ln B, ln C_mid))."""
    best, best_cost = None, math.inf
    for s in starts:
        x0 = np.clip(s, lower + 1e-12 * np.abs(lower), upper - 1e-12 * np.abs(upper))
        res = least_squares(_residuals, x0, jac=_jacobian, bounds=(lower, upper), args=(xs, ys, r0s, w),
                            method="trf")
        if res.cost < best_cost:
            best, best_cost = res.x, res.cost
    assert best is not None
    return best


def fit_pooled(name: str, fits: Sequence[tuple[str, SigmoidFit]], n_boot: int = 1000, seed: int = 0,
               level: float = 0.95) -> PooledFit:
    """Pool the seeds' data (each seed's fit window and R0, from its single ``fit_sigmoid``)."""
    if len(fits) < 2:
        raise CurveError(f"--pool: recipe {name!r} needs at least 2 seeds, got {len(fits)}")
    labels = tuple(label for label, _ in fits)
    xs = [np.log(f.fit_compute) for _, f in fits]
    ys = [f.fit_reward for _, f in fits]
    r0s = [f.R0 for _, f in fits]
    n = np.array([x.size for x in xs], dtype=np.float64)
    total = float(n.sum())
    if total <= 3:
        raise CurveError(f"--pool: recipe {name!r} has {int(total)} points; the pooled fit needs more than 3")
    a_hi = min(f.bounds[0][1] for _, f in fits)
    a_lo = max(r0s) + 1e-9
    if not a_hi > a_lo:
        raise CurveError(f"--pool: recipe {name!r}: the seeds' R0 ({max(r0s):.4g}) is not below A's "
                         f"bound {a_hi:.4g}")
    c_lo = min(float(x.min()) for x in xs)
    c_hi = max(float(x.max()) for x in xs)
    lower = np.array([a_lo, math.log(B_RANGE[0]), c_lo - math.log(C_MID_REACH)])
    upper = np.array([a_hi, math.log(B_RANGE[1]), c_hi + math.log(C_MID_REACH)])
    starts = [np.array([min(max(f.A, a_lo), a_hi), math.log(f.B), math.log(f.C_mid)]) for _, f in fits]
    starts.append(np.mean(starts, axis=0))
    dof = n - 3.0 * n / total  # each seed's share of the residual degrees of freedom
    w = np.ones(len(fits))
    theta = _solve(starts, xs, ys, r0s, w, lower, upper)
    for _ in range(WEIGHT_ROUNDS):
        res = _residuals(theta, xs, ys, r0s, np.ones(len(fits)))
        parts = np.split(res, np.cumsum(n.astype(int))[:-1])
        var = np.array([float(np.sum(p**2)) for p in parts]) / np.maximum(dof, 1e-9)
        sig = np.sqrt(np.maximum(var, 1e-12))
        w = 1.0 / sig
        theta = _solve([theta, *starts], xs, ys, r0s, w, lower, upper)
    res = _residuals(theta, xs, ys, r0s, np.ones(len(fits)))
    parts = np.split(res, np.cumsum(n.astype(int))[:-1])
    samples = _bootstrap(theta, parts, xs, r0s, w, lower, upper, n, dof, n_boot, seed)
    return PooledFit(
        name=name, labels=labels, A=float(theta[0]), B=math.exp(theta[1]), C_mid=math.exp(theta[2]),
        R0s=tuple(float(r) for r in r0s), sigmas=tuple(float(s) for s in 1.0 / w),
        n_points=tuple(int(k) for k in n),
        seed_rmse=tuple(float(np.sqrt(np.mean(p**2))) for p in parts),
        own_rmse=tuple(float(np.sqrt(np.mean(f.residuals**2))) for _, f in fits),
        samples=samples, level=level, A_bounds=(a_lo, a_hi), max_compute=math.exp(c_hi),
    )


def _bootstrap(theta: NDArray[np.float64], parts: Sequence[NDArray[np.float64]],
               xs: Sequence[NDArray[np.float64]], r0s: Sequence[float], w: NDArray[np.float64],
               lower: NDArray[np.float64], upper: NDArray[np.float64], n: NDArray[np.float64],
               dof: NDArray[np.float64], n_boot: int, seed: int) -> NDArray[np.float64]:
    """Replicates of (A, B, C_mid): each seed's own residuals resampled onto its fitted curve."""
    if n_boot <= 0:
        return np.zeros((0, 3))
    rng = np.random.default_rng(seed)
    A, B, m = theta[0], math.exp(theta[1]), theta[2]
    fitted = [r0 + (A - r0) * expit(B * (x - m)) for x, r0 in zip(xs, r0s, strict=True)]
    scaled = [p * math.sqrt(k / max(d, 1e-9)) for p, k, d in zip(parts, n, dof, strict=True)]
    out = np.empty((n_boot, 3))
    for b in range(n_boot):
        ys = [f + rng.choice(r, size=r.size, replace=True) for f, r in zip(fitted, scaled, strict=True)]
        t = _solve([theta], xs, ys, r0s, w, lower, upper)
        out[b] = (t[0], math.exp(t[1]), math.exp(t[2]))
    return out
