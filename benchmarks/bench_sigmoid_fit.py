"""Benchmark: the literal ScaleRL A.5 grid search vs ``fit_sigmoid(method="fast")``.

Both run in this process on the same data and the same 71 x 100 paper grid. The literal search
fits B with one ``scipy.optimize.curve_fit`` call per (A, C_mid) cell (7,100 calls); the fast
method prices the whole grid with vectorized sums, refines only the cells that can win, then
refines (A, B, C_mid) continuously. Printed per dataset: wall time of each, the speed ratio, and
whether the fast method found the same cell (A, C_mid) with B within 1e-3. Also times 1,000
bootstrap refits. Exit status 1 if any dataset disagrees.

    .venv/bin/python benchmarks/bench_sigmoid_fit.py            # six curves (~20 s idle, longer under load)
    .venv/bin/python benchmarks/bench_sigmoid_fit.py --quick    # the Fig. 1 curve only (a few seconds)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scalerl.scaling import PAPER_A_GRID, PAPER_C_MID_GRID, bootstrap, fit_sigmoid, reference_csv
from scalerl.scaling.forms import sigmoid_reward
from scalerl.scaling.io import read_curves


@dataclass(frozen=True)
class Dataset:
    name: str
    compute: NDArray[np.float64]
    reward: NDArray[np.float64]
    r0: float
    max_compute: float | None = None


def datasets(quick: bool) -> list[Dataset]:
    """The digitized paper curves, plus synthetic 75-point curves like the paper's eval cadence."""
    dense = read_curves(reference_csv("scalerl_8b_dense_fig1a"))[0]
    out = [Dataset("8B dense Fig.1, fit <= 50k GPU-h", dense.x, dense.y, 0.4017, 50000.0)]
    if quick:
        return out
    scout = read_curves(reference_csv("scalerl_scout_moe_fig1a"))[0]
    out.append(Dataset("8B dense Fig.1, all points", dense.x, dense.y, 0.4017))
    out.append(Dataset("Scout MoE Fig.1, all points", scout.x, scout.y, 0.5116))
    rng = np.random.default_rng(0)
    for k, (A, B, C_mid) in enumerate([(0.61, 1.92, 2542.0), (0.645, 1.70, 10909.0), (0.59, 2.44, 2542.0)]):
        c = np.linspace(100.0, 7500.0 if C_mid < 5000 else 50000.0, 75)
        y = sigmoid_reward(c, A, B, C_mid, 0.4) + rng.normal(0, 0.005, c.size)
        out.append(Dataset(f"synthetic #{k + 1} (Table 1 A={A}, B={B}), 75 points", c, y, 0.4))
    return out


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Median wall time of ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one dataset, fewer repeats")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of the fast fit (median taken)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 15)
    ok = True
    ratios = []
    print(
        f"grid: A {PAPER_A_GRID[0]}..{PAPER_A_GRID[-1]} ({PAPER_A_GRID.size}), "
        f"C_mid {PAPER_C_MID_GRID[0]:g}..{PAPER_C_MID_GRID[-1]:g} ({PAPER_C_MID_GRID.size}); "
        f"literal = {PAPER_A_GRID.size * PAPER_C_MID_GRID.size} curve_fit calls\n"
    )
    for ds in datasets(args.quick):
        kw = {"r0": ds.r0, "max_compute": ds.max_compute}
        t_paper, paper = timed(
            lambda ds=ds, kw=kw: fit_sigmoid(ds.compute, ds.reward, method="paper", **kw), 1
        )
        t_fast, fast = timed(
            lambda ds=ds, kw=kw: fit_sigmoid(
                ds.compute, ds.reward, method="fast", A_grid=PAPER_A_GRID, C_mid_grid=PAPER_C_MID_GRID, **kw
            ),
            repeats,
        )
        t_auto, auto = timed(lambda ds=ds, kw=kw: fit_sigmoid(ds.compute, ds.reward, **kw), repeats)
        g = fast.grid  # type: ignore[union-attr]
        same = (g.A, g.C_mid) == (paper.A, paper.C_mid)  # type: ignore[union-attr]
        dB = abs(g.B - paper.B)  # type: ignore[union-attr]
        agree = same and dB <= 1e-3
        ok &= agree
        ratio = t_paper / t_fast
        ratios.append(ratio)
        print(f"{ds.name}  (n = {fast.diagnostics.n_points})")  # type: ignore[union-attr]
        print(
            f"  literal A.5 grid : {t_paper * 1e3:8.1f} ms   A = {paper.A:.3f}, C_mid = {paper.C_mid:.1f}, "  # type: ignore[union-attr]
            f"B = {paper.B:.6f}"
        )  # type: ignore[union-attr]
        print(
            f"  fast, paper grid : {t_fast * 1e3:8.1f} ms   cell A = {g.A:.3f}, C_mid = {g.C_mid:.1f}, "
            f"B = {g.B:.6f}  -> same cell: {same}, |dB| = {dB:.1e}"
        )
        print(
            f"    refined        :              A = {fast.A:.4f}, B = {fast.B:.4f}, "  # type: ignore[union-attr]
            f"C_mid = {fast.C_mid:.1f}"
        )  # type: ignore[union-attr]
        print(
            f"  fast, auto grid  : {t_auto * 1e3:8.1f} ms   A = {auto.A:.4f}, B = {auto.B:.4f}, "  # type: ignore[union-attr]
            f"C_mid = {auto.C_mid:.1f}"
        )  # type: ignore[union-attr]
        print(f"  speed ratio literal / fast: {ratio:.0f}x   agreement: {'OK' if agree else 'MISMATCH'}\n")
    first = datasets(True)[0]
    fit = fit_sigmoid(first.compute, first.reward, r0=first.r0, max_compute=first.max_compute)
    t_boot, boot = timed(lambda: bootstrap(fit, n_boot=1000, seed=0), 3)
    lo, hi = boot.interval("A")  # type: ignore[union-attr]
    print(f"1000 bootstrap refits ({first.name}): {t_boot * 1e3:.0f} ms; A 95% interval [{lo:.4f}, {hi:.4f}]")
    print(
        f"\nspeed ratio: min {min(ratios):.0f}x, median {statistics.median(ratios):.0f}x; "
        f"all cells agree: {ok}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
