"""Input checks shared by every fit: one place that turns bad curves into clear errors.

A compute-scaling fit needs a 1-D curve of (compute, reward) points with compute strictly increasing
and non-negative, every value finite, and at least four points inside the fit window (three free
parameters plus one degree of freedom for a residual). Anything else raises ``ValueError`` naming
the offending indices, so the CLI can print it as ``scalerl fit: error: ...``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

MIN_POINTS = 4


class CurveError(ValueError):
    """A curve (a metrics file, a run's log) that cannot be read or fitted: bad input, exit 2."""


class MissingCurveError(CurveError, FileNotFoundError):
    """A metrics file or run directory that does not exist."""



def _indices(mask: NDArray[np.bool_], limit: int = 5) -> str:
    """Format the first few indices where ``mask`` holds, e.g. ``"3, 7, 12 (+2 more)"``."""
    idx = np.flatnonzero(mask)
    shown = ", ".join(str(int(i)) for i in idx[:limit])
    return shown + (f" (+{idx.size - limit} more)" if idx.size > limit else "")


def as_curve(compute: ArrayLike, reward: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate a learning curve and return it as two float64 arrays.

    Rules: same length, 1-D, all finite, ``compute >= 0`` and strictly increasing (a log would
    only go backwards after a resumed or concatenated run, and a fit would silently mix them).
    """
    c = np.asarray(compute, dtype=np.float64)
    r = np.asarray(reward, dtype=np.float64)
    if c.ndim != 1 or r.ndim != 1:
        raise CurveError(f"compute and reward must be 1-D, got shapes {c.shape} and {r.shape}")
    if c.shape != r.shape:
        raise CurveError(f"compute and reward differ in length ({c.size} vs {r.size})")
    if c.size == 0:
        raise CurveError("the curve is empty")
    for name, arr in (("compute", c), ("reward", r)):
        bad = ~np.isfinite(arr)
        if bad.any():
            raise CurveError(
                f"{name} has {int(bad.sum())} non-finite value(s) (NaN/inf) at index {_indices(bad)}"
            )
    if (c < 0).any():
        raise CurveError(f"compute must be >= 0; negative at index {_indices(c < 0)}")
    steps = np.diff(c)
    if (steps <= 0).any():
        where = np.flatnonzero(steps <= 0)[0]
        raise CurveError(
            f"compute must be strictly increasing; index {where + 1} ({c[where + 1]:g}) follows "
            f"{c[where]:g} (sort the points, or drop duplicated evaluations from a resumed run)"
        )
    return c, r


def fit_window(
    compute: NDArray[np.float64],
    min_compute: float | None,
    max_compute: float | None,
    include: ArrayLike | None,
) -> NDArray[np.bool_]:
    """Boolean mask of the points a fit may use.

    A point is used when ``min_compute <= C <= max_compute`` (either bound optional), it is allowed
    by ``include`` (e.g. a step or epoch window), and ``C > 0``: a zero-compute evaluation has no
    place on a log-compute axis; it serves as R0 instead (see ``resolve_r0``).
    """
    mask = compute > 0
    if min_compute is not None:
        mask &= compute >= float(min_compute)
    if max_compute is not None:
        mask &= compute <= float(max_compute)
    if min_compute is not None and max_compute is not None and float(min_compute) >= float(max_compute):
        raise CurveError(f"empty fit window: min compute {min_compute:g} >= max compute {max_compute:g}")
    if include is not None:
        inc = np.asarray(include, dtype=bool)
        if inc.shape != compute.shape:
            raise CurveError(f"include mask has shape {inc.shape}, the curve has {compute.shape}")
        mask &= inc
    n = int(mask.sum())
    if n < MIN_POINTS:
        raise CurveError(
            f"only {n} point(s) with compute > 0 inside the fit window; a fit needs at least {MIN_POINTS}"
        )
    return mask


def resolve_r0(
    compute: NDArray[np.float64], reward: NDArray[np.float64], r0: float | None
) -> tuple[float, str]:
    """Return ``(R0, source)``: the reward at zero training compute and where it came from.

    Convention (documented in docs/scaling.md): an explicit ``r0`` wins (``"argument"``); otherwise
    the reward at the first evaluation, i.e. at the smallest compute of the whole curve, not only
    of the fit window (``"first_point"``, or ``"zero_compute_point"`` when that evaluation was logged
    at compute 0). The ScaleRL paper defines R0 as the reward at zero training compute, and its
    Fig. 1 curves are consistent with R0 = the first evaluation (0.4017 vs 0.4021 at 1.3k GPU-h).
    """
    if r0 is not None:
        value = float(r0)
        if not np.isfinite(value):
            raise CurveError(f"r0 must be finite, got {r0!r}")
        return value, "argument"
    source = "zero_compute_point" if compute[0] == 0 else "first_point"
    return float(reward[0]), source
