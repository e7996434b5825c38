"""What every study does around its runs: resolve configs, share one warm start, run, fit.

A study's runs differ only in the settings the study is about; everything else, including the
starting model, must be the same. The embedded default's warm start is keyed by settings a study
may vary (`model.fp32_lm_head` is one of the leave-one-out axes), so letting each run warm-start
itself would give that variant a different starting model. `shared_model` therefore warm-starts
once from the study's base config and every run starts from that checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from scalerl.config import RunConfig, parse_override
from scalerl.inputs import InputError
from scalerl.studies.fitting import FitSettings, RunFit, fit_run
from scalerl.studies.runs import RunOutcome, RunSpec, execute_runs
from scalerl.studies.variants import apply_variant, override

logger = logging.getLogger(__name__)

RUNS_DIR = "runs"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILE = "curves.png"
PLAN_FILE = "study.json"
# Set per run by the study; an override of them would be silently replaced, so it is refused.
RESERVED_KEYS: tuple[str, ...] = ("output_dir", "name", "recipe")


def check_overrides(overrides: Sequence[str], reserved: Sequence[str] = RESERVED_KEYS) -> None:
    """`ValueError` for an override of a key the study sets itself (or a malformed override)."""
    for text in overrides:
        path, _ = parse_override(text)
        key = ".".join(path)
        if key in reserved:
            raise InputError(f"override {text!r}: {key} is set by the study for each run "
                             f"(use --output-dir for the study directory)")


def seed_overrides(base: RunConfig, index: int) -> list[str]:
    """Seed `index` of a repeated run: the RL randomness (rollout sampling, prompt order) moves,
    while `seed` (warm start and the held-out evaluation draws) stays, so every seed starts from
    the same model and is scored with the same evaluation samples (common random numbers)."""
    if index == 0:
        return []
    return [override("generation.seed", base.generation.seed + index),
            override("data.shuffle_seed", base.data.shuffle_seed + index)]


def make_spec(base: RunConfig, *, name: str, group: str, run_dir: Path, overrides: Sequence[str] = (),
              description: str = "", seed_index: int = 0) -> RunSpec:
    """A run of the study: `base` with `overrides` and the seed's offsets, in `run_dir`.

    `recipe` is set to the group, so `scalerl compare` on the run directories groups the seeds of
    one variant (and only those) together.
    """
    cfg = apply_variant(base, [*overrides, *seed_overrides(base, seed_index)])
    cfg.name = name
    cfg.recipe = group
    cfg.output_dir = str(run_dir)
    return RunSpec(name=name, group=group, config=cfg, description=description, seed_index=seed_index)


def run_name(group: str, seed_index: int, seeds: int) -> str:
    """`group`, or `group-seedN` when the study repeats runs (the suffix `scalerl compare` strips)."""
    return group if seeds == 1 else f"{group}-seed{seed_index}"


def shared_model(base: RunConfig, say: Callable[[str], None] = logger.info) -> str | None:
    """The starting model for every run: the user's, or the embedded default warm-started once."""
    if base.model.name_or_path is not None:
        return base.model.name_or_path
    from scalerl.assembly.run import prepare_model

    return prepare_model(base, say=say).model.name_or_path


def with_model(specs: Sequence[RunSpec], model: str | None) -> list[RunSpec]:
    out = []
    for spec in specs:
        cfg = spec.config.model_copy(deep=True)
        cfg.model.name_or_path = model
        out.append(replace(spec, config=cfg))
    return out


def run_and_fit(
    specs: Sequence[RunSpec],
    settings: FitSettings,
    *,
    device: str | None = None,
    train_fn: Callable[..., int] | None = None,
    parallel: int = 1,
    say: Callable[[str], None] = logger.info,
) -> tuple[list[RunOutcome], list[RunFit]]:
    """Train every run (skipping completed ones; `parallel` at once), then fit each completed run."""
    outcomes = execute_runs(specs, device=device, train_fn=train_fn, parallel=parallel, say=say)
    fits = [
        fit_run(o.run_dir, o.name, o.group, settings) if o.status == "completed"
        else RunFit(o.name, o.group, o.run_dir, error=f"run failed: {o.error}")
        for o in outcomes
    ]
    return outcomes, fits


__all__ = [
    "PLAN_FILE",
    "PLOT_FILE",
    "REPORT_FILE",
    "RESERVED_KEYS",
    "RUNS_DIR",
    "SUMMARY_FILE",
    "check_overrides",
    "make_spec",
    "run_and_fit",
    "run_name",
    "seed_overrides",
    "shared_model",
    "with_model",
]
