"""Leave-one-out, grid and coupled-axis studies: plan the runs, run them, fit, tabulate (paper Fig. 7).

`plan_ablation` turns a base recipe and the study's axes into an `AblationPlan` (variants x seeds,
each a resolved `RunSpec` in `STUDY_DIR/runs/<name>/`), with nothing run; `run_ablation` prepares
the shared model, runs the plan through `scalerl.studies.runs` (in process, or through a
`train_fn` such as `scalerl.studies.ray_runs.RayRuns.train`), fits every run on the first part of
its compute and writes `plan.json`, `summary.json`, `report.md` and `curves.png`, then writes the
table to `out`. The command is `scalerl ablate` (`scalerl.cli.ablate`).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.atomic import write_atomic, write_json_atomic
from scalerl.config import RunConfig, build_config, override_layer, yaml_layer
from scalerl.inputs import InputError
from scalerl.ownership import claim_output_dir
from scalerl.recipes import recipe_path
from scalerl.scaling.io import DEFAULT_X
from scalerl.scaling.report import jsonable, run_to_dict, table
from scalerl.studies.fitting import FitSettings, RunFit, StudyFits, analyze_study
from scalerl.studies.isocompute import BudgetChoice, choices_markdown, choices_text, compute_optimal
from scalerl.studies.isocompute_recipe import (
    NStarStudy,
    Recipe,
    law_markdown,
    law_text,
    n_star_study,
    recipe,
    variant_shapes,
)
from scalerl.studies.prune import PruneController, prune_report, prune_text
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

logger = logging.getLogger(__name__)

#: the kind a study folder is marked with (`scalerl.ownership`)
ABLATE_KIND = "ablate"


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
        raise InputError("choose one study: --loo (leave-one-out), --grid KEY=V1,V2 (forward ablation) or "
                         f"--coupled AXIS ({', '.join(COUPLED_AXES)})")
    if values is not None and coupled is None:
        raise InputError("--values lists the values of a coupled axis; it needs --coupled AXIS")
    if axes and not loo:
        raise InputError("--axes restricts a leave-one-out study; it needs --loo")
    if seeds < 1:
        raise InputError(f"--seeds: must be >= 1, got {seeds}")
    overrides, config_files = list(overrides or []), list(config_files or [])
    cfg = base_config(base, config_files, overrides)
    study = Path(study_dir)
    if loo:
        found = loo_variants(cfg, axes)
        if not found:
            raise InputError(f"--base {base}: it already matches the paper's baseline on every axis "
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
                 plot: Path | None, choices: list[BudgetChoice] | None = None,
                 nstar: NStarStudy | None = None,
                 recipes: list[Recipe | None] | None = None) -> dict[str, Any]:
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
        "n_star": None if nstar is None else nstar.to_dict(),
        "recipes": [None if r is None else r.to_dict() for r in recipes or []],
        "files": {"report": REPORT_FILE, "plot": None if plot is None else plot.name},
    })  # type: ignore[return-value]


def report_markdown(plan: AblationPlan, settings: FitSettings, outcomes: list[RunOutcome], fits: StudyFits,
                    plot: Path | None, choices: list[BudgetChoice] | None = None,
                    nstar: NStarStudy | None = None, recipes: list[Recipe | None] | None = None) -> str:
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
    if nstar is not None:
        lines += ["", "## The n*(C) law and the IsoCompute recipe", "",
                  law_markdown(nstar, recipes or [], _x_name(fits))]
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


def _n_and_b(plan: AblationPlan) -> dict[str, tuple[int, int]]:
    """Each variant's generations per prompt and prompts per step (its first run's config)."""
    out: dict[str, tuple[int, int]] = {}
    for s in plan.specs:
        out.setdefault(s.group, (s.config.generation.n, s.config.pipeline.prompts_per_step))
    return out


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
    say: Any = logger.info,
    prune_margin: float | None = None,
) -> int:
    """Prepare the shared model, run, fit, write the outputs, print the table. 1 if a run failed.

    Grid and coupled studies add the compute-optimal variant per budget (`budgets`, else spread
    over the study's compute range); those whose variants differ in generations per prompt add the
    n*(C) law and, for each of `budgets`, the IsoCompute recipe (`scalerl.studies.isocompute_recipe`)."""
    stream = out or sys.stdout
    claim_output_dir(plan.study_dir, ABLATE_KIND, "--output-dir")  # new, empty or an earlier study's
    specs = with_model(plan.specs, shared_model(plan.base_config, say=say))
    write_json_atomic(plan.study_dir / PLAN_FILE, jsonable(plan.to_dict()))
    controller = None
    if prune_margin is not None:  # --prune: stop runs whose forecast is known (studies/prune.py)
        controller = PruneController({s.name: s.run_dir for s in specs}, x=settings.x or DEFAULT_X,
                                     margin=prune_margin, a_width=plan.base_config.forecast.a_width).start()
    try:
        outcomes, run_fits = run_and_fit(specs, settings, device=device, train_fn=train_fn,
                                         parallel=parallel, say=say)
    finally:
        if controller is not None:
            controller.stop()
    pruning = None if controller is None else prune_report(
        controller, {s.name: s.config.max_steps for s in specs})
    fits = analyze_study(run_fits, settings, order=[v.name for v in plan.variants])
    choices = None if plan.kind == "loo" else compute_optimal(fits, budgets)
    nstar = None if plan.kind == "loo" else n_star_study(fits, variant_shapes(fits, _n_and_b(plan)))
    recipes = [] if nstar is None else [recipe(nstar, b) for b in budgets or []]
    plot = write_plot(fits, plan.study_dir / PLOT_FILE)
    report = report_markdown(plan, settings, outcomes, fits, plot, choices, nstar, recipes)
    if pruning is not None:
        report += "\n## Pruning by forecast\n\n```\n" + prune_text(pruning) + "\n```\n"
    write_atomic(plan.study_dir / REPORT_FILE, report)
    summary = summary_dict(plan, settings, outcomes, fits, plot, choices, nstar, recipes)
    summary["prune"] = jsonable(pruning)
    write_json_atomic(plan.study_dir / SUMMARY_FILE, summary)
    failed = [o for o in outcomes if o.status == "failed"]
    parts = [fig7_text(fits), "", legend_text(fits, settings), "", per_run_text(fits, settings)]
    if choices is not None:
        parts += ["", choices_text(choices, _x_name(fits))]
    if nstar is not None:
        parts += ["", law_text(nstar, recipes, _x_name(fits))]
    if pruning is not None:
        parts += ["", prune_text(pruning)]
    if failed:
        parts += ["", f"{len(failed)} of {len(outcomes)} runs failed:"]
        parts += [f"  {o.name}: {o.error}" for o in failed]
    parts += ["", f"study written to {plan.study_dir}: {SUMMARY_FILE}, {REPORT_FILE}"
              + (f", {plot.name}" if plot is not None else "")]
    stream.write("\n".join(parts) + "\n")
    return 1 if failed else 0


__all__ = ["ABLATE_KIND", "AblationPlan", "base_config", "plan_ablation", "render_plan", "run_ablation"]
