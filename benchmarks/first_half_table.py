"""The first-half forecast over seeds: fit each run on the first half of its compute, predict its
final evaluation, and check the bar per seed (issue 43, `scalerl.studies.demo.SeedRow.meets_bar`):
an unflagged fit within +-0.02 of the mean of the last three evaluations; a flagged fit's 95% band
holding the final point.

    python benchmarks/first_half_table.py runs/seeds/scalerl-seed0 runs/seeds/scalerl-seed1 ...
    python benchmarks/first_half_table.py tests/studies/data/first_half/scalerl.csv

PATHs are scalerl run folders (the seeds of `benchmarks/predictive_accuracy.py --seeds N`, or
`scalerl train` runs of one config with `generation.seed` and `data.shuffle_seed` moved) or a CSV
with a `run` column (what `--export` writes); seeds are numbered in the order given. The fit is the
demo's (`scalerl demo`: `fit_demo_curve`, x = flops by default). `--export FILE` writes every run's
evaluation points to one new CSV. Exit status: 0 when every seed meets the bar, 1 when one does
not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from scalerl.inputs import InputError
from scalerl.scaling.io import read_curves, write_curves_csv
from scalerl.scaling.validation import CurveError
from scalerl.studies.demo import fit_demo_curve, render_seeds, row_of, seed_spread_summary


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="first_half_table.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="run folders or CSV files, one seed per run")
    p.add_argument("--x", default="flops", help="compute column (default flops)")
    p.add_argument("--y", default="val_pass_rate", help="reward column (default val_pass_rate)")
    p.add_argument("--fraction", type=float, default=0.5, help="fit window (default 0.5: the first half)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="bootstrap resamples (default 1000)")
    p.add_argument("--export", metavar="FILE", help="write every run's evaluation points to FILE (a new CSV)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not 0 < args.fraction < 1:
            raise CurveError(f"--fraction must be in (0, 1), got {args.fraction}")
        if args.export and Path(args.export).exists():
            raise CurveError(f"--export {args.export}: exists; give a new path (nothing is overwritten)")
        curves = [c for path in args.paths for c in read_curves(path, args.x, args.y)]
        rows = [row_of(i, fit_demo_curve(c, args.fraction, args.bootstrap)) for i, c in enumerate(curves)]
        if args.export:
            write_curves_csv(curves, args.export)
    except (CurveError, InputError, FileNotFoundError) as err:
        print(f"first_half_table: error: {err}", file=sys.stderr)
        return 2
    stats = seed_spread_summary(rows)
    print("\n".join(f"seed {i}: {c.label}" for i, c in enumerate(curves)))
    print()
    print(render_seeds(rows, stats))
    return 0 if stats["bar_met"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
