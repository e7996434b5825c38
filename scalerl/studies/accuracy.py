"""Predictive accuracy of the sigmoid fit: fit each recipe's run on the first half of its compute,
predict the pass rate at the full budget, and compare with what the run reached.

The paper's standard (Khatri et al. 2025, Sec. 2 and Fig. 1): a fit on the early part of a run
extrapolates to the later points within about +-0.02 of pass rate. `plan_accuracy` makes one run
per recipe (and seed) on the embedded default with the demo's run settings (`demo.yaml`, section
`run`); `run_accuracy` runs them through the study runner from one shared warm start (or refits
existing runs, `train=False`), fits, and writes `accuracy.md`, `summary.json` and `curves.png`.
The script is `benchmarks/predictive_accuracy.py`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.atomic import write_atomic, write_json_atomic
from scalerl.config import RunConfig, build_config, override_layer, yaml_layer
from scalerl.inputs import InputError, MissingInputError
from scalerl.recipes import recipe_path
from scalerl.scaling.report import interval, jsonable, num, run_to_dict
from scalerl.studies.demo import load_settings
from scalerl.studies.fitting import FitSettings, RunFit, StudyFits, analyze_study, fit_run
from scalerl.studies.report import markdown_table, per_run_text, write_plot
from scalerl.studies.runs import RunOutcome, RunSpec
from scalerl.studies.study import check_overrides, make_spec, run_and_fit, run_name, shared_model, with_model

logger = logging.getLogger(__name__)

DEFAULT_RECIPES: tuple[str, ...] = ("scalerl", "deepseek_grpo", "qwen_dapo", "dr_grpo", "gspo", "base")
PAPER_TOLERANCE = 0.02
# Every recipe starts from the warm start made under this recipe (the demo's), whatever `--recipes`
# lists first: the warm start's cache key covers `model.fp32_lm_head`, so taking the first listed
# recipe's would make the starting model depend on the order of `--recipes`.
WARM_START_RECIPE = "scalerl"
TABLE_FILE = "accuracy.md"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "curves.png"


def recipe_config(recipe: str, overrides: Sequence[str], max_steps: int | None) -> RunConfig:
    """The demo's run settings, the recipe on top (its own choices, e.g. qwen_dapo's batch shape,
    survive the demo's 16 prompts a step), `--max-steps`, then the overrides."""
    loaded = load_settings()
    layers = [({"recipe": recipe}, {}), loaded.layer("run"), yaml_layer(recipe_path(recipe))]
    if max_steps is not None:
        layers.append(({"max_steps": max_steps}, {("max_steps",): "--max-steps"}))
    layers.append(override_layer(list(overrides)))
    return build_config(layers)


def plan_accuracy(recipes: Sequence[str], runs_dir: Path, overrides: Sequence[str],
                  max_steps: int | None, seeds: int = 1, first_seed: int = 0) -> list[RunSpec]:
    """One run per recipe, or `seeds` runs per recipe (`RECIPE-seedI`, the RL randomness moved as in
    `scalerl ablate --seeds`: same warm start and evaluation draws, other rollouts and data order).

    `first_seed` starts the seed indices there (seeds `first_seed .. first_seed + seeds - 1`), so
    a second batch of seeds is new runs, not the first batch again: an out-of-sample check of a
    design chosen on the first batch."""
    if seeds < 1:
        raise InputError(f"--seeds: must be >= 1, got {seeds}")
    if first_seed < 0:
        raise InputError(f"--first-seed: must be >= 0, got {first_seed}")
    if not recipes:
        raise InputError("--recipes: no recipe given")
    dupes = sorted({r for r in recipes if list(recipes).count(r) > 1})
    if dupes:
        raise InputError(f"--recipes: {dupes[0]!r} given twice")
    check_overrides(overrides)
    specs = []
    for recipe in recipes:
        cfg = recipe_config(recipe, overrides, max_steps)
        for i in range(first_seed, first_seed + seeds):
            name = run_name(recipe, i, 2 if first_seed else seeds)
            specs.append(make_spec(cfg, name=name, group=recipe, run_dir=runs_dir / name,
                                   description=f"recipe {recipe}", seed_index=i))
    return specs


