"""`scalerl ablate`: leave-one-out, grid and coupled-axis studies, run, fitted and tabulated.

    scalerl ablate --base scalerl --loo max_steps=40              # paper Sec. 4 / Fig. 7
    scalerl ablate --loo --axes loss,off_policy --seeds 3
    scalerl ablate --grid pipeline.k=1,4,8 --grid generation.n=4,8 --output-dir runs/lag-by-n
    scalerl ablate --loo --dry-run                                # print the plan, run nothing
    scalerl ablate --coupled generations_per_prompt               # n x B fixed: n4-B16, n8-B8, n16-B4
    scalerl ablate --coupled batch_size --values 4,8,16,32 --budget 1e12 --x flops

Leave-one-out: the base recipe, plus one run per design axis reverted to the paper's base algorithm
(`scalerl.studies.variants.LOO_AXES`). Grid: the cartesian product of the `--grid` values applied
to the base. Coupled (ScaleRL Sec. 5): one named axis whose value moves several keys together
(`scalerl.studies.variants.COUPLED_AXES`: generations_per_prompt at a fixed n x B, batch_size,
generation_length with the length-control budgets scaled); `--values` picks its values (default:
half, the base's and twice the base's). Grid and coupled studies also print the compute-optimal
variant at each budget read off the fitted curves (IsoCompute; `scalerl.studies.isocompute`):
`--budget X` (repeatable) or 5 budgets spaced in log compute over the study's range.

`KEY=VALUE` overrides (e.g. `max_steps=40`) apply to every run; `--seeds N` repeats every variant
with N rollout seeds, and the seed-to-seed spread becomes the margin on A and B.

Runs execute in process, one after another, in `OUTPUT_DIR/runs/<name>/` (with `--ray [ADDRESS]`,
concurrently as Ray tasks of `--run-cpus` / `--run-gpus` each, `--parallel` at a time); a rerun of the same
command skips completed runs and resumes or redoes the others (see `scalerl.studies.runs`). A run
that fails is reported and the study continues; the exit status is 1 if any run failed. Each run
is then fitted on the first half of its compute (`--fit-fraction`) and the study writes
`summary.json`, `report.md` (the Fig. 7 table) and `curves.png` (every fit, and the fixed-A view).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.atomic import write_atomic, write_json_atomic
from scalerl.config import RunConfig, build_config, override_layer, yaml_layer
from scalerl.recipes import recipe_path
from scalerl.scaling.report import jsonable, run_to_dict, table
from scalerl.studies.fitting import FitSettings, RunFit, StudyFits, analyze_study
from scalerl.studies.isocompute import BudgetChoice, choices_markdown, choices_text, compute_optimal
from scalerl.studies.report import (
    PREDICTION_HEADER,
    fig7_markdown,
    fig7_text,
    legend_text,
    markdown_table,
    per_run_text,
    prediction_rows,
    write_plot,
)
from scalerl.studies.runs import RunOutcome, RunSpec
from scalerl.studies.study import (
    PLAN_FILE,
    PLOT_FILE,
    REPORT_FILE,
    RUNS_DIR,
    SUMMARY_FILE,
    check_overrides,
    make_spec,
    run_and_fit,
    run_name,
    shared_model,
    with_model,
)
from scalerl.studies.variants import (
    COUPLED_AXES,
    Variant,
    coupled_variants,
    grid_variants,
    loo_variants,
    parse_grid_args,
)


@dataclass(frozen=True)
class AblationPlan:
    """The runs of an ablation, before any model is prepared or anything is trained."""

    kind: str  # "loo", "grid" or "coupled"
    base: str
    base_config: RunConfig
    variants: tuple[Variant, ...]
    seeds: int
    overrides: tuple[str, ...]
    config_files: tuple[str, ...]
    study_dir: Path
    specs: tuple[RunSpec, ...]
    coupled: str | None = None  # the coupled axis, for kind "coupled"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "coupled": self.coupled,
            "base": self.base,
            "config_files": list(self.config_files),
            "overrides": list(self.overrides),
            "seeds": self.seeds,
            "variants": [{"name": v.name, "overrides": v.overrides, "description": v.description}
                         for v in self.variants],
            "runs": [
                {"name": s.name, "variant": s.group, "seed_index": s.seed_index, "run_dir": str(s.run_dir)}
                for s in self.specs
            ],
        }


def base_config(base: str, config_files: list[str], overrides: list[str]) -> RunConfig:
    """The recipe, the user's files, then the overrides: what every run of the study shares."""
    check_overrides(overrides)
    layers = [({"recipe": base}, {}), yaml_layer(recipe_path(base))]
    layers.extend(yaml_layer(f) for f in config_files)
    layers.append(override_layer(overrides))
    return build_config(layers)


