"""Record-breaking downsampling of a noisy learning curve (IsoCompute-style).

Walk the curve in order of compute and keep a point only when its reward enters a reward bin
above every bin seen so far: the first time the run reaches each new level. The kept points are
the curve's upper envelope thinned to one point per level, which removes the evaluation noise
that otherwise dominates a sigmoid fit on dense logs, and weights every level equally however
long the run lingered there.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scalerl.scaling.validation import CurveError, as_curve


def record_breaking(
    compute: ArrayLike, reward: ArrayLike, bin_width: float | None = None, n_bins: int = 25
) -> NDArray[np.intp]:
    """Indices of the points where the reward first enters a new (higher) bin.

    Bins are ``[R_first + k w, R_first + (k+1) w)`` anchored at the first point, ``w = bin_width``
    or ``(max R - min R) / n_bins``. The first point is always kept; a point is kept when
    ``floor((R_i - R_first) / w)`` exceeds the highest bin index kept so far.
    """
    _, r = as_curve(compute, reward)  # validates compute too: the walk must follow it
    if bin_width is None:
        if n_bins < 1:
            raise CurveError(f"n_bins must be >= 1, got {n_bins}")
        span = float(r.max() - r.min())
        if span == 0:
            return np.array([0], dtype=np.intp)
        width = span / n_bins
    else:
        width = float(bin_width)
        if not (math.isfinite(width) and width > 0):
            raise CurveError(f"bin_width must be a positive number, got {bin_width!r}")
    level = np.floor((r - r[0]) / width)
    # Running maximum of the level *before* each point: a point breaks the record if it beats it.
    best_before = np.maximum.accumulate(np.concatenate([[level[0]], level[:-1]]))
    keep = level > best_before
    keep[0] = True
    return np.flatnonzero(keep)