def seed_spread_rows(fits: Sequence[RunFit]) -> list[dict[str, Any]]:
    """Per recipe with several fitted seeds: the spread of the final-point error and of A and B
    (margin = the largest deviation of a seed from the mean; the paper's is about +-0.02 on A)."""
    out = []
    for group in dict.fromkeys(f.group for f in fits):
        members = [f for f in fits if f.group == group and f.analysis is not None and f.extrapolates]
        if len(members) < 2:
            continue
        err = np.array([f.predicted_final - f.observed_final for f in members])  # type: ignore[operator]
        A = np.array([f.analysis.fit.A for f in members])  # type: ignore[union-attr]
        B = np.array([f.analysis.fit.B for f in members])  # type: ignore[union-attr]
        out.append({"recipe": group, "n": len(members), "error_mean": float(err.mean()),
                    "error_margin": float(np.max(np.abs(err - err.mean()))),
                    "max_abs_error": float(np.max(np.abs(err))),
                    "within_tolerance": int(np.sum(np.abs(err) <= PAPER_TOLERANCE + 1e-9)),
                    "A_mean": float(A.mean()), "A_margin": float(np.max(np.abs(A - A.mean()))),
                    "B_mean": float(B.mean()), "B_margin": float(np.max(np.abs(B - B.mean())))})
    return out


SPREAD_HEADER = ["recipe", "seeds", "error (mean +- margin)", "max abs error", "within +-0.02", "A", "B"]


def spread_table_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [[r["recipe"], str(r["n"]), f"{r['error_mean']:+.3f} +-{r['error_margin']:.3f}",
             f"{r['max_abs_error']:.3f}", f"{r['within_tolerance']} of {r['n']}",
             f"{r['A_mean']:.3f} +-{r['A_margin']:.3f}", f"{r['B_mean']:.3f} +-{r['B_margin']:.3f}"]
            for r in rows]


def accuracy_rows(fits: Sequence[RunFit]) -> list[list[str]]:
    rows = []
    for f in fits:
        if f.analysis is None:
            rows.append([f.name, "-", "-", "-", "-", "-", "-", f"not fitted: {f.error}"])
            continue
        a = f.analysis
        band = f.predicted_band
        held = a.held_out
        rows.append([
            f.name,
            f"{a.fit.diagnostics.n_points}/{a.curve.x.size}",
            f"{f.predicted_final:.3f}" + (f" {interval(*band, digits=3)}" if band else ""),
            f"{f.observed_final:.3f}",
            f"{f.abs_error:.3f}" if f.extrapolates else "- (in window)",
            "-" if held is None else f"{held.mae:.3f}",
            f"{num(a.fit.A, 3)} / {num(a.fit.B, 3)}",
            "ok" if a.fit.diagnostics.reliable else "WARN",
        ])
    return rows


ACCURACY_HEADER = ["recipe", "points", "predicted final", "observed", "abs error", "MAE after window",
                   "A / B", "fit"]


def overall(fits: Sequence[RunFit]) -> dict[str, Any]:
    errs = [f.abs_error for f in fits if f.extrapolates and f.abs_error is not None]
    if not errs:
        return {"n": 0, "mean_abs_error": None, "max_abs_error": None, "within_tolerance": 0}
    return {"n": len(errs), "mean_abs_error": float(np.mean(errs)), "max_abs_error": float(np.max(errs)),
            "within_tolerance": int(sum(e <= PAPER_TOLERANCE for e in errs))}


def overall_line(stats: dict[str, Any]) -> str:
    if not stats["n"]:
        return "no recipe could be extrapolated"
    return (f"{stats['n']} recipe(s): mean abs error {stats['mean_abs_error']:.3f}, "
            f"max {stats['max_abs_error']:.3f}; {stats['within_tolerance']} of {stats['n']} within the "
            f"paper's +-{PAPER_TOLERANCE}")


def render_markdown(fits: Sequence[RunFit], settings: FitSettings, outcomes: Sequence[RunOutcome] | None,
                    study: StudyFits, stats: dict[str, Any], plot: Path | None, command: str) -> str:
    x = next((f.analysis.curve.x_name for f in fits if f.analysis is not None), settings.x or "compute")
    failed = [o for o in outcomes or () if o.status == "failed"]
    lines = [
        "# Predictive accuracy of the sigmoid fit",
        "",
        f"`{command}`",
        "",
        f"Each recipe's held-out pass rate (x = {x}) is {settings.describe()}; the fit is extrapolated "
        f"to the run's last evaluation. Paper standard: within about +-{PAPER_TOLERANCE}.",
        "",
        markdown_table(ACCURACY_HEADER, accuracy_rows(fits)),
        "",
        f"**{overall_line(stats)}.**",
        "",
        "predicted final: the fit's value at the final compute [band where a new evaluation would land, "
        f"{settings.level:.0%}]; MAE after window: mean abs error over all points after the fit window.",
    ]
    if plot is not None:
        lines += ["", f"![fits]({plot.name})"]
    spread = seed_spread_rows(fits)
    if spread:
        lines += ["", "Over seeds (margin: the largest deviation of a seed from the mean):", "",
                  markdown_table(SPREAD_HEADER, spread_table_rows(spread))]
    lines += ["", "```", per_run_text(study, settings), "```"]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- `{o.name}`: {o.error}" for o in failed]
    return "\n".join(lines) + "\n"