def plan_ablation(
    base: str = "scalerl",
    *,
    loo: bool = False,
    axes: list[str] | None = None,
    grid: list[str] | None = None,
    overrides: list[str] | None = None,
    config_files: list[str] | None = None,
    seeds: int = 1,
    study_dir: str | Path = "runs/ablate",
    coupled: str | None = None,
    values: list[int] | None = None,
) -> AblationPlan:
    """Variants and run specs; every error (recipe, key, value, combination) is raised here."""
    if sum((loo, bool(grid), coupled is not None)) != 1:
        raise ValueError("choose one study: --loo (leave-one-out), --grid KEY=V1,V2 (forward ablation) or "
                         f"--coupled AXIS ({', '.join(COUPLED_AXES)})")
    if values is not None and coupled is None:
        raise ValueError("--values lists the values of a coupled axis; it needs --coupled AXIS")
    if axes and not loo:
        raise ValueError("--axes restricts a leave-one-out study; it needs --loo")
    if seeds < 1:
        raise ValueError(f"--seeds: must be >= 1, got {seeds}")
    overrides, config_files = list(overrides or []), list(config_files or [])
    cfg = base_config(base, config_files, overrides)
    study = Path(study_dir)
    if loo:
        found = loo_variants(cfg, axes)
        if not found:
            raise ValueError(f"--base {base}: it already matches the paper's baseline on every axis "
                             f"{'asked for ' if axes else ''}(nothing to leave out)")
        variants = [Variant(base, [], f"the base recipe {base!r}"), *found]
    elif coupled is not None:
        variants = coupled_variants(cfg, coupled, values)
    else:
        variants = grid_variants(cfg, parse_grid_args(grid or []))
    specs = [
        make_spec(cfg, name=run_name(v.name, i, seeds), group=v.name,
                  run_dir=study / RUNS_DIR / run_name(v.name, i, seeds), overrides=v.overrides,
                  description=v.description, seed_index=i)
        for v in variants
        for i in range(seeds)
    ]
    kind = "loo" if loo else "coupled" if coupled is not None else "grid"
    return AblationPlan(kind, base, cfg, tuple(variants), seeds, tuple(overrides), tuple(config_files), study,
                        tuple(specs), coupled)


STUDY_TITLES = {"loo": "leave-one-out", "grid": "grid", "coupled": "coupled-axis"}


def render_plan(plan: AblationPlan) -> str:
    rows = [[v.name, ", ".join(v.overrides) or "(base)", v.description] for v in plan.variants]
    title = STUDY_TITLES[plan.kind] + (f" ({plan.coupled})" if plan.coupled else "")
    head = (f"{title} study from {plan.base!r}: "
            f"{len(plan.variants)} variants x {plan.seeds} seed(s) = {len(plan.specs)} runs in "
            f"{plan.study_dir / 'runs'}")
    lines = [head]
    if plan.overrides:
        lines.append(f"overrides on every run: {' '.join(plan.overrides)}")
    return "\n".join([*lines, "", table(["variant", "overrides", "what"], rows)])


# ---------------------------------------------------------------------------------------------
# Outputs


def summary_dict(plan: AblationPlan, settings: FitSettings, outcomes: list[RunOutcome], fits: StudyFits,
                 plot: Path | None, choices: list[BudgetChoice] | None = None) -> dict[str, Any]:
    by_name = {f.name: f for f in fits.runs}

    def run_entry(o: RunOutcome) -> dict[str, Any]:
        f: RunFit = by_name[o.name]
        entry: dict[str, Any] = o.to_dict()
        entry["fit"] = None if f.analysis is None else run_to_dict(f.analysis)
        entry["fit_error"] = f.error if f.analysis is None else None
        entry["final"] = None if f.analysis is None else {
            "x": f.final_x, "observed": f.observed_final, "predicted": f.predicted_final,
            "band": None if f.predicted_band is None else list(f.predicted_band),
            "abs_error": f.abs_error if f.extrapolates else None,
        }
        return entry

    failed = [o.name for o in outcomes if o.status == "failed"]
    return jsonable({
        "study": plan.to_dict(),
        "fit": settings.to_dict(),
        "variants": [r.to_dict() for r in fits.rows],
        "fixed_A": fits.fixed_A,
        "runs": [run_entry(o) for o in outcomes],
        "n_runs": len(outcomes),
        "n_completed": len(outcomes) - len(failed),
        "n_failed": len(failed),
        "failed": failed,
        "not_fitted": [f.name for f in fits.runs if f.analysis is None and f.name not in failed],
        "notes": list(fits.notes),
        "compute_optimal": None if choices is None else [c.to_dict() for c in choices],
        "files": {"report": REPORT_FILE, "plot": None if plot is None else plot.name},
    })  # type: ignore[return-value]


