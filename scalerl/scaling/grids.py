"""Grid search over (A, C_mid) for the sigmoid, literal (paper A.5) and vectorized.

Paper A.5: "A over 0.450..0.800 step 0.005, C_mid over 100 linearly spaced values in
[100, 40000] GPU-hours; for each candidate pair B is fitted with scipy's curve_fit; the pair with
the minimum sum of squared residuals wins."

The vectorized search finds the same cell without 7,100 curve_fit calls. With ``z_i = ln C_i -
ln C_mid``, ``s_i(B) = expit(B z_i)`` and ``d_i = R_i - R0``, the model is ``d_i ~ a s_i`` with
``a = A - R0``, so for one (C_mid, B) pair the residual sum of squares is a quadratic in ``a``:

    SSE(a, C_mid, B) = sum d^2 - 2 a sum(d s) + a^2 sum(s^2).

Two sums per (C_mid, B) pair therefore price every A at once. A log-spaced coarse B axis gives the
per-cell minimum to within a parabola; only the cells that can still win are refined exactly by
Newton's method in ln B, and their exact sums of squares decide.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import OptimizeWarning, curve_fit
from scipy.special import expit

from scalerl.scaling.validation import CurveError

#: Paper A.5 grid for the asymptote A: 0.450, 0.455, ..., 0.800 (71 values).
PAPER_A_GRID: NDArray[np.float64] = np.round(np.linspace(0.45, 0.80, 71), 3)
#: Paper A.5 grid for C_mid: 100 linearly spaced values in [100, 40000] GPU-hours.
PAPER_C_MID_GRID: NDArray[np.float64] = np.linspace(100.0, 40000.0, 100)
#: Bounds on B in the continuous refinement: B = 50 is a step, B = 0.02 a near-flat line.
B_RANGE: tuple[float, float] = (0.02, 50.0)
#: Range of the coarse B axis of the vectorized grid search. Wider than ``B_RANGE`` because the
#: literal search's curve_fit is unbounded and, on step-like data, settles at B ~ 100.
GRID_B_RANGE: tuple[float, float] = (1e-2, 1e3)


@dataclass(frozen=True, eq=False)
class GridOptimum:
    """Winner of a grid search: the cell (A, C_mid), the B fitted in it, and where it sits.

    ``top`` holds the best few distinct cells as rows ``(A, B, C_mid, sse)``, best first, so a
    continuous refinement can start from more than one basin.
    """

    A: float
    B: float
    C_mid: float
    sse: float
    A_index: int
    C_mid_index: int
    A_count: int
    C_mid_count: int
    A_range: tuple[float, float]
    C_mid_range: tuple[float, float]
    top: NDArray[np.float64]

    @property
    def A_at_edge(self) -> bool:
        """True when the best A is the first or last grid value (a single fixed A is never an edge)."""
        return self.A_count > 1 and self.A_index in (0, self.A_count - 1)

    @property
    def C_mid_at_edge(self) -> bool:
        """True when the best C_mid is the first or last grid value."""
        return self.C_mid_count > 1 and self.C_mid_index in (0, self.C_mid_count - 1)


def _check_grid(name: str, grid: NDArray[np.float64], positive: bool) -> NDArray[np.float64]:
    g = np.asarray(grid, dtype=np.float64).ravel()
    if g.size == 0 or not np.all(np.isfinite(g)):
        raise ValueError(f"{name} grid must be a non-empty array of finite values")
    if positive and np.any(g <= 0):
        raise ValueError(f"{name} grid values must be > 0")
    return g


def _cell_model(R0: float, a: float) -> Callable[[NDArray[np.float64], float], NDArray[np.float64]]:
    """``R(z; B) = R0 + a expit(B z)`` with only B free (curve_fit counts the free arguments)."""

    def model(z: NDArray[np.float64], B: float) -> NDArray[np.float64]:
        return R0 + a * expit(B * z)

    return model


def paper_grid_search(
    log_c: NDArray[np.float64],
    reward: NDArray[np.float64],
    R0: float,
    A_grid: NDArray[np.float64] = PAPER_A_GRID,
    C_mid_grid: NDArray[np.float64] = PAPER_C_MID_GRID,
) -> GridOptimum:
    """The literal A.5 procedure: one ``curve_fit`` of B (default start B = 1) per (A, C_mid) cell.

    ``log_c`` is ``ln C`` of the fitted points. Cells where curve_fit fails are skipped, as a
    try/except around it would. Iteration order is A outer, C_mid inner; the first strict minimum
    wins. The model is fed ``z = ln C - ln C_mid`` so each call costs one logistic, not a power.
    """
    A_grid = _check_grid("A", A_grid, positive=False)
    C_mid_grid = _check_grid("C_mid", C_mid_grid, positive=True)
    best: tuple[float, int, int, float] | None = None
    sse_all = np.full((A_grid.size, C_mid_grid.size), np.inf)
    b_all = np.full_like(sse_all, np.nan)
    for i, A in enumerate(A_grid):
        model = _cell_model(R0, float(A) - R0)
        for j, C_mid in enumerate(C_mid_grid):
            z = log_c - np.log(C_mid)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                try:
                    popt, _ = curve_fit(model, z, reward)
                except (RuntimeError, ValueError):
                    continue
            B = float(popt[0])
            sse = float(np.sum((reward - model(z, B)) ** 2))
            sse_all[i, j], b_all[i, j] = sse, B
            if best is None or sse < best[0]:
                best = (sse, i, j, B)
    if best is None:
        raise CurveError("curve_fit failed in every grid cell")
    sse, i, j, B = best
    return GridOptimum(
        A=float(A_grid[i]),
        B=B,
        C_mid=float(C_mid_grid[j]),
        sse=sse,
        A_index=i,
        C_mid_index=j,
        A_count=A_grid.size,
        C_mid_count=C_mid_grid.size,
        A_range=(float(A_grid.min()), float(A_grid.max())),
        C_mid_range=(float(C_mid_grid.min()), float(C_mid_grid.max())),
        top=_top_cells(sse_all, b_all, A_grid, C_mid_grid, k=5),
    )


def _top_cells(
    sse: NDArray[np.float64],
    b: NDArray[np.float64],
    A_grid: NDArray[np.float64],
    C_mid_grid: NDArray[np.float64],
    k: int,
) -> NDArray[np.float64]:
    """Rows ``(A, B, C_mid, sse)`` of the ``k`` lowest finite-SSE cells, best first."""
    flat = np.argsort(sse, axis=None)[:k]
    rows = []
    for f in flat:
        i, j = np.unravel_index(f, sse.shape)
        if np.isfinite(sse[i, j]):
            rows.append((A_grid[i], b[i, j], C_mid_grid[j], sse[i, j]))
    return np.array(rows, dtype=np.float64).reshape(-1, 4)


def _newton_lnB(
    z: NDArray[np.float64],
    d: NDArray[np.float64],
    a: NDArray[np.float64],
    lo: NDArray[np.float64],
    hi: NDArray[np.float64],
    u: NDArray[np.float64],
    iters: int = 40,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Minimize ``f(u) = sum_i (d_i - a_k expit(e^u z_ki))^2`` over ``u = ln B`` for K cells at once.

    Safeguarded Newton on ``f'(u) = 0`` inside the bracket ``[lo, hi]`` (the coarse neighbours of
    the coarse minimum): with ``t = B z``, ``s = expit(t)``, ``r = d - a s`` and ``g = a s (1-s) t``
    (the model's derivative in u), ``f'/2 = -sum r g`` and
    ``f''/2 = sum g^2 - sum r a s (1-s) t (1 + (1 - 2s) t)``. A Newton step that leaves the
    bracket, or a non-positive curvature, falls back to bisection, so every cell converges to the
    stationary point curve_fit finds (quadratically near it). Returns ``(u, sse)``.
    """
    lo, hi, u = lo.copy(), hi.copy(), u.copy()
    for _ in range(iters):
        t = np.exp(u)[:, None] * z
        s = expit(t)
        r = d[None, :] - a[:, None] * s
        q = s * (1.0 - s) * t
        g = a[:, None] * q
        grad = -np.einsum("ki,ki->k", r, g)
        hess = np.einsum("ki,ki->k", g, g) - np.einsum(
            "ki,ki->k", r, a[:, None] * q * (1.0 + (1.0 - 2.0 * s) * t)
        )
        # Shrink the bracket with the sign of the gradient, then try Newton, else bisect.
        lo = np.where(grad < 0, u, lo)
        hi = np.where(grad > 0, u, hi)
        newton = u - grad / np.where(hess > 0, hess, 1.0)
        # Inclusive: at convergence u sits on a bracket end and the Newton step is below one ulp.
        ok = (hess > 0) & (newton >= lo) & (newton <= hi)
        u_new = np.where(ok, newton, 0.5 * (lo + hi))
        u_new = np.where(grad == 0, u, u_new)
        # 1e-9 in ln B is B to nine digits; tighter only chases rounding in the gradient.
        done = (np.abs(u_new - u) < 1e-9) | (hi - lo < 1e-9)
        u = u_new
        if done.all():
            break
    s = expit(np.exp(u)[:, None] * z)
    r = d[None, :] - a[:, None] * s
    return u, np.einsum("ki,ki->k", r, r)


