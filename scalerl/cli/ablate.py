"""`scalerl ablate`: leave-one-out, grid and coupled-axis studies, run, fitted and tabulated.

    scalerl ablate --base scalerl --loo max_steps=40              # paper Sec. 4 / Fig. 7
    scalerl ablate --loo --axes loss,off_policy --seeds 3
    scalerl ablate --grid pipeline.k=1,4,8 --grid generation.n=4,8 --output-dir runs/lag-by-n
    scalerl ablate --loo --dry-run                                # print the plan, run nothing
    scalerl ablate --coupled generations_per_prompt               # n x B fixed: n4-B16, n8-B8, n16-B4
    scalerl ablate --coupled batch_size --values 4,8,16,32 --budget 1e12 --x flops
    scalerl ablate --coupled data_reuse --values 1,2,4,8 max_steps=200  # D_total / tau unique prompts

Leave-one-out: the base recipe, plus one run per design axis reverted to the paper's base algorithm
(`scalerl.studies.variants.LOO_AXES`). Grid: the cartesian product of the `--grid` values applied
to the base. Coupled (ScaleRL Sec. 5): one named axis whose value moves several keys together
(`scalerl.studies.variants.COUPLED_AXES`: generations_per_prompt at a fixed n x B, batch_size,
generation_length with the length-control budgets scaled, data_reuse: D_total = max_steps x
prompts_per_step fixed, data.max_train_prompts = D_total / tau); `--values` picks its values (default:
half, the base's and twice the base's; tau 1, 2, 4, 8). Grid and coupled studies also print the
compute-optimal variant at each budget read off the fitted curves (IsoCompute;
`scalerl.studies.isocompute`): `--budget X` (repeatable) or 5 budgets spaced in log compute over the
study's range. Those whose variants differ in generations per prompt also fit the n*(C) law and print
the IsoCompute recipe (n, smallest stable B_p, steps) for each `--budget`
(`scalerl.studies.isocompute_recipe`).

`KEY=VALUE` overrides (e.g. `max_steps=40`) apply to every run; `--seeds N` repeats every variant
with N rollout seeds, and the seed-to-seed spread becomes the margin on A and B.

Runs execute in process, one after another, in `OUTPUT_DIR/runs/<name>/` (with `--ray [ADDRESS]`,
concurrently as Ray tasks of `--run-cpus` / `--run-gpus` each, `--parallel` at a time); a rerun of the same
command skips completed runs and resumes or redoes the others (see `scalerl.studies.runs`). A run
that fails is reported and the study continues; the exit status is 1 if any run failed. Each run
is then fitted on the first half of its compute (`--fit-fraction`) and the study writes
`summary.json`, `report.md` (the Fig. 7 table) and `curves.png` (every fit, and the fixed-A view).

`--prune` stops a run early, through `stop_request.json` in its folder (honoured after its next
step), once its live forecast of A lies below the leader's lower bound by more than
`--prune-margin` (default 0.02) or is settled (interval < 2 x forecast.a_width); the report says
when each run stopped, why, and the compute saved (`scalerl.studies.prune`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scalerl.assembly.run import stderr_say
from scalerl.inputs import InputError, check_device
from scalerl.ownership import check_output_dir_owned
from scalerl.scaling.compare import PAPER_SEED_MARGIN_A
from scalerl.studies.ablate import ABLATE_KIND, plan_ablation, render_plan, run_ablation
from scalerl.studies.fitting import FitSettings
from scalerl.studies.variants import COUPLED_AXES


def add_fit_args(p: argparse.ArgumentParser, x_default: str | None, x_help: str) -> None:
    g = p.add_argument_group("fit")
    g.add_argument("--x", default=x_default, metavar="COL", help=x_help)
    window = g.add_mutually_exclusive_group()
    window.add_argument("--fit-fraction", type=float, default=0.5, metavar="F",
                        help="fit each run on x <= F x its final compute; later points test the "
                             "extrapolation (default 0.5, as in the paper)")
    window.add_argument("--fit-max-x", type=float, metavar="X", help="fit on x <= X (absolute)")
    g.add_argument("--bootstrap", type=int, default=200, metavar="N",
                   help="bootstrap resamples for the intervals (default 200; 0 = none)")


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--values: expected integers separated by commas, got {text!r}") from None


def fit_settings(args: argparse.Namespace) -> FitSettings:
    return FitSettings(x=args.x, fraction=args.fit_fraction, max_x=args.fit_max_x, n_boot=args.bootstrap)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ablate",
        help="leave-one-out, grid or coupled-axis study: run, fit, tabulate (paper Fig. 7)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied to every run")
    p.add_argument("--base", default="scalerl", metavar="RECIPE", help="recipe the variants start from")
    p.add_argument("-c", "--config", action="append", default=[], metavar="FILE",
                   help="YAML layered on the base recipe (repeatable)")
    kind = p.add_argument_group("study")
    kind.add_argument("--loo", action="store_true", help="leave-one-out: revert each axis to the baseline")
    kind.add_argument("--axes", metavar="A,B", help="leave-one-out on these axes only "
                      "(loss, aggregation, adv_norm, fp32_lm_head, zero_variance_filter, "
                      "no_positive_resampling, off_policy, length_control)")
    kind.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                      help="vary KEY over the values (repeatable: the cartesian product is run)")
    kind.add_argument("--coupled", choices=tuple(COUPLED_AXES), metavar="AXIS",
                      help="a coupled axis (ScaleRL Sec. 5): " + ", ".join(COUPLED_AXES))
    kind.add_argument("--values", metavar="V1,V2", help="values of the --coupled axis (integers; default: "
                      "half, the base's and twice the base's)")
    kind.add_argument("--budget", type=float, action="append", metavar="X",
                      help="compute budget for the compute-optimal choice (repeatable; default: 5 over the "
                           "study's range)")
    kind.add_argument("--seeds", type=int, default=1, metavar="N", help="runs per variant (default 1)")
    p.add_argument("--output-dir", metavar="DIR",
                   help="study directory (default runs/ablate-<base>-<loo|grid>)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    ray = p.add_argument_group("concurrent runs on a Ray cluster (the `distributed` extra)")
    ray.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                     help="run the variants as Ray tasks: on the cluster at ADDRESS ('auto', "
                          "'ray://head:10001'), or on a local instance without one")
    ray.add_argument("--parallel", type=int, metavar="N",
                     help="runs at once (default: 1; with --ray, every run, queued by Ray's scheduler)")
    ray.add_argument("--run-cpus", type=float, default=1.0, metavar="C",
                     help="with --ray: logical CPUs one run holds (default 1)")
    ray.add_argument("--run-gpus", type=float, default=0.0, metavar="G",
                     help="with --ray: GPUs one run holds (default 0)")
    prune = p.add_argument_group("pruning by forecast (scalerl.studies.prune)")
    prune.add_argument("--prune", action="store_true",
                       help="stop a run once its live forecast of A lies below the leader's by more than "
                            "--prune-margin, or is settled (+-forecast.a_width); the report shows when each "
                            "stopped, why, and the compute saved")
    prune.add_argument("--prune-margin", type=float, default=None, metavar="M",
                       help="margin on A below the leader's lower bound (default 0.02, the paper's "
                            "seed margin)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the variants and their overrides; run nothing")
    add_fit_args(p, None, "compute column to fit against (default compute_device_hours, the paper's axis; "
                 "flops is deterministic but blind to idle devices)")
    p.set_defaults(func=run_ablate)


def run_ablate(args: argparse.Namespace) -> int:
    settings = fit_settings(args)
    axes = [a.strip() for a in args.axes.split(",") if a.strip()] if args.axes else None
    kind = "loo" if args.loo else args.coupled if args.coupled else "grid"
    study_dir = args.output_dir or f"runs/ablate-{args.base}-{kind}"
    values = None if args.values is None else _int_list(args.values)
    plan = plan_ablation(args.base, loo=args.loo, axes=axes, grid=args.grid, overrides=args.overrides,
                         config_files=args.config, seeds=args.seeds, study_dir=study_dir,
                         coupled=args.coupled, values=values)
    budgets = args.budget
    margin = None
    if args.prune_margin is not None and not args.prune:
        raise InputError("--prune-margin sets the margin of --prune; add --prune")
    if args.prune:
        margin = PAPER_SEED_MARGIN_A if args.prune_margin is None else args.prune_margin
        if not margin >= 0:
            raise InputError(f"--prune-margin: must be >= 0, got {args.prune_margin}")
        if not plan.base_config.forecast.enabled:
            raise InputError("--prune reads the runs' live forecasts: forecast.enabled is false")
    if budgets is not None and plan.kind == "loo":
        raise InputError("--budget: the compute-optimal choice is for --grid and --coupled studies")
    print(render_plan(plan), file=sys.stderr if not args.dry_run else sys.stdout, flush=True)
    if args.dry_run:
        return 0
    check_output_dir_owned(study_dir, ABLATE_KIND, "--output-dir")  # before the warm start
    check_device(args.device)
    from scalerl.assembly.inputs import check_study_inputs

    check_study_inputs([s.config for s in plan.specs])  # prompts and reward side, once each
    from scalerl.rollout.factory import check_engine_available  # torch: imported only when running

    for engine in sorted({s.config.generation.engine for s in plan.specs}):
        check_engine_available(engine)
    if args.ray is None:
        if args.parallel not in (None, 1):
            raise InputError("--parallel: runs share this process without --ray; add --ray [ADDRESS]")
        return run_ablation(plan, settings, device=args.device, budgets=budgets, say=stderr_say,
                            prune_margin=margin)
    from scalerl.studies.ray_runs import RayRuns

    with RayRuns(None if args.ray == "local" else args.ray, num_cpus=args.run_cpus,
                 num_gpus=args.run_gpus) as runs:
        return run_ablation(plan, settings, device=args.device, train_fn=runs.train,
                            parallel=args.parallel or len(plan.specs), budgets=budgets, say=stderr_say,
                            prune_margin=margin)


__all__ = ["add_fit_args", "fit_settings", "register", "run_ablate"]
