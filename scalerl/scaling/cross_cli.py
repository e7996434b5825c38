"""``scalerl fit-cross``: the cross-model-size law of Tan et al. 2025 fitted to runs of several sizes.

    scalerl fit-cross runs/qwen-0.5b runs/qwen-1.5b runs/qwen-3b --size qwen-0.5b=0.5B \\
        --size qwen-1.5b=1.5B --size qwen-3b=3B --predict 7B 1e20 --validate

Each run is a learning curve (a run directory, CSV or JSONL, read as ``scalerl fit`` reads them;
x defaults to ``flops``, which compares across model sizes, unlike device-hours) and a model size N
in parameters: ``--size LABEL=N`` (``0.5B``, ``135M``, ``7e9``), else a ``model_size`` column. The law
(``scalerl.scaling.cross_model``) ``L = 1 - pass = 10^E0(N) X^-k(N)``, ``k(N) = k_max N / (N + N0)``,
``E0(N) = k(N) (c0 + r log10 N)`` is fitted jointly to every point. Points the log scale cannot
hold are left out and counted: ``X <= 0`` (the evaluation at the start of a run) and pass rate 1
(zero loss). ``--predict N X`` predicts a size and compute, an unseen larger N included;
``--validate`` refits without the largest size and reports the error on it (how far the law
extrapolates on your runs). A subcommand of ``scalerl`` rather than a ``fit`` mode: its input
(runs with sizes) and its output (one law, not one sigmoid per run) differ from ``fit``'s.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scalerl.scaling.cross_model import CrossModelFit, fit_cross_model
from scalerl.scaling.io import Curve, read_many
from scalerl.scaling.report import jsonable, num, table

SIZE_COLUMN = "model_size"
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*$")
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> float:
    """A parameter count: ``7e9``, ``7B``, ``135M``, ``1.5b`` (k, M, B, T suffixes)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"model size {text!r}: expected a number of parameters such as 7e9, 7B or 135M")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"model size {text!r}: must be > 0")
    return value


def _size_arg(text: str) -> tuple[str, float]:
    label, sep, size = text.rpartition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=N (e.g. qwen-7b=7B), got {text!r}")
    try:
        return label, parse_size(size)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


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
        raise ValueError(f"--size {unknown[0]}: no run has this label (runs: {have})")
    out = []
    for c in curves:
        N = sizes.get(c.label)
        if N is None and SIZE_COLUMN in c.extra:
            values = c.extra[SIZE_COLUMN][np.isfinite(c.extra[SIZE_COLUMN])]
            if values.size and np.all(values == values[0]) and values[0] > 0:
                N = float(values[0])
        if N is None:
            raise ValueError(f"{c.label} ({c.source}): no model size; pass --size {c.label}=N "
                             f"(e.g. 1.5B) or give the rows a {SIZE_COLUMN} column")
        keep = c.x > 0
        if min_x is not None:
            keep &= c.x >= min_x
        solved = keep & (c.y >= 1.0)
        dropped_x = int((~keep).sum())
        keep &= c.y < 1.0
        if keep.sum() < 2:
            raise ValueError(f"{c.label} ({c.source}): fewer than 2 points with {c.x_name} > 0 and "
                             "pass rate < 1")
        out.append(SizedRun(c.label, c.source, float(N), c.x[keep], c.y[keep], dropped_x, int(solved.sum())))
    return out


def _law_input(runs: Sequence[SizedRun]) -> list[tuple[float, NDArray[np.float64], NDArray[np.float64]]]:
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
        raise ValueError("--validate: needs runs of at least three model sizes (two to fit, one held out)")
    top = sizes[-1]
    law = fit_cross_model(_law_input([r for r in runs if top != r.N]))
    held = [r for r in runs if top == r.N]
    X = np.concatenate([r.X for r in held])
    p = np.concatenate([r.pass_rate for r in held])
    pred = law.predict(top, X)
    err = np.abs(pred - p)
    rmse = float(np.sqrt(np.mean((np.log10(law.loss(top, X)) - np.log10(1.0 - p)) ** 2)))
    return Validation(top, int(X.size), float(err.mean()), float(err.max()), rmse)


def render(law: CrossModelFit, runs: Sequence[SizedRun], x_name: str, y_name: str,
           predictions: Sequence[tuple[float, float, float]], validation: Validation | None) -> str:
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
    return "\n".join(lines)


def run_fit_cross(args: argparse.Namespace) -> int:
    sizes: dict[str, float] = {}
    for label, N in args.size:
        if label in sizes:
            raise ValueError(f"--size {label}: given twice")
        sizes[label] = N
    curves = read_many(args.paths, x=args.x, y=args.y)
    runs = sized_runs(curves, sizes, args.min_x)
    law = fit_cross_model(_law_input(runs))
    predictions = []
    for n_text, x_text in args.predict or ():
        N, X = parse_size(n_text), float(x_text)
        if not (math.isfinite(X) and X > 0):
            raise ValueError(f"--predict {n_text} {x_text}: X must be > 0")
        predictions.append((N, X, float(law.predict(N, X))))
    validation = validate_largest(runs) if args.validate else None
    x_name, y_name = curves[0].x_name, curves[0].y_name
    if args.json:
        out = {
            "model": "L = 1 - pass = 10^E0(N) X^-k(N); k(N) = k_max N/(N+N0); E0(N) = k(N)(c0 + r log10 N)",
            "x": x_name, "y": y_name, "law": law.to_dict(),
            "runs": [{"label": r.label, "source": r.source, "N": r.N, "points": int(r.X.size),
                      "k": float(law.k(r.N)), "dropped_nonpositive_x": r.dropped_x,
                      "dropped_solved": r.dropped_solved} for r in runs],
            "predictions": [{"N": N, "X": X, "pass_rate": p} for N, X, p in predictions],
            "validation": None if validation is None else validation.__dict__,
        }
        sys.stdout.write(json.dumps(jsonable(out), indent=2, allow_nan=False) + "\n")
    else:
        sys.stdout.write(render(law, runs, x_name, y_name, predictions, validation) + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "fit-cross",
        help="fit the cross-model-size law (Tan et al.) to runs of many sizes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="run directory (metrics.jsonl), .csv or .jsonl, one or more runs per model size")
    p.add_argument("--size", type=_size_arg, action="append", default=[], metavar="LABEL=N",
                   help="model size of the run LABEL in parameters (7B, 135M, 7e9); repeatable")
    p.add_argument("--x", default="flops", metavar="COL", help="training resource column (default flops)")
    p.add_argument("--y", metavar="COL", help="pass-rate column (default val_pass_rate)")
    p.add_argument("--min-x", type=float, metavar="X", help="fit only points with x >= X")
    p.add_argument("--predict", nargs=2, action="append", metavar=("N", "X"),
                   help="predict the pass rate of size N after resource X (repeatable)")
    p.add_argument("--validate", action="store_true",
                   help="refit without the largest size and report the error on it")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_fit_cross)


__all__ = ["SizedRun", "Validation", "parse_size", "register", "run_fit_cross", "sized_runs",
           "validate_largest"]