def report_markdown(plan: AblationPlan, settings: FitSettings, outcomes: list[RunOutcome], fits: StudyFits,
                    plot: Path | None, choices: list[BudgetChoice] | None = None) -> str:
    failed = [o for o in outcomes if o.status == "failed"]
    title = STUDY_TITLES[plan.kind] + (f": {plan.coupled}" if plan.coupled else "")
    lines = [
        f"# Ablation study ({title}) from `{plan.base}`",
        "",
        f"- runs: {len(outcomes)} ({len(outcomes) - len(failed)} completed, {len(failed)} failed); "
        f"seeds per variant: {plan.seeds}",
        f"- overrides on every run: {' '.join(f'`{o}`' for o in plan.overrides) or 'none'}",
        "",
        "## Variants (paper Fig. 7)",
        "",
        fig7_markdown(fits),
        "",
        *legend_text(fits, settings).splitlines(),
        "",
    ]
    lines += [f"- `{v.name}`: {v.description}" + (f" (`{' '.join(v.overrides)}`)" if v.overrides else "")
              for v in plan.variants]
    if plot is not None:
        lines += ["", "## Curves", "", f"![fits of every run]({plot.name})", "",
                  "Filled points were fitted, crosses are the held-out later points, dashed lines the "
                  "extrapolation; the right panel is the fixed-A refit, where each run is a line of slope B."]
    if choices is not None:
        lines += ["", "## Compute-optimal choice per budget (IsoCompute)", "",
                  choices_markdown(choices, _x_name(fits))]
    pred = prediction_rows(fits.runs)
    if pred:
        lines += ["", "## Extrapolation to each run's last evaluation", "",
                  markdown_table(PREDICTION_HEADER, pred)]
    lines += ["", "## Per-run fits", "", "```", per_run_text(fits, settings), "```"]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- `{o.name}`: {o.error}" for o in failed]
    if fits.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in fits.notes]
    return "\n".join(lines) + "\n"


def _x_name(fits: StudyFits) -> str:
    return fits.analyses[0].curve.x_name if fits.analyses else "compute"


def run_ablation(
    plan: AblationPlan,
    settings: FitSettings,
    *,
    device: str | None = None,
    train_fn: Any = None,
    out: Any = None,
    parallel: int = 1,
    budgets: list[float] | None = None,
) -> int:
    """Prepare the shared model, run, fit, write the outputs, print the table. 1 if a run failed.

    Grid and coupled studies add the compute-optimal variant per budget (`budgets`, else spread
    over the study's compute range)."""
    stream = out or sys.stdout
    specs = with_model(plan.specs, shared_model(plan.base_config))
    plan.study_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(plan.study_dir / PLAN_FILE, jsonable(plan.to_dict()))
    outcomes, run_fits = run_and_fit(specs, settings, device=device, train_fn=train_fn, parallel=parallel)
    fits = analyze_study(run_fits, settings, order=[v.name for v in plan.variants])
    choices = None if plan.kind == "loo" else compute_optimal(fits, budgets)
    plot = write_plot(fits, plan.study_dir / PLOT_FILE)
    report = report_markdown(plan, settings, outcomes, fits, plot, choices)
    write_atomic(plan.study_dir / REPORT_FILE, report)
    summary = summary_dict(plan, settings, outcomes, fits, plot, choices)
    write_json_atomic(plan.study_dir / SUMMARY_FILE, summary)
    failed = [o for o in outcomes if o.status == "failed"]
    parts = [fig7_text(fits), "", legend_text(fits, settings), "", per_run_text(fits, settings)]
    if choices is not None:
        parts += ["", choices_text(choices, _x_name(fits))]
    if failed:
        parts += ["", f"{len(failed)} of {len(outcomes)} runs failed:"]
        parts += [f"  {o.name}: {o.error}" for o in failed]
    parts += ["", f"study written to {plan.study_dir}: {SUMMARY_FILE}, {REPORT_FILE}"
              + (f", {plot.name}" if plot is not None else "")]
    stream.write("\n".join(parts) + "\n")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# Command line


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
        raise ValueError(f"--values: expected integers separated by commas, got {text!r}") from None


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
    if budgets is not None and plan.kind == "loo":
        raise ValueError("--budget: the compute-optimal choice is for --grid and --coupled studies")
    print(render_plan(plan), file=sys.stderr if not args.dry_run else sys.stdout, flush=True)
    if args.dry_run:
        return 0
    from scalerl.rollout.factory import check_engine_available  # torch: imported only when running

    for engine in sorted({s.config.generation.engine for s in plan.specs}):
        check_engine_available(engine)
    if args.ray is None:
        if args.parallel not in (None, 1):
            raise ValueError("--parallel: runs share this process without --ray; add --ray [ADDRESS]")
        return run_ablation(plan, settings, device=args.device, budgets=budgets)
    from scalerl.distributed.studies import RayRuns

    with RayRuns(None if args.ray == "local" else args.ray, num_cpus=args.run_cpus,
                 num_gpus=args.run_gpus) as runs:
        return run_ablation(plan, settings, device=args.device, train_fn=runs.train,
                            parallel=args.parallel or len(plan.specs), budgets=budgets)


__all__ = ["AblationPlan", "base_config", "plan_ablation", "register", "render_plan", "run_ablation"]
