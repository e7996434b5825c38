"""Diagnostics every fit carries: goodness of fit, edge flags, identifiability, warnings.

The point of this module is honesty: a sigmoid fitted to a curve that stops before its midpoint
returns numbers for A, but they are not measurements. The checks here turn such cases into
explicit flags and sentences instead of confident-looking digits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

from scalerl.scaling.validation import CurveError

#: The fitted data must reach this multiple of C_mid before A counts as determined.
#: At 2x C_mid a B ~ 1.5-2 sigmoid has covered ~75 % of its rise; the paper fits its 8B run up to
#: ~4x C_mid (50k vs C_mid ~ 11k GPU-h) and notes fits stabilise once past the midpoint.
IDENTIFIABLE_SPAN = 2.0
#: Residual RMSE above this multiple of the point-to-point noise means the shape is wrong.
MISFIT_RATIO = 3.0
#: Training truncation rate past which a run is flagged: ScaleRL (arXiv 2510.13786) saw runs whose
#: truncations climbed past ~10% destabilize (Sec. 3 / A.3: "truncations >10%"; A.15: 10-15%).
TRUNCATION_THRESHOLD = 0.10


@dataclass(frozen=True)
class TruncationFlag:
    """A run whose training truncation rate passed ``threshold``: where first, how high, how often."""

    threshold: float
    first_step: float
    max_rate: float
    max_step: float
    n_over: int
    n_rows: int

    def message(self) -> str:
        return (
            f"training truncation rate passed {self.threshold:.0%} at step {self.first_step:g} (max "
            f"{self.max_rate:.1%} at step {self.max_step:g}; above on {self.n_over} of {self.n_rows} steps): "
            "ScaleRL saw runs destabilize once truncations passed 10-15% (A.15); points after it may be "
            "an unstable run, not the recipe's curve"
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def truncation_flag(
    steps: NDArray[np.float64], rates: NDArray[np.float64], threshold: float = TRUNCATION_THRESHOLD
) -> TruncationFlag | None:
    """The flag when some ``rates[i] > threshold`` (strictly), else None. ``steps`` label the rows."""
    if not 0 < threshold <= 1:
        raise CurveError(f"truncation threshold: must be in (0, 1], got {threshold}")
    over = rates > threshold
    if not over.any():
        return None
    top = int(np.argmax(rates))
    return TruncationFlag(threshold=float(threshold), first_step=float(steps[int(np.argmax(over))]),
                          max_rate=float(rates[top]), max_step=float(steps[top]), n_over=int(over.sum()),
                          n_rows=int(rates.size))


@dataclass(frozen=True)
class Diagnostics:
    """Quality report of a fit. ``reliable`` is False whenever a warning was raised."""

    n_points: int
    n_held_out: int
    n_free_params: int
    sse: float
    rmse: float
    A_at_grid_edge: bool
    C_mid_at_grid_edge: bool
    A_at_bound: bool
    B_at_bound: bool
    C_mid_at_bound: bool
    max_fit_compute: float
    C_max_over_C_mid: float
    identifiable: bool
    increasing: bool
    point_noise: float
    misfit: bool
    warnings: tuple[str, ...]

    @property
    def reliable(self) -> bool:
        """True when no warning was raised (the fit can be read at face value)."""
        return not self.warnings

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (the warnings as a list, plus ``reliable``)."""
        out: dict[str, object] = asdict(self)
        out["warnings"] = list(self.warnings)
        out["reliable"] = self.reliable
        return out


def point_noise(reward: NDArray[np.float64]) -> float:
    """Standard deviation of one evaluation, estimated from the data alone.

    Second differences ``R[i+1] - 2 R[i] + R[i-1]`` cancel any locally linear trend and have
    variance ``6 sigma^2`` for independent noise, so ``sigma = 1.4826 MAD(d2) / sqrt(6)`` (robust
    to outliers). When the MAD collapses to 0 (repeated values) the RMS of ``d2`` is used instead.
    """
    if reward.size < 3:
        return 0.0
    d2 = reward[2:] - 2.0 * reward[1:-1] + reward[:-2]
    mad = float(np.median(np.abs(d2 - np.median(d2))))
    if mad > 0:
        return 1.4826 * mad / np.sqrt(6.0)
    return float(np.sqrt(np.mean(d2 * d2) / 6.0))