@dataclass(frozen=True, eq=False)
class CoarseSurface:
    """Per-cell minimum over B on a log-spaced B axis, parabola-interpolated.

    ``est[i, j]``: estimated min SSE of cell (A_i, C_mid_j); ``u0``: its ln B; ``jb``: index of the
    axis minimum on ``u_axis``; ``s0``: the SSE there (an SSE the cell really attains, so an upper
    bound on its minimum); ``lower``: ``s0 - curv``, where ``curv`` is the second difference around
    ``jb`` -- eight times the parabola's own drop, a deliberately generous lower estimate used to
    decide which cells can still win. ``z`` is ``ln C - ln C_mid`` per C_mid row, ``d = R - R0``.
    """

    est: NDArray[np.float64]
    u0: NDArray[np.float64]
    jb: NDArray[np.intp]
    s0: NDArray[np.float64]
    lower: NDArray[np.float64]
    u_axis: NDArray[np.float64]
    z: NDArray[np.float64]
    d: NDArray[np.float64]
    a: NDArray[np.float64]


def coarse_surface(
    log_c: NDArray[np.float64],
    reward: NDArray[np.float64],
    R0: float,
    A_grid: NDArray[np.float64],
    C_mid_grid: NDArray[np.float64],
    n_B: int = 32,
    u_range: tuple[float, float] | None = None,
) -> CoarseSurface:
    """Price every (A, C_mid, B) triple on a ``n_B``-point ln B axis with two sums per (C_mid, B)
    pair (module docstring). ``u_range`` limits the axis (default: ``ln GRID_B_RANGE``)."""
    d = reward - R0
    a = A_grid - R0
    v = np.log(C_mid_grid)
    lo, hi = u_range if u_range is not None else (np.log(GRID_B_RANGE[0]), np.log(GRID_B_RANGE[1]))
    u_axis = np.linspace(lo, hi, n_B)
    h = u_axis[1] - u_axis[0]
    z = log_c[None, :] - v[:, None]  # (nC, n)
    S = expit(np.exp(u_axis)[None, :, None] * z[:, None, :])  # (nC, nB, n)
    Sd = S @ d  # (nC, nB)
    Ss = np.einsum("cbi,cbi->cb", S, S)
    # SSE[a, c, b] = sum d^2 + a (a Ss - 2 Sd), built in place: this array dominates the cost.
    a3 = a[:, None, None]
    sse = np.multiply(a3, Ss[None], out=np.empty((a.size, *Ss.shape)))
    sse -= 2.0 * Sd[None]
    sse *= a3
    sse += d @ d
    jb = np.argmin(sse, axis=2)
    s0 = np.take_along_axis(sse, jb[..., None], axis=2)[..., 0]
    # Parabola through the axis minimum and its two neighbours: estimated cell minimum and its u.
    jm, jp = np.clip(jb - 1, 0, n_B - 1), np.clip(jb + 1, 0, n_B - 1)
    sm = np.take_along_axis(sse, jm[..., None], axis=2)[..., 0]
    sp = np.take_along_axis(sse, jp[..., None], axis=2)[..., 0]
    curv = np.maximum(sp - 2.0 * s0 + sm, 0.0)
    interior = (jb > 0) & (jb < n_B - 1) & (curv > 0)
    safe_curv = np.where(interior, curv, 1.0)
    est = np.where(interior, s0 - (sp - sm) ** 2 / (8.0 * safe_curv), s0)
    u0 = u_axis[jb] + np.where(interior, -h * (sp - sm) / (2.0 * safe_curv), 0.0)
    return CoarseSurface(est=est, u0=u0, jb=jb, s0=s0, lower=s0 - curv, u_axis=u_axis, z=z, d=d, a=a)


