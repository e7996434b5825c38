"""The cross-model-size law on learning curves: sizes attached, points the law can hold, validation.

`sized_runs` attaches a model size N (given by label, else a `model_size` column) to every curve
and keeps the points the law's log scale can hold (X > 0, pass rate < 1), counting the others;
`validate_largest` refits the law (`scalerl.scaling.cross_model`) without the largest size and
scores it there; `render` writes the fit as `scalerl fit-cross` prints it. `parse_size` reads a
parameter count (`7B`, `135M`, `7e9`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scalerl.scaling.cross_model import CrossModelFit, SizeChoice, fit_cross_model
from scalerl.scaling.io import Curve
from scalerl.scaling.report import num, table
from scalerl.scaling.validation import CurveError

SIZE_COLUMN = "model_size"
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*$")
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> float:
    """A parameter count: ``7e9``, ``7B``, ``135M``, ``1.5b`` (k, M, B, T suffixes)."""
    m = _SIZE.match(text)
    if not m:
        raise CurveError(f"model size {text!r}: expected a number of parameters such as 7e9, 7B or 135M")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not (math.isfinite(value) and value > 0):
        raise CurveError(f"model size {text!r}: must be > 0")
    return value


@dataclass(frozen=True)
class SizedRun:
    """One run's usable points and its size; `dropped` counts the points the log scale cannot hold."""

    label: str
    source: str
    N: float
    X: NDArray[np.float64]
    pass_rate: NDArray[np.float64]
    dropped_x: int
    dropped_solved: int


def sized_runs(
    curves: Sequence[Curve], sizes: dict[str, float], min_x: float | None = None
) -> list[SizedRun]:
    """Attach a size to every curve (`sizes` by label, else its `model_size` column) and keep the
    points with X > 0 (and >= `min_x`) and pass rate < 1. Every error names the run."""
    unknown = sorted(set(sizes) - {c.label for c in curves})
    if unknown:
        have = ", ".join(c.label for c in curves)
        raise CurveError(f"--size {unknown[0]}: no run has this label (runs: {have})")
    out = []
    for c in curves:
        N = sizes.get(c.label)
        if N is None and SIZE_COLUMN in c.extra:
            values = c.extra[SIZE_COLUMN][np.isfinite(c.extra[SIZE_COLUMN])]
            if values.size and np.all(values == values[0]) and values[0] > 0:
                N = float(values[0])
        if N is None:
            raise CurveError(f"{c.label} ({c.source}): no model size; pass --size {c.label}=N "
                             f"(e.g. 1.5B) or give the rows a {SIZE_COLUMN} column")
        keep = c.x > 0
        if min_x is not None:
            keep &= c.x >= min_x
        solved = keep & (c.y >= 1.0)
        dropped_x = int((~keep).sum())
        keep &= c.y < 1.0
        if keep.sum() < 2:
            raise CurveError(f"{c.label} ({c.source}): fewer than 2 points with {c.x_name} > 0 and "
                             "pass rate < 1")
        out.append(SizedRun(c.label, c.source, float(N), c.x[keep], c.y[keep], dropped_x, int(solved.sum())))
    return out


def law_input(runs: Sequence[SizedRun]) -> list[tuple[float, NDArray[np.float64], NDArray[np.float64]]]:
    return [(r.N, r.X, r.pass_rate) for r in runs]


@dataclass(frozen=True)
class Validation:
    """The law refitted without the largest size, scored on that size's points."""

    held_out_size: float
    n_points: int
    mae: float  # in pass rate
    max_abs: float
    rmse_log10: float


def validate_largest(runs: Sequence[SizedRun]) -> Validation:
    """Fit on every size but the largest, predict the largest (it needs three sizes or more)."""
    sizes = sorted({r.N for r in runs})
    if len(sizes) < 3:
        raise CurveError("--validate: needs runs of at least three model sizes (two to fit, one held out)")
    top = sizes[-1]
    law = fit_cross_model(law_input([r for r in runs if top != r.N]))
    held = [r for r in runs if top == r.N]
    X = np.concatenate([r.X for r in held])
    p = np.concatenate([r.pass_rate for r in held])
    pred = law.predict(top, X)
    err = np.abs(pred - p)
    rmse = float(np.sqrt(np.mean((np.log10(law.loss(top, X)) - np.log10(1.0 - p)) ** 2)))
    return Validation(top, int(X.size), float(err.mean()), float(err.max()), rmse)


