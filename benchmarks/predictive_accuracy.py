"""Predictive accuracy of the sigmoid fit: fit each recipe's run on the first half of its compute,
predict the pass rate at the full budget, and compare with what the run reached.

    python benchmarks/predictive_accuracy.py                       # six recipes, 200 steps each
    python benchmarks/predictive_accuracy.py --recipes scalerl,gspo --max-steps 100
    python benchmarks/predictive_accuracy.py --runs-dir runs/acc --no-train   # refit existing runs

The paper's standard (Khatri et al. 2025, Sec. 2 and Fig. 1): a fit on the early part of a run
extrapolates to the later points within about +-0.02 of pass rate.

Every recipe runs on the embedded default with the demo's run settings (`scalerl/studies/demo.yaml`,
section `run`: evaluation cadence and size; `--max-steps` sets the length), from one shared warm
start. Runs live in `--runs-dir` (default `OUTPUT_DIR/runs`), one directory per recipe, and go
through the study runner: completed runs are reused, interrupted ones resumed or redone, a failed
run is reported and the others go on. `--no-train` trains nothing and fits whatever run
directories are there (any `scalerl train` run directory named after its recipe works).

The x axis defaults to `flops`, which depends only on the tokens processed; device-hours on a
shared machine carry the machine's load into the curve (`--x compute_device_hours` for the
paper's axis). The table gives, per recipe, the fit's prediction of the last evaluation with the
bootstrap band where a new evaluation would land, the observed value, the absolute error, and the
mean absolute error over all points after the fit window.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from scalerl.assembly.run import stderr_say
from scalerl.studies.accuracy import DEFAULT_RECIPES, run_accuracy
from scalerl.studies.fitting import FitSettings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="predictive_accuracy.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every run")
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES), metavar="A,B",
                   help=f"recipes to measure (default {','.join(DEFAULT_RECIPES)})")
    p.add_argument("--max-steps", type=int, metavar="N", help="steps per run (default: the demo's)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="runs per recipe (RECIPE-seedI), with the spread of the error and of A and B")
    p.add_argument("--first-seed", type=int, default=0, metavar="S",
                   help="seed indices S .. S+N-1 (default 0): a fresh batch of seeds, out of sample")
    p.add_argument("--output-dir", default="runs/predictive-accuracy", metavar="DIR")
    p.add_argument("--runs-dir", metavar="DIR", help="where the runs live (default OUTPUT_DIR/runs)")
    p.add_argument("--no-train", action="store_true",
                   help="fit the existing runs in --runs-dir; train nothing")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    g = p.add_argument_group("fit")
    g.add_argument("--x", default="flops", metavar="COL", help="compute column (default flops)")
    g.add_argument("--fit-fraction", type=float, default=0.5, metavar="F",
                   help="fit on x <= F x the final compute (default 0.5)")
    g.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="bootstrap resamples (default 1000)")
    # Overrides may stand anywhere among the flags (`--max-steps 140 eval.every=4 --recipes gspo`):
    # plain `parse_args` gives a `nargs="*"` positional only the words before the first flag.
    return p.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.max_steps is not None and args.max_steps < 1:
            raise ValueError(f"--max-steps: must be >= 1, got {args.max_steps}")
        recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
        settings = FitSettings(x=args.x, fraction=args.fit_fraction, n_boot=args.bootstrap)
        given = sys.argv[1:] if argv is None else list(argv)
        command = " ".join(["python benchmarks/predictive_accuracy.py", *given])
        return run_accuracy(
            recipes, output_dir=Path(args.output_dir),
            runs_dir=Path(args.runs_dir) if args.runs_dir else None, overrides=args.overrides,
            max_steps=args.max_steps, seeds=args.seeds, first_seed=args.first_seed, settings=settings,
            train=not args.no_train,
            device=args.device,
            command=command,
            say=stderr_say,
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"predictive_accuracy: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