def _contenders(surf: CoarseSurface) -> NDArray[np.bool_]:
    """Cells that can still hold the minimum: generous lower estimate <= the best attained SSE."""
    return surf.lower <= surf.s0.min()


def fast_grid_search(
    log_c: NDArray[np.float64],
    reward: NDArray[np.float64],
    R0: float,
    A_grid: NDArray[np.float64],
    C_mid_grid: NDArray[np.float64],
    n_B: int = 32,
    n_top: int = 5,
) -> GridOptimum:
    """Vectorized A.5 search: same winning cell as ``paper_grid_search``, B to ~1e-9.

    1. Coarse pass: every cell on a 32-point ln B axis over ``GRID_B_RANGE``.
    2. Zoom pass: only the A rows and C_mid columns holding a contender (a cell whose generous
       lower estimate is below the best SSE actually attained), on a 32-point ln B axis spanning
       the contenders' B brackets.
    3. Exact: safeguarded Newton in ln B on the zoom pass's contenders whose estimate is within
       2 % of the best (at least 16 cells); the lowest exact SSE wins, ties going to the first
       cell in the literal loop's order.

    B is restricted to ``GRID_B_RANGE`` (B > 0: reward rises with compute); the literal search
    lets curve_fit wander to B < 0, which only matters in cells that cannot win on a rising curve.
    """
    A_grid = _check_grid("A", A_grid, positive=False)
    C_mid_grid = _check_grid("C_mid", C_mid_grid, positive=True)
    coarse = coarse_surface(log_c, reward, R0, A_grid, C_mid_grid, n_B)
    near = _contenders(coarse)
    rows, cols = np.flatnonzero(near.any(axis=1)), np.flatnonzero(near.any(axis=0))
    jb_near = coarse.jb[near]
    u_lo = coarse.u_axis[max(int(jb_near.min()) - 1, 0)]
    u_hi = coarse.u_axis[min(int(jb_near.max()) + 1, n_B - 1)]
    surf = coarse_surface(log_c, reward, R0, A_grid[rows], C_mid_grid[cols], n_B, (u_lo, u_hi))
    flat_est = surf.est.ravel()
    order = np.argsort(flat_est)
    # On the zoomed axis the parabola estimates are within a fraction of a percent of the exact
    # minima; 2 % (and never fewer than 16 cells) leaves a wide safety margin for the exact step.
    close = surf.est <= surf.est.min() * 1.02 + 1e-12 * max(float(surf.d @ surf.d), 1e-300)
    n_cand = int(np.clip(np.count_nonzero(close & _contenders(surf)), 16, 512))
    cand = order[:n_cand]
    iz, jz = np.unravel_index(cand, surf.est.shape)
    jb_c = surf.jb.ravel()[cand]
    lo = surf.u_axis[np.clip(jb_c - 1, 0, n_B - 1)]
    hi = surf.u_axis[np.clip(jb_c + 1, 0, n_B - 1)]
    u_ref, sse_ref = _newton_lnB(
        surf.z[jz], surf.d, surf.a[iz], lo, hi, np.clip(surf.u0.ravel()[cand], lo, hi)
    )
    ia, ic = rows[iz], cols[jz]
    rank = np.argsort(sse_ref, kind="stable")
    # Equal SSE: the literal loop keeps the first cell in (A, C_mid) order; do the same.
    ties = rank[sse_ref[rank] <= sse_ref[rank[0]]]
    w = ties[np.argmin(ia[ties] * C_mid_grid.size + ic[ties])]
    top_idx = rank[:n_top]
    top = np.column_stack(
        [A_grid[ia[top_idx]], np.exp(u_ref[top_idx]), C_mid_grid[ic[top_idx]], sse_ref[top_idx]]
    )
    return GridOptimum(
        A=float(A_grid[ia[w]]),
        B=float(np.exp(u_ref[w])),
        C_mid=float(C_mid_grid[ic[w]]),
        sse=float(sse_ref[w]),
        A_index=int(ia[w]),
        C_mid_index=int(ic[w]),
        A_count=A_grid.size,
        C_mid_count=C_mid_grid.size,
        A_range=(float(A_grid.min()), float(A_grid.max())),
        C_mid_range=(float(C_mid_grid.min()), float(C_mid_grid.max())),
        top=top,
    )


