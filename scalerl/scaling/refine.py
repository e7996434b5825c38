"""Continuous least-squares refinement of the sigmoid, batched over many problems at once.

One routine serves the point fit (a few starting cells), the bootstrap (a thousand resampled
curves) and the profile of A (one problem per fixed A): a Levenberg-Marquardt iteration
(Marquardt 1963, diagonal scaling) on ``theta = (A, ln B, ln C_mid)`` with box bounds applied by
projection, vectorized across the batch so a thousand refits cost a few numpy calls per step
instead of a thousand scipy calls.

Model (paper eq. 1, log form): ``f = R0 + (A - R0) s``, ``s = expit(B (ln C - ln C_mid))``.
Jacobian: ``df/dA = s``, ``df/d ln B = (A - R0) s (1 - s) B (ln C - ln C_mid)``,
``df/d ln C_mid = -(A - R0) s (1 - s) B``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

N_PARAMS = 3


@dataclass(frozen=True, eq=False)
class BatchResult:
    """``theta``: (K, 3) rows ``(A, ln B, ln C_mid)``; ``sse``: weighted sums of squares; ``converged``."""

    theta: NDArray[np.float64]
    sse: NDArray[np.float64]
    converged: NDArray[np.bool_]


def sigmoid_jacobian(
    log_c: NDArray[np.float64], theta: NDArray[np.float64], R0: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Model values (K, n) and Jacobian (K, n, 3) for parameter rows ``theta`` (K, 3)."""
    A, u, v = theta[:, 0:1], theta[:, 1:2], theta[:, 2:3]
    B = np.exp(u)
    zc = log_c[None, :] - v
    s = expit(B * zc)
    amp = A - R0
    ds = amp * s * (1.0 - s) * B
    jac = np.stack([s, ds * zc, -ds], axis=-1)
    return R0 + amp * s, jac


def levenberg_marquardt(
    log_c: NDArray[np.float64],
    targets: NDArray[np.float64],
    R0: float,
    theta0: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    weights: NDArray[np.float64] | None = None,
    free: tuple[bool, bool, bool] = (True, True, True),
    max_iter: int = 200,
    ftol: float = 1e-12,
    xtol: float = 1e-10,
) -> BatchResult:
    """Minimize ``sum_i w_ki (y_ki - f(C_i; theta_k))^2`` for every row k, from ``theta0``.

    ``targets`` is (K, n) (or (n,) broadcast to every start), ``weights`` (K, n) or None (e.g.
    bootstrap multiplicities), ``free`` fixes parameters (e.g. A in a fixed-A refit or a profile).
    Steps: solve ``(J'WJ + lam diag(J'WJ)) delta = J'W r``, project onto the bounds, accept when
    the SSE drops (then ``lam /= 3``) else ``lam *= 4``. A row stops when an accepted step changes
    the SSE by less than ``ftol`` (relative) and theta by less than ``xtol``, or when ``lam`` exceeds
    1e12 or a rejected step is below ``xtol`` (no descent left inside the box: a stationary point).
    """
    theta = np.clip(np.atleast_2d(np.asarray(theta0, dtype=np.float64)).copy(), lower, upper)
    Y = np.asarray(targets, dtype=np.float64)
    K = max(theta.shape[0], Y.shape[0] if Y.ndim == 2 else 1)
    theta = np.broadcast_to(theta, (K, N_PARAMS)).copy()
    Y = np.broadcast_to(Y, (K, log_c.size))
    W = np.ones((K, log_c.size)) if weights is None else np.broadcast_to(weights, (K, log_c.size))
    fixed = ~np.asarray(free, dtype=bool)

    f, jac = sigmoid_jacobian(log_c, theta, R0)
    r = Y - f
    sse = np.einsum("kn,kn->k", W * r, r)
    lam = np.full(K, 1e-3)
    done = np.zeros(K, dtype=bool)
    converged = np.zeros(K, dtype=bool)
    eye = np.eye(N_PARAMS)
    for _ in range(max_iter):
        # Work on the rows still iterating only: most of a bootstrap batch converges early.
        a = np.flatnonzero(~done)
        if a.size == 0:
            break
        Ja, ra, Wa = jac[a], r[a], W[a]
        JtW_T = (Ja * Wa[:, :, None]).transpose(0, 2, 1)
        H = JtW_T @ Ja
        g = (JtW_T @ ra[:, :, None])[:, :, 0]
        diag = np.maximum(np.einsum("kii->ki", H), 1e-300)
        M = H + lam[a, None, None] * (diag[:, :, None] * eye)
        if fixed.any():
            # Fixed parameters: zero their rows/columns, unit diagonal, zero gradient -> zero step.
            M[:, fixed, :] = 0.0
            M[:, :, fixed] = 0.0
            M[:, fixed, fixed] = 1.0
            g[:, fixed] = 0.0
        try:
            delta = np.linalg.solve(M, g[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            delta = _pinv_solve(M, g)
        th_a = theta[a]
        trial = np.clip(th_a + delta, lower, upper)
        f_t, jac_t = sigmoid_jacobian(log_c, trial, R0)
        r_t = Y[a] - f_t
        sse_t = np.einsum("kn,kn->k", Wa * r_t, r_t)
        better = sse_t < sse[a]
        step = np.max(np.abs(trial - th_a) / (1.0 + np.abs(th_a)), axis=1)
        rel = (sse[a] - sse_t) / np.maximum(sse[a], 1e-300)
        small = better & (rel < ftol) & (step < xtol)
        # A rejected step that is already negligible means no descent is left at this precision.
        stuck = ~better & ((lam[a] > 1e12) | (step < xtol))
        b = a[better]
        theta[b], r[b], jac[b], sse[b] = trial[better], r_t[better], jac_t[better], sse_t[better]
        lam[a] = np.where(better, np.maximum(lam[a] / 3.0, 1e-12), np.minimum(lam[a] * 4.0, 1e16))
        stop = a[small | stuck]
        converged[stop] = True
        done[stop] = True
    return BatchResult(theta=theta, sse=sse, converged=converged)


def _pinv_solve(M: NDArray[np.float64], g: NDArray[np.float64]) -> NDArray[np.float64]:
    """Least-squares solve of singular batched 3x3 systems (fallback when ``solve`` fails)."""
    return np.einsum("kij,kj->ki", np.linalg.pinv(M), g)
