"""How much further must a run go before its asymptote A is pinned down to a stated width?

A fit whose data stops before ~2x C_mid cannot locate A (``diagnostics.IDENTIFIABLE_SPAN``). This
module turns "not identifiable" into a number: the compute the run must reach, continuing at its
current evaluation cadence, before the ``level`` interval of A is expected to be ``+-half_width``.

The model (linearised least squares, Bates & Watts 1988 sec. 2.3): with R0 held fixed and
residual standard deviation ``sigma``, the fitted ``theta = (A, ln B, ln C_mid)`` on evaluation
points ``C_1..C_n`` has covariance ``sigma^2 (J^T J)^-1``, where ``J`` is the Jacobian of
``R(C) = R0 + (A - R0) s``, ``s = expit(B (ln C - ln C_mid))``:

    dR/dA = s,   dR/d ln B = (A - R0) s (1 - s) B (ln C - ln C_mid),   dR/d ln C_mid = -(A - R0) s (1 - s) B

so A's interval half-width is ``z sigma sqrt([(J^T J)^-1]_AA)`` with ``z`` the normal quantile of
``level``. Extending the run adds points at the fitted points' mean spacing in compute (a run
evaluates every N steps, and a step costs about the same compute), which grows ``J^T J``.

Two uncertainties enter, both from the fit itself:

* The true curve is unknown. The half-width is computed for each of the bootstrap's replicate
  curves (plausible truths given the data; the point fit alone without a bootstrap), and the
  advice gives the median of the compute each needs and a conservative upper quantile.
* Residuals of RL curves are correlated from one evaluation to the next (the policy drifts), which
  makes neighbouring points partly redundant. ``sigma^2`` is inflated by the AR(1) variance factor
  ``(1 + rho) / (1 - rho)`` of the residuals' lag-1 autocorrelation ``rho`` (clipped to [0, 0.9]),
  the long-run variance of an AR(1) series relative to its marginal variance (Box & Jenkins).

Checked against Monte Carlo refits of synthetic curves with known parameters in
``tests/test_compute_needed.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit
from scipy.stats import norm

from scalerl.scaling.sigmoid import SigmoidFit
from scalerl.scaling.uncertainty import Bootstrap, ProfileInterval, profile_curves
from scalerl.scaling.validation import CurveError

#: The paper's margin on A (A.5: about +-0.02 from three seeds): the default target half-width.
DEFAULT_HALF_WIDTH = 0.02
#: Advice looks at most this far beyond the fitted data (a longer extrapolation is not advice).
MAX_FACTOR = 100.0
#: The conservative end of the advice: this fraction of the plausible curves is pinned by then.
UPPER_QUANTILE = 0.8
_MAX_CURVES = 100
_N_PROFILE = 25
_FACTORS = np.geomspace(1.0, MAX_FACTOR, 49)


def lag1_autocorrelation(residuals: NDArray[np.float64]) -> float:
    """Lag-1 autocorrelation of a residual series (0 for fewer than 3 points or no variance)."""
    r = np.asarray(residuals, dtype=np.float64)
    if r.size < 3:
        return 0.0
    r = r - r.mean()
    den = float(r @ r)
    return 0.0 if den <= 0 else float(r[1:] @ r[:-1]) / den


def ar1_inflation(rho: float) -> float:
    """Long-run over marginal variance of an AR(1) series, ``(1 + rho) / (1 - rho)``, rho in [0, 0.9]."""
    rho = min(max(rho, 0.0), 0.9)
    return (1.0 + rho) / (1.0 - rho)


def a_half_widths(
    compute: NDArray[np.float64], A: NDArray[np.float64], B: NDArray[np.float64],
    C_mid: NDArray[np.float64], R0: float, sigma: float, level: float,
) -> NDArray[np.float64]:
    """Linearised ``level`` half-width of A for each curve ``(A[k], B[k], C_mid[k])`` at the design
    ``compute`` (shape (n,)); ``inf`` where ``J^T J`` is singular (A not estimable at all)."""
    lnc = np.log(compute)[None, :]
    z = lnc - np.log(C_mid)[:, None]
    s = expit(B[:, None] * z)
    ds = s * (1.0 - s) * (A - R0)[:, None]
    J = np.stack([s, ds * B[:, None] * z, -ds * B[:, None]], axis=-1)  # (K, n, 3)
    M = np.einsum("kni,knj->kij", J, J)
    out = np.full(A.shape, math.inf)
    # The AA entry of the inverse by the adjugate: det(M_bc) / det(M), robust to a 0 determinant.
    minor = M[:, 1, 1] * M[:, 2, 2] - M[:, 1, 2] ** 2
    det = np.linalg.det(M)
    scale = np.einsum("kii->k", M) ** 3
    ok = (det > 1e-12 * np.maximum(scale, 1e-300)) & (minor > 0)
    out[ok] = norm.ppf(0.5 + level / 2) * sigma * np.sqrt(minor[ok] / det[ok])
    return out


@dataclass(frozen=True)
class ComputeAdvice:
    """How far the run must go for A's ``level`` interval to shrink to ``+-half_width``.

    ``needed``/``needed_hi`` are computes (the median and ``UPPER_QUANTILE`` over the plausible
    curves; None: beyond ``MAX_FACTOR`` x the fitted data). ``now`` is the linearised half-width at
    the current data (median over the curves); ``evals_more`` the extra evaluations at the current
    cadence to reach ``needed``.
    """

    half_width: float
    level: float
    fit_end: float
    now: float
    needed: float | None
    needed_hi: float | None
    evals_more: int | None
    sigma: float
    rho: float
    n_curves: int

    @property
    def pinned(self) -> bool:
        """True when the current data already pins A (median curve) to the target width."""
        return self.needed is not None and self.needed <= self.fit_end * (1 + 1e-9)

    def sentence(self, x_name: str = "compute") -> str:
        target = f"A to +-{self.half_width:g} ({self.level:.0%})"
        # The linearised width ignores A's bounds; past +-0.5 it only says "A is free".
        now = f"expected +-{self.now:.3g} now" if self.now < 0.5 else "A is essentially free now"
        if self.pinned:
            return (f"compute needed: none more; the data already pins {target} "
                    f"(expected +-{self.now:.3g})")
        if self.needed is None:
            return (f"compute needed: to pin {target} the run must go beyond {MAX_FACTOR:g}x its fitted "
                    f"data ({x_name} {self.fit_end:.4g}); {now}")
        hi = (f"{self.needed_hi / self.fit_end:.1f}x" if self.needed_hi is not None
              else f"more than {MAX_FACTOR:g}x")
        more = ("" if self.evals_more is None
                else f", about {self.evals_more} more evaluations at this cadence")
        return (f"compute needed: to pin {target}, continue to {x_name} ~{self.needed:.3g} "
                f"({self.needed / self.fit_end:.1f}x the fitted data's end{more}; {hi} to be safe on "
                f"{UPPER_QUANTILE:.0%} of the plausible curves); {now}")

    def to_dict(self) -> dict[str, object]:
        return {"half_width": self.half_width, "level": self.level, "fit_end": self.fit_end,
                "now": self.now, "needed": self.needed, "needed_hi": self.needed_hi,
                "evals_more": self.evals_more, "sigma": self.sigma, "rho": self.rho,
                "n_curves": self.n_curves, "pinned": self.pinned}


def _design(x: NDArray[np.float64], factor: float) -> NDArray[np.float64]:
    """The fitted points plus new ones at their mean spacing, up to ``factor`` x the last one."""
    end = float(x.max())
    step = (end - float(x.min())) / max(x.size - 1, 1) if x.size > 1 else end
    n_new = math.floor((factor * end - end) / step + 1e-9) if step > 0 else 0
    return np.concatenate([x, end + step * np.arange(1, n_new + 1)])


def plausible_curves(
    fit: SigmoidFit, boot: Bootstrap | None = None, profile: ProfileInterval | None = None
) -> NDArray[np.float64]:
    """``(A, B, C_mid)`` rows of curves the data does not rule out: the point fit, up to
    ``_MAX_CURVES`` bootstrap replicates (evenly spaced rows: deterministic), and the profile's
    best curve at ``_N_PROFILE`` values of A across its interval. The profile matters most: when
    the data stops early the bootstrap replicates crowd around the point fit's A, while the
    profile walks A across everything the data cannot exclude."""
    rows = [np.array([[fit.A, fit.B, fit.C_mid]])]
    if boot is not None and boot.samples.shape[0]:
        s = boot.samples
        if s.shape[0] > _MAX_CURVES:
            s = s[np.linspace(0, s.shape[0] - 1, _MAX_CURVES).astype(int)]
        rows.append(s)
    if profile is not None and profile.hi > profile.lo:
        sse, prof = profile_curves(fit, np.linspace(profile.lo, profile.hi, _N_PROFILE))
        rows.append(prof[np.isfinite(sse) & np.all(np.isfinite(prof), axis=1)])
    return np.concatenate(rows)


def compute_needed(
    fit: SigmoidFit,
    boot: Bootstrap | None = None,
    profile: ProfileInterval | None = None,
    half_width: float = DEFAULT_HALF_WIDTH,
    level: float = 0.95,
) -> ComputeAdvice | None:
    """The advice for one fit (see the module docstring); None when A was fixed (nothing to pin)."""
    if fit.A_fixed:
        return None
    if not half_width > 0:
        raise CurveError(f"the target half-width on A must be > 0, got {half_width}")
    x = fit.fit_compute
    n, p = x.size, fit.diagnostics.n_free_params
    res = fit.residuals
    rho = lag1_autocorrelation(res)
    sigma = math.sqrt(float(res @ res) / max(n - p, 1) * ar1_inflation(rho))
    curves = plausible_curves(fit, boot, profile)
    A, B, M = curves[:, 0], curves[:, 1], curves[:, 2]
    widths = np.stack([a_half_widths(_design(x, f), A, B, M, fit.R0, sigma, level) for f in _FACTORS])
    # Per curve: the first factor whose width meets the target (inf when none does).
    meets = widths <= half_width
    first = np.where(meets.any(axis=0), _FACTORS[np.argmax(meets, axis=0)], math.inf)
    end = float(x.max())

    def at(q: float) -> float | None:
        v = float(np.quantile(first, q, method="higher"))
        return None if not math.isfinite(v) else v * end

    needed = at(0.5)
    evals = None
    if needed is not None:
        evals = int(_design(x, needed / end).size - x.size)
    return ComputeAdvice(
        half_width=half_width, level=level, fit_end=end, now=float(np.median(widths[0])),
        needed=needed, needed_hi=at(UPPER_QUANTILE), evals_more=evals, sigma=sigma, rho=rho,
        n_curves=int(A.size),
    )


__all__ = ["DEFAULT_HALF_WIDTH", "ComputeAdvice", "a_half_widths", "ar1_inflation", "compute_needed",
           "lag1_autocorrelation"]