def best_cell_per_A(
    log_c: NDArray[np.float64],
    reward: NDArray[np.float64],
    R0: float,
    A_values: NDArray[np.float64],
    C_mid_grid: NDArray[np.float64],
    n_B: int = 32,
) -> NDArray[np.float64]:
    """For each fixed A, the coarse best ``(ln B, ln C_mid)``: starting points for a profile of A."""
    surf = coarse_surface(log_c, reward, R0, np.asarray(A_values, dtype=np.float64), C_mid_grid, n_B)
    jc = np.argmin(surf.est, axis=1)
    rows = np.arange(surf.est.shape[0])
    return np.column_stack([surf.u0[rows, jc], np.log(C_mid_grid)[jc]])


def adaptive_grids(
    compute: NDArray[np.float64],
    reward: NDArray[np.float64],
    R0: float,
    A_upper: float,
    n_A: int = 71,
    n_C_mid: int = 100,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Data-scaled grids for the fast method (any reward scale, any compute unit).

    A: ``n_A`` values from ``R0 + 0.5 * rise`` to ``max(R) + 3 * rise`` (capped at ``A_upper``),
    where ``rise = max(R) - R0``; noise can put A below the best observed reward, and a curve far
    from saturation can put it well above. C_mid: ``n_C_mid`` log-spaced values from a tenth of the
    first to ten times the last fitted compute (log spacing because compute spans decades and the
    paper's 100..40000 linear grid would be meaningless in FLOPs).
    """
    top = float(np.max(reward))
    rise = top - R0
    if not rise > 0:
        # Flat or falling curve: keep a tiny non-degenerate grid; the fit is flagged elsewhere.
        rise = max(abs(top), abs(R0), 1.0) * 1e-3
    lo = R0 + 0.5 * rise
    hi = top + 3.0 * rise
    if np.isfinite(A_upper):
        hi = min(hi, A_upper)
        lo = min(lo, hi)
    A_grid = np.linspace(lo, hi, n_A) if hi > lo else np.array([hi])
    C_mid_grid = np.geomspace(compute.min() / 10.0, compute.max() * 10.0, n_C_mid)
    return A_grid, C_mid_grid
