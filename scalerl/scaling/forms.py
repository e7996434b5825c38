"""The closed-form reward-vs-compute curves of the ScaleRL paper, evaluated stably.

Source: Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute for LLMs"
(arXiv 2510.13786), eq. 1 (sigmoid) and Appendix A.4 (power law).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit


def log_compute(compute: ArrayLike) -> NDArray[np.float64]:
    """``ln C`` with ``ln 0 = -inf`` (zero compute is the start of training) and an error for ``C < 0``."""
    c = np.asarray(compute, dtype=np.float64)
    if np.any(c < 0):
        raise ValueError("compute must be >= 0")
    with np.errstate(divide="ignore"):
        return np.log(c)


def sigmoid_reward(compute: ArrayLike, A: float, B: float, C_mid: float, R0: float) -> NDArray[np.float64]:
    """Paper eq. 1: ``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)``.

    Evaluated as ``R0 + (A - R0) * expit(B * (ln C - ln C_mid))``, which is the same function but
    never overflows: ``(C_mid / C)^B`` overflows float64 for C in FLOPs and B ~ 2, the logistic of a
    log-difference cannot. ``R(0) = R0``, ``R(C_mid) = R0 + (A - R0) / 2``, ``R(inf) = A``.
    """
    if not C_mid > 0:
        raise ValueError(f"C_mid must be > 0, got {C_mid!r}")
    z = log_compute(compute) - np.log(C_mid)
    return R0 + (A - R0) * expit(B * z)


def power_law_reward(compute: ArrayLike, A: float, B: float, D: float) -> NDArray[np.float64]:
    """Paper A.4: ``R(C) = A - D / C^B``, evaluated as ``A - exp(ln D - B ln C)`` (C > 0, D >= 0)."""
    c = np.asarray(compute, dtype=np.float64)
    if np.any(c <= 0):
        raise ValueError("the power law is defined for compute > 0 only")
    if not D >= 0:
        raise ValueError(f"D must be >= 0, got {D!r}")
    if D == 0:
        return np.full(c.shape, float(A))
    return A - np.exp(np.log(D) - B * np.log(c))


def sigmoid_power_law_D(A: float, B: float, C_mid: float, R0: float) -> float:
    """Coefficient of the sigmoid's high-compute limit, ``D = (A - R0) * C_mid^B`` (paper A.4).

    For ``C >> C_mid``: ``R = R0 + (A - R0) / (1 + (C_mid/C)^B) ~ A - (A - R0) (C_mid/C)^B``.
    Infinite when it exceeds the float range: a steep fit (B ~ 50, as short runs give) on a FLOPs
    axis (C_mid ~ 1e12) has C_mid^B ~ 1e600, a legitimate "no power-law regime in reach".
    """
    with np.errstate(over="ignore"):
        return float((A - R0) * np.exp(B * np.log(C_mid)))