def rises(reward: NDArray[np.float64], R0: float) -> tuple[bool, float, float]:
    """Does the curve clearly rise above R0? Returns ``(rises, rise, noise)``.

    ``rise`` = mean of the last quarter of the fitted rewards (at least two points) minus R0;
    ``noise`` = ``point_noise``. A curve rises when ``rise > 2 noise`` (and > 0).
    """
    k = max(2, reward.size // 4)
    rise = float(np.mean(reward[-k:]) - R0)
    noise = point_noise(reward)
    return bool(rise > 0 and rise > 2.0 * noise), rise, noise


def at_bound(value: float, lo: float, hi: float, rel: float = 1e-6) -> bool:
    """True when ``value`` is within ``rel`` of the width of ``[lo, hi]`` from either finite end."""
    width = hi - lo if np.isfinite(hi - lo) else max(abs(value), 1.0)
    tol = rel * max(width, 1e-300)
    return bool((np.isfinite(lo) and value - lo <= tol) or (np.isfinite(hi) and hi - value <= tol))


def build_diagnostics(
    *,
    reward_fit: NDArray[np.float64],
    residuals: NDArray[np.float64],
    n_held_out: int,
    n_free_params: int,
    R0: float,
    A: float,
    C_mid: float,
    max_fit_compute: float,
    A_at_grid_edge: bool,
    C_mid_at_grid_edge: bool,
    A_at_bound: bool,
    B_at_bound: bool,
    C_mid_at_bound: bool,
    A_upper: float,
    A_fixed: bool,
) -> Diagnostics:
    """Assemble the flags and the human-readable warnings for one fitted curve."""
    n = int(reward_fit.size)
    sse = float(residuals @ residuals)
    span = float(max_fit_compute / C_mid)
    increasing, rise, noise = rises(reward_fit, R0)
    notes: list[str] = []
    if not increasing:
        notes.append(
            f"the reward does not clearly rise above R0 = {R0:.4g} in the fit window "
            f"(rise {rise:.3g} vs point noise {noise:.3g}); the sigmoid parameters are not meaningful"
        )
    rmse = float(np.sqrt(sse / n))
    # Lack of fit: residuals far larger than the scatter between neighbouring evaluations mean
    # the sigmoid misses the curve's shape (a collapse, a second phase), not just its noise.
    misfit = bool(increasing and rmse > MISFIT_RATIO * noise + 1e-9 * max(abs(rise), 1e-300))
    if misfit:
        ratio = f"{rmse / noise:.1f}x" if noise > 0 else "far above"
        notes.append(
            f"systematic misfit: residual RMSE {rmse:.3g} is {ratio} the point-to-point noise {noise:.3g}; "
            "the curve does not follow a sigmoid here, so extrapolations are unreliable"
        )
    identifiable = span >= IDENTIFIABLE_SPAN
    if not identifiable and not A_fixed:
        notes.append(
            f"the fitted data stops at {max_fit_compute:.4g}, {span:.2f}x C_mid = {C_mid:.4g}: before "
            f"~{IDENTIFIABLE_SPAN:g}x C_mid the asymptote A is poorly determined; read A = {A:.4g} as a "
            "rough guess and use its interval"
        )
    if A_at_bound and not A_fixed:
        if np.isfinite(A_upper) and A_upper - A <= 1e-6 * max(1.0, abs(A_upper)):
            notes.append(
                f"A sits on its upper bound {A_upper:g}: the data shows no saturation, so the fit only "
                "says A is large"
            )
        else:
            notes.append(f"A = {A:.4g} sits on its lower bound R0: no growth to model")
    if A_at_grid_edge and not A_fixed and not A_at_bound:
        # (On its bound the grid's edge is the bound itself: widening cannot help.)
        notes.append("the best A is at the edge of the A grid; widen the grid")
    if C_mid_at_grid_edge:
        notes.append("the best C_mid is at the edge of the C_mid grid; widen the grid")
    if C_mid_at_bound:
        notes.append(f"C_mid = {C_mid:.4g} sits on its search bound (far outside the data)")
    if B_at_bound:
        notes.append("B sits on its search bound (a step or a straight line, not a sigmoid)")
    if n - n_free_params < 3:
        notes.append(f"only {n} points for {n_free_params} parameters: intervals will be very wide")
    return Diagnostics(
        n_points=n,
        n_held_out=int(n_held_out),
        n_free_params=int(n_free_params),
        sse=sse,
        rmse=rmse,
        A_at_grid_edge=bool(A_at_grid_edge),
        C_mid_at_grid_edge=bool(C_mid_at_grid_edge),
        A_at_bound=bool(A_at_bound),
        B_at_bound=bool(B_at_bound),
        C_mid_at_bound=bool(C_mid_at_bound),
        max_fit_compute=float(max_fit_compute),
        C_max_over_C_mid=span,
        identifiable=bool(identifiable),
        increasing=bool(increasing),
        point_noise=float(noise),
        misfit=misfit,
        warnings=tuple(notes),
    )
