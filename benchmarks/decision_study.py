"""Do early comparisons decide? Ask `compare` at a fraction of the budget which recipe ends ahead,
and score its answers against where the full runs end (`scalerl.studies.decision`).

    python benchmarks/decision_study.py \\
        --recipe scalerl=runs/dec/scalerl-seed0,runs/dec/scalerl-seed1,runs/dec/scalerl-seed2 \\
        --recipe gspo=runs/dec/gspo-seed0,... --fractions 0.25,0.5
    python benchmarks/decision_study.py --recipe scalerl=ref/scalerl.csv --recipe gspo=ref/gspo.csv ...

Each `--recipe NAME=PATH[,PATH...]` names one recipe and its seeds: scalerl run folders, or CSV
files with a `run` column (one curve per run: what `--export` writes). The budget is the smallest
final compute of any run; the truth per pair is Welch's t-test on the seeds' levels there (mean of
the last three evaluations); the early call is compare's standing at the budget from the runs cut
at each fraction (each recipe's seeds grouped: their own fits' replicates together), decided when
P(ahead) >= `--level`, the predicted lead >= `--margin` (default 0.02, the paper's accuracy on
extrapolated points) and no fit of the pair is flagged (`--flagged-decide` drops that condition).
`--pool` calls from each recipe's pooled fit instead, whose band assumes the seeds' errors
independent (over-confident: docs/studies.md). The bar (issue 43): decided pairs >= 90% correct,
no decided tie, no confident wrong call.

`--export DIR` writes each recipe's evaluation points (run, step, x, y) to `DIR/NAME.csv`, small
enough to ship as reference data (tests/studies/data/decision/); it never overwrites a file.
Exit status: 0 when every fraction meets the bar, 1 when one does not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from scalerl.scaling.analysis import FitOptions
from scalerl.scaling.io import Curve, read_curves, write_curves_csv
from scalerl.scaling.validation import CurveError
from scalerl.studies.decision import ALPHA, LEAD_MARGIN, LEVEL, study


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="decision_study.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", action="append", required=True, metavar="NAME=PATH[,PATH...]",
                   help="a recipe and its seeds (run folders or CSV files); give two or more")
    p.add_argument("--x", default="flops", help="compute column (default flops)")
    p.add_argument("--y", default="val_pass_rate", help="reward column (default val_pass_rate)")
    p.add_argument("--fractions", default="0.25,0.5", help="fractions of the budget (default 0.25,0.5)")
    p.add_argument("--alpha", type=float, default=ALPHA,
                   help=f"Welch test level of the truth (default {ALPHA})")
    p.add_argument("--level", type=float, default=LEVEL,
                   help=f"P(ahead) a decided call needs (default {LEVEL})")
    p.add_argument("--margin", type=float, default=LEAD_MARGIN,
                   help=f"predicted lead a decided call needs (default {LEAD_MARGIN}; 0: P(ahead) alone)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="bootstrap resamples (default 1000)")
    p.add_argument("--flagged-decide", action="store_true",
                   help="a flagged fit does not keep its pairs undecided (P(ahead) and the margin decide)")
    p.add_argument("--pool", action="store_true",
                   help="early calls from each recipe's pooled fit (`scalerl fit --pool`)")
    p.add_argument("--json", metavar="OUT", help="also write the result as JSON (a new file)")
    p.add_argument("--export", metavar="DIR", help="write each recipe's evaluation points to DIR/NAME.csv")
    return p.parse_args(argv)


def _recipes(specs: Sequence[str], x: str, y: str) -> dict[str, list[Curve]]:
    out: dict[str, list[Curve]] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        paths = [s for s in rest.split(",") if s.strip()]
        if not sep or not name.strip() or not paths:
            raise CurveError(f"--recipe {spec!r}: expected NAME=PATH[,PATH...]")
        if name in out:
            raise CurveError(f"--recipe {name!r} is given twice")
        # Labels made unique per recipe: two recipes' runs are often named alike (scalerl-seed0).
        out[name] = [replace(c, label=f"{name}/{c.label}") if not c.label.startswith(f"{name}/") else c
                     for path in paths for c in read_curves(path.strip(), x, y)]
        if len(out[name]) < 2:
            raise CurveError(f"--recipe {name!r}: needs two or more seeds, got {len(out[name])}")
    return out


def _fresh(path: Path, flag: str) -> Path:
    if path.exists():
        raise CurveError(f"{flag} {path}: exists; give a new path (nothing is overwritten)")
    return path


def export(curves: dict[str, list[Curve]], out_dir: Path) -> list[Path]:
    """One CSV per recipe (`scaling.io.write_curves_csv`), every file checked new before any is written."""
    targets = {name: _fresh(out_dir / f"{name}.csv", "--export") for name in curves}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, runs in curves.items():
        write_curves_csv(runs, targets[name])
    return list(targets.values())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
        if len(args.recipe) < 2:
            raise CurveError("--recipe: give two or more recipes")
        if args.json:
            _fresh(Path(args.json), "--json")
        curves = _recipes(args.recipe, args.x, args.y)
        result = study(curves, fractions, FitOptions(n_boot=args.bootstrap), args.alpha, args.level,
                       args.pool, args.margin, block_flagged=not args.flagged_decide)
        if args.export:
            for path in export(curves, Path(args.export)):
                print(f"exported {path}", file=sys.stderr)
    except (CurveError, ValueError, FileNotFoundError) as err:
        print(f"decision_study: error: {err}", file=sys.stderr)
        return 2
    print(result["text"])
    for note in result["notes"]:
        print(f"note: {note}")
    if args.json:
        payload = {
            "rule": {"level": args.level, "margin": args.margin, "flagged_decide": args.flagged_decide,
                     "pool": args.pool},
            "c_end": result["c_end"], "levels": result["levels"],
            "truth": [vars(t) for t in result["truth"].values()],
            "calls": {str(f): [vars(c) for c in cs.values()] for f, cs in result["calls"].items()},
            "scores": [vars(s) for s in result["scores"]],
        }
        with open(args.json, "x", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0 if all(s.meets() for s in result["scores"]) else 1


if __name__ == "__main__":
    sys.exit(main())