def render(law: CrossModelFit, runs: Sequence[SizedRun], x_name: str, y_name: str,
           predictions: Sequence[tuple[float, float, float]], validation: Validation | None,
           choices: Sequence[SizeChoice] = ()) -> str:
    lines = [
        "cross-model law (Tan et al. 2025, arXiv 2509.25300): L = 1 - pass = 10^E0(N) X^-k(N),",
        f"  k(N) = k_max N / (N + N0), E0(N) = k(N) (c0 + r log10 N); X = {x_name}, pass = {y_name}",
        f"  k_max = {num(law.k_max)}   N0 = {num(law.N0)}   c0 = {num(law.c0)}   r = {num(law.r)}   "
        f"RMSE(log10 L) = {num(law.rmse_log10, 3)} over {law.n_points} points",
        "",
    ]
    rows = []
    for r in runs:
        pred = law.predict(r.N, r.X)
        rows.append([r.label, num(r.N, 3), num(float(law.k(r.N)), 3), str(r.X.size),
                     f"{r.pass_rate[-1]:.3f}", f"{float(pred[-1]):.3f}",
                     num(float(np.mean(np.abs(pred - r.pass_rate))), 3)])
    lines.append(table(["run", "N", "k(N)", "points", "last pass", "law there", "mean abs err"], rows))
    dropped = [(r.label, r.dropped_x, r.dropped_solved) for r in runs if r.dropped_x or r.dropped_solved]
    for label, nx, ns in dropped:
        parts = ([f"{nx} with {x_name} <= 0 or below --min-x"] if nx else []) + (
            [f"{ns} with pass rate 1"] if ns else [])
        lines.append(f"  {label}: left out {' and '.join(parts)} (no logarithm there)")
    biggest = max(r.N for r in runs)
    for N, X, p in predictions:
        beyond = "  (beyond the largest fitted size: an extrapolation)" if biggest < N else ""
        lines.append(f"predicted pass rate at N = {num(N, 3)}, X = {num(X)}: {p:.4f}{beyond}")
    if validation is not None:
        v = validation
        lines.append(f"validation: fitted without N = {num(v.held_out_size, 3)}, predicted its {v.n_points} "
                     f"points with mean abs error {v.mae:.3f} (max {v.max_abs:.3f}) in pass rate, "
                     f"RMSE(log10 L) {v.rmse_log10:.3f}")
    lines += [size_choice_text(c, law, x_name) for c in choices]
    return "\n".join(lines)


def size_choice_text(c: SizeChoice, law: CrossModelFit, x_name: str) -> str:
    """`scalerl fit-cross --budget`'s answer: the size, its predicted pass rate, the caveats."""
    where = (f"among {len(c.candidates)} candidate sizes" if c.candidates is not None else
             f"over the fitted sizes {num(min(law.sizes), 3)}-{num(max(law.sizes), 3)}")
    notes = []
    if c.extrapolated:
        notes.append("outside the fitted sizes: an extrapolation")
    if c.at_edge:
        notes.append("on the edge of the fitted sizes: the law's optimum may lie beyond it "
                     "(--sizes to compare larger or smaller ones)")
    if c.budget_outside:
        notes.append(f"the budget lies outside the fitted {x_name} range "
                     f"{num(law.x_range[0], 3)}-{num(law.x_range[1], 3)}")
    head = (f"compute-optimal size at {x_name} = {num(c.budget, 4)} ({where}): N = {num(c.N, 3)}, "
            f"predicted pass rate {c.pass_rate:.4f}" + (f"  ({'; '.join(notes)})" if notes else ""))
    if c.candidates is None:
        return head
    def note(n: float, p: float) -> str:
        parts = [] if min(law.sizes) <= n <= max(law.sizes) else ["extrapolation"]
        if p < 0:  # L > 1: the budget lies before this size's pivot X* = 10^c0 N^r
            parts.append("budget below its pivot 10^c0 N^r (L > 1)")
        return "; ".join(parts)

    rows = [[num(n, 3), f"{p:.4f}", "yes" if n == c.N else "", note(n, p)] for n, p in c.candidates]
    return head + "\n" + table(["N", "predicted pass", "best", "note"], rows)


__all__ = ["SIZE_COLUMN", "SizedRun", "Validation", "law_input", "parse_size", "render", "size_choice_text",
           "sized_runs", "validate_largest"]
