"""The vectorized grid search must find the literal A.5 search's cell (B within 1e-3)."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl.scaling import PAPER_A_GRID, PAPER_C_MID_GRID, fit_sigmoid
from scalerl.scaling.grids import (
    GridOptimum,
    adaptive_grids,
    best_cell_per_A,
    fast_grid_search,
    paper_grid_search,
)
from scalerl.scaling.io import Curve


def test_paper_grids_are_as_published() -> None:
    assert PAPER_A_GRID.size == 71
    assert PAPER_A_GRID[0] == 0.45 and PAPER_A_GRID[-1] == 0.8
    np.testing.assert_allclose(np.diff(PAPER_A_GRID), 0.005, atol=1e-12)
    assert PAPER_C_MID_GRID.size == 100
    assert PAPER_C_MID_GRID[0] == 100.0 and PAPER_C_MID_GRID[-1] == 40000.0
    np.testing.assert_allclose(np.diff(PAPER_C_MID_GRID), (40000 - 100) / 99)


@pytest.fixture(scope="module")
def literal_50k(dense_8b: Curve) -> GridOptimum:
    """The literal A.5 search (7,100 curve_fit calls) on the Fig. 1 curve up to 50k GPU-h, run once."""
    m = dense_8b.x <= 50000
    return paper_grid_search(np.log(dense_8b.x[m]), dense_8b.y[m], 0.4017)


def test_fast_matches_literal_on_paper_grid_reference_curve(
    dense_8b: Curve, literal_50k: GridOptimum
) -> None:
    """Full 71 x 100 paper grid on the digitized Fig. 1 curve (fit window up to 50k GPU-h)."""
    m = dense_8b.x <= 50000
    x, y = np.log(dense_8b.x[m]), dense_8b.y[m]
    lit = literal_50k
    fast = fast_grid_search(x, y, 0.4017, PAPER_A_GRID, PAPER_C_MID_GRID)
    assert (fast.A_index, fast.C_mid_index) == (lit.A_index, lit.C_mid_index)
    assert pytest.approx(lit.B, abs=1e-3) == fast.B
    assert fast.sse <= lit.sse * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_fast_matches_literal_on_random_curves(seed: int) -> None:
    """Random curves, noise and R0 on a coarser copy of the paper grid (keeps the literal loop quick)."""
    rng = np.random.default_rng(100 + seed)
    A, B, C_mid = rng.uniform(0.5, 0.75), rng.uniform(0.8, 3.0), rng.uniform(800, 30000)
    R0 = rng.uniform(0.2, 0.45)
    c = np.sort(rng.uniform(200, 80000, 30))
    y = R0 + (A - R0) / (1 + (C_mid / c) ** B) + rng.normal(0, 0.01, c.size)
    a_grid = np.round(np.arange(0.45, 0.8001, 0.025), 3)
    m_grid = np.linspace(100, 40000, 25)
    lit = paper_grid_search(np.log(c), y, R0, a_grid, m_grid)
    fast = fast_grid_search(np.log(c), y, R0, a_grid, m_grid)
    assert (fast.A, fast.C_mid) == (lit.A, lit.C_mid)
    assert pytest.approx(lit.B, abs=1e-3) == fast.B


def test_fit_sigmoid_fast_on_paper_grid_records_the_paper_cell_then_refines(
    dense_8b: Curve, literal_50k: GridOptimum
) -> None:
    lit = literal_50k
    fit = fit_sigmoid(
        dense_8b.x, dense_8b.y, r0=0.4017, max_compute=50000, A_grid=PAPER_A_GRID, C_mid_grid=PAPER_C_MID_GRID
    )
    assert fit.grid is not None
    assert (fit.grid.A, fit.grid.C_mid) == (lit.A, lit.C_mid)
    assert pytest.approx(lit.B, abs=1e-3) == fit.grid.B
    # The continuous refinement can only lower the SSE, and moves off the grid.
    assert fit.diagnostics.sse <= lit.sse
    assert fit.A not in PAPER_A_GRID


def test_grid_edge_flags() -> None:
    c = np.geomspace(100, 1e5, 30)
    y = 0.3 + 0.5 / (1 + (3000 / c) ** 1.5)  # A = 0.8: the top edge of a grid ending at 0.7
    opt = fast_grid_search(np.log(c), y, 0.3, np.linspace(0.5, 0.7, 21), np.geomspace(100, 1e5, 40))
    assert pytest.approx(0.7) == opt.A and opt.A_at_edge
    single = fast_grid_search(np.log(c), y, 0.3, np.array([0.8]), np.geomspace(100, 1e5, 40))
    assert not single.A_at_edge and single.C_mid == pytest.approx(3000, rel=0.1)


def test_adaptive_grids_follow_units_and_scale() -> None:
    c = np.geomspace(1e18, 1e21, 20)
    y = np.linspace(-0.8, 0.4, 20)
    a_grid, m_grid = adaptive_grids(c, y, -0.8, np.inf)
    assert m_grid[0] == pytest.approx(1e17) and m_grid[-1] == pytest.approx(1e22)
    assert a_grid[0] == pytest.approx(-0.2) and a_grid[-1] == pytest.approx(4.0)
    capped, _ = adaptive_grids(c, y, -0.8, 1.0)
    assert capped[-1] == 1.0


def test_best_cell_per_A_follows_the_true_curve() -> None:
    c = np.geomspace(100, 1e5, 40)
    y = 0.3 + 0.4 / (1 + (3000 / c) ** 2.0)
    starts = best_cell_per_A(np.log(c), y, 0.3, np.array([0.7]), np.geomspace(100, 1e5, 80))
    assert np.exp(starts[0, 0]) == pytest.approx(2.0, rel=0.1)
    assert np.exp(starts[0, 1]) == pytest.approx(3000, rel=0.1)


def test_grid_input_checks() -> None:
    x = np.log(np.geomspace(100, 1e4, 10))
    y = np.linspace(0.3, 0.5, 10)
    with pytest.raises(ValueError, match="C_mid grid values must be > 0"):
        fast_grid_search(x, y, 0.3, np.array([0.6]), np.array([0.0, 10.0]))
    with pytest.raises(ValueError, match="A grid"):
        paper_grid_search(x, y, 0.3, np.array([]), np.array([10.0]))