def run_accuracy(
    recipes: Sequence[str],
    *,
    output_dir: Path,
    runs_dir: Path | None = None,
    overrides: Sequence[str] = (),
    max_steps: int | None = None,
    seeds: int = 1,
    first_seed: int = 0,
    settings: FitSettings | None = None,
    train: bool = True,
    device: str | None = None,
    train_fn: Any = None,
    command: str = "",
    out: Any = None,
    say: Any = logger.info,
) -> int:
    """Run (or reuse) every recipe, fit, write `accuracy.md`, `summary.json`, `curves.png`."""
    stream = out or sys.stdout
    settings = settings or FitSettings(x="flops")
    runs = runs_dir or output_dir / "runs"
    specs = plan_accuracy(recipes, runs, overrides, max_steps, seeds, first_seed)
    outcomes: list[RunOutcome] | None = None
    if train:
        base = recipe_config(WARM_START_RECIPE, overrides, max_steps)
        specs = with_model(specs, shared_model(base, say=say))
        outcomes, fits = run_and_fit(specs, settings, device=device, train_fn=train_fn, say=say)
    else:
        missing = [str(s.run_dir) for s in specs if not (s.run_dir / "metrics.jsonl").is_file()]
        if len(missing) == len(specs):
            raise MissingInputError(f"--no-train: no run to fit (no metrics.jsonl in {', '.join(missing)})")
        fits = [fit_run(s.run_dir, s.name, s.group, settings) for s in specs]
    study = analyze_study(fits, settings, order=list(recipes))
    stats = overall(fits)
    output_dir.mkdir(parents=True, exist_ok=True)
    plot = write_plot(study, output_dir / PLOT_FILE)
    text = render_markdown(fits, settings, outcomes, study, stats, plot, command)
    write_atomic(output_dir / TABLE_FILE, text)
    write_json_atomic(output_dir / SUMMARY_FILE, jsonable({
        "command": command,
        "recipes": list(recipes),
        "runs_dir": str(runs),
        "fit": settings.to_dict(),
        "tolerance": PAPER_TOLERANCE,
        "overall": stats,
        "seeds": seeds,
        "first_seed": first_seed,
        "seed_spread": seed_spread_rows(fits),
        "runs": [
            {
                "recipe": f.group,
                "run": f.name,
                "run_dir": str(f.run_dir),
                "status": None if outcomes is None else next(o.status for o in outcomes if o.name == f.name),
                "error": f.error,
                "final_x": f.final_x,
                "predicted": f.predicted_final,
                "band": None if f.predicted_band is None else list(f.predicted_band),
                "observed": f.observed_final,
                "abs_error": f.abs_error if f.extrapolates else None,
                "held_out_mae": None if f.analysis is None or f.analysis.held_out is None
                else f.analysis.held_out.mae,
                "fit": None if f.analysis is None else run_to_dict(f.analysis),
            }
            for f in fits
        ],
        "files": {"table": TABLE_FILE, "plot": None if plot is None else plot.name},
    }))
    from scalerl.scaling.report import table

    spread = seed_spread_rows(fits)
    if spread:
        stream.write(table(SPREAD_HEADER, spread_table_rows(spread)) + "\n\n")
    stream.write(table(ACCURACY_HEADER, accuracy_rows(fits)) + "\n\n" + overall_line(stats)
                 + f"\n\nwritten to {output_dir / TABLE_FILE}, {output_dir / SUMMARY_FILE}"
                 + (f", {plot}" if plot is not None else "") + "\n")
    failed = [o for o in outcomes or () if o.status == "failed"]
    return 1 if failed or not stats["n"] else 0


__all__ = ["DEFAULT_RECIPES", "plan_accuracy", "recipe_config", "run_accuracy"]
