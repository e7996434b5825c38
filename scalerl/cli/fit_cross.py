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
extrapolates on your runs). ``--budget C`` (repeatable) answers "which model size N for budget C":
the N with the highest predicted pass rate at X = C, continuous over the fitted sizes, or among
``--sizes 1B,3B,7B`` (flagged where a candidate lies outside the fitted sizes: an extrapolation).
A subcommand of ``scalerl`` rather than a ``fit`` mode: its input
(runs with sizes) and its output (one law, not one sigmoid per run) differ from ``fit``'s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from scalerl.inputs import InputError
from scalerl.scaling.cross_model import fit_cross_model, optimal_size
from scalerl.scaling.cross_runs import law_input, parse_size, render, sized_runs, validate_largest
from scalerl.scaling.io import read_many
from scalerl.scaling.report import jsonable


def _size_arg(text: str) -> tuple[str, float]:
    label, sep, size = text.rpartition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=N (e.g. qwen-7b=7B), got {text!r}")
    try:
        return label, parse_size(size)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run_fit_cross(args: argparse.Namespace) -> int:
    sizes: dict[str, float] = {}
    for label, N in args.size:
        if label in sizes:
            raise InputError(f"--size {label}: given twice")
        sizes[label] = N
    curves = read_many(args.paths, x=args.x, y=args.y)
    runs = sized_runs(curves, sizes, args.min_x)
    law = fit_cross_model(law_input(runs))
    predictions = []
    for n_text, x_text in args.predict or ():
        N, X = parse_size(n_text), float(x_text)
        if not (math.isfinite(X) and X > 0):
            raise InputError(f"--predict {n_text} {x_text}: X must be > 0")
        predictions.append((N, X, float(law.predict(N, X))))
    candidates = None
    if args.sizes is not None:
        if args.budget is None:
            raise InputError("--sizes lists the candidate sizes of --budget; add --budget C")
        try:
            candidates = [parse_size(t) for t in args.sizes.split(",") if t.strip()]
        except ValueError as err:
            raise InputError(f"--sizes: {err}") from None
        if not candidates:
            raise InputError("--sizes: no size given")
    choices = []
    for C in args.budget or ():
        if not (math.isfinite(C) and C > 0):
            raise InputError(f"--budget {C}: must be a positive {args.x}")
        choices.append(optimal_size(law, C, candidates))
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
            "size_choices": [c.to_dict() for c in choices],
        }
        sys.stdout.write(json.dumps(jsonable(out), indent=2, allow_nan=False) + "\n")
    else:
        sys.stdout.write(render(law, runs, x_name, y_name, predictions, validation, choices) + "\n")
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
    p.add_argument("--budget", type=float, action="append", metavar="C",
                   help="which model size for this budget (in --x units): the size with the highest "
                        "predicted pass rate at X = C (repeatable)")
    p.add_argument("--sizes", metavar="N1,N2",
                   help="with --budget: compare these sizes (7B, 135M, ...) instead of searching the "
                        "fitted range")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_fit_cross)


__all__ = ["register", "run_fit_cross"]
