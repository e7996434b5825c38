"""The IsoCompute law n*(C) over a study's n x B sweep, and the recipe for a target budget.

A grid or coupled study whose variants differ in generations per prompt n (`--coupled
generations_per_prompt`: n x B fixed; or `--grid generation.n=... --grid
pipeline.prompts_per_step=...`: n x B free) has, at every budget C, a compute-optimal variant
(`scalerl.studies.isocompute`). Its n at `LAW_BUDGETS` budgets spread in log compute over the
study's range is the data of the n*(C) law (`scalerl.scaling.nstar_law`: log2 n* a sigmoid in C
between n_lo and n_hi). The recipe for a budget C follows IsoCompute's procedure (Cheng et al. 2026,
arXiv 2603.12151; design notes `003_*`, steps 3-5):

1. n from the law: n*(C), rounded to the nearest studied n in log2 (the law is fitted on them);
2. "the smallest stable B_p": among the studied variants with that n, the smallest prompts per step
   whose runs are all *stable*, judged on the signals a run has: it completed and its curve could
   be fitted; its training truncation rate never passed 10% (ScaleRL's instability sign, the
   `truncation` flag of `scalerl fit`); and its last evaluation did not fall below the observation
   band its own fit predicts there (a late drop, i.e. a collapse after the fit window; checked
   when the fit has a bootstrap and the last evaluation lies beyond the window). The fit's
   identifiability warnings (A not pinned yet) do not count: they say the run is short, not
   unstable. IsoCompute finds B_p matters mostly for stability, so the smallest stable one leaves
   the most budget for steps;
3. "the rest of the budget to more steps": M = C / (compute per step of that variant), the compute
   per step measured on its runs (last x / last step, mean over its seeds).

Numbers only; `law_text` / `law_markdown` render them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scalerl.inputs import InputError
from scalerl.scaling.nstar_law import NStarLaw, fit_n_star_law
from scalerl.scaling.report import num, table
from scalerl.scaling.validation import CurveError
from scalerl.studies.fitting import RunFit, StudyFits
from scalerl.studies.isocompute import compute_optimal, default_budgets

LAW_BUDGETS = 25


@dataclass(frozen=True)
class VariantShape:
    """A variant's n and B, its measured compute per step, and whether it is stable (module doc)."""

    variant: str
    n: int
    B: int
    compute_per_step: float | None
    stable: bool
    why_not: str | None  # the first reason it is not stable


@dataclass(frozen=True)
class NStarStudy:
    """The compute-optimal n at each budget, the law fitted to them (or why not), the variants."""

    budgets: tuple[float, ...]
    n_star: tuple[int, ...]
    separated: int  # budgets whose best variant's band lies above the runner-up's
    law: NStarLaw | None
    error: str | None
    variants: tuple[VariantShape, ...]

    def to_dict(self) -> dict[str, object]:
        return {"budgets": list(self.budgets), "n_star": list(self.n_star), "separated": self.separated,
                "law": None if self.law is None else self.law.to_dict(), "error": self.error,
                "variants": [v.__dict__ for v in self.variants]}


@dataclass(frozen=True)
class Recipe:
    """IsoCompute's allocation of a budget: n from the law, the smallest stable B, the steps."""

    budget: float
    n_law: float
    n: int
    B: int | None
    variant: str | None
    compute_per_step: float | None
    steps: float | None
    extrapolated: bool  # the budget lies outside the budgets the law was fitted on
    note: str | None

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def variant_shapes(fits: StudyFits, n_and_b: Mapping[str, tuple[int, int]]) -> list[VariantShape]:
    """Every variant's (n, B) from `n_and_b`, compute per step and stability from its fits."""
    out = []
    for group, (n, B) in n_and_b.items():
        runs = [r for r in fits.runs if r.group == group]
        per_step = []
        for r in runs:
            if r.analysis is None:
                continue
            steps = r.analysis.curve.extra.get("step")
            if steps is not None and steps.size and np.isfinite(steps[-1]) and steps[-1] > 0:
                per_step.append(float(r.analysis.curve.x[-1]) / float(steps[-1]))
        why = unstable_because(runs)
        out.append(VariantShape(group, int(n), int(B), float(np.mean(per_step)) if per_step else None,
                                why is None, why))
    return out


def unstable_because(runs: Sequence[RunFit]) -> str | None:
    """Why a variant's runs are not stable (module docstring, step 2), or None when they are."""
    if not runs:
        return "no run"
    for r in runs:
        if r.analysis is None:
            return f"{r.name}: not fitted ({r.error})"
        if r.analysis.truncation is not None:
            return f"{r.name}: {r.analysis.truncation.message()}"
        band, seen = r.predicted_band, r.observed_final
        if r.extrapolates and band is not None and seen is not None and seen < band[0]:
            return (f"{r.name}: its last evaluation {seen:.3f} fell below its fit's band "
                    f"[{band[0]:.3f}, {band[1]:.3f}] (a late drop)")
    return None


def n_star_study(fits: StudyFits, shapes: Sequence[VariantShape],
                 n_budgets: int = LAW_BUDGETS) -> NStarStudy | None:
    """The law over the study, or None when its variants do not differ in n (nothing to model)."""
    if len({s.n for s in shapes}) < 2:
        return None
    budgets = default_budgets(fits, n_budgets)
    choices = compute_optimal(fits, budgets) if len(budgets) > 1 else []
    n_of = {s.variant: s.n for s in shapes}
    n_star = tuple(n_of[c.best.variant] for c in choices)
    separated = sum(1 for c in choices if c.separated)
    studied = sorted({s.n for s in shapes})
    law, error = None, None
    try:
        law = fit_n_star_law([c.budget for c in choices], n_star, n_bounds=(studied[0], studied[-1]))
    except CurveError as err:
        error = str(err)
    return NStarStudy(tuple(c.budget for c in choices), n_star, separated, law, error, tuple(shapes))


def recipe(study: NStarStudy, budget: float) -> Recipe | None:
    """IsoCompute's recipe at `budget` (module docstring); None without a fitted law."""
    if not (math.isfinite(budget) and budget > 0):
        raise InputError(f"--budget: must be a positive compute, got {budget}")
    law = study.law
    if law is None:
        return None
    n_law = float(law.n_star(budget))
    studied = sorted({s.n for s in study.variants})
    n = min(studied, key=lambda v: (abs(math.log2(v) - math.log2(n_law)), v))
    stable = sorted((s for s in study.variants if s.n == n and s.stable), key=lambda s: s.B)
    outside = not law.budget_range[0] <= budget <= law.budget_range[1]
    if not stable:
        tried = ", ".join(f"{s.variant} ({s.why_not})" for s in study.variants if s.n == n)
        return Recipe(budget, n_law, n, None, None, None, None, outside,
                      f"no studied batch with n = {n} is stable: {tried}")
    best = stable[0]
    steps = None if best.compute_per_step is None else budget / best.compute_per_step
    note = (None if best.compute_per_step is not None
            else f"{best.variant}: no step column to measure a step's compute")
    return Recipe(budget, n_law, n, best.B, best.variant, best.compute_per_step, steps, outside, note)


FORM = "log2 n*(C) = log2 n_lo + (log2 n_hi - log2 n_lo) / (1 + (C_mid / C)^b)"


def _law_lines(study: NStarStudy, x_name: str) -> list[str]:
    head = (f"Optimal generations per prompt n*(C) (IsoCompute): the best variant's n at "
            f"{len(study.budgets)} budgets spread in log {x_name} over the study's range "
            f"({study.separated} of them separated from the runner-up)")
    seq = " ".join(str(n) for n in study.n_star)
    if study.law is None:
        return [head, f"  n* per budget: {seq}", f"  law not fitted: {study.error}"]
    w = study.law
    return [head, f"  n* per budget: {seq}", f"  law: {FORM}",
            f"  n_lo = {num(w.n_lo, 3)}   n_hi = {num(w.n_hi, 3)}   C_mid = {num(w.C_mid, 4)}   "
            f"b = {num(w.b, 3)}   RMSE(log2 n) = {w.rmse_log2:.3f}"]


def _recipe_line(r: Recipe, x_name: str) -> str:
    where = " (outside the budgets the law was fitted on: an extrapolation)" if r.extrapolated else ""
    parts = [f"IsoCompute recipe at {x_name} = {num(r.budget, 4)}{where}:",
             f"  n = {r.n} (n*(C) = {r.n_law:.2f} from the law, rounded to the nearest studied n)"]
    if r.B is None:
        parts.append(f"  B_p: {r.note}")
        return "\n".join(parts)
    parts.append(f"  B_p = {r.B}: the smallest stable batch with n = {r.n} ({r.variant}; stable: every run "
                 "fitted, truncation <= 10%, no late drop below its fit)")
    if r.steps is None:
        parts.append(f"  steps: {r.note}")
    else:
        parts.append(f"  M = {num(r.budget, 4)} / {num(r.compute_per_step or 0.0, 4)} per step = "
                     f"{r.steps:.4g} steps: the rest of the budget to more steps")
    return "\n".join(parts)


def stability_rows(study: NStarStudy) -> list[list[str]]:
    return [[s.variant, str(s.n), str(s.B), "-" if s.compute_per_step is None else num(s.compute_per_step, 4),
             "yes" if s.stable else f"no: {s.why_not}"] for s in study.variants]


STABILITY_HEADER = ["variant", "n", "B", "compute per step", "stable"]


def law_text(study: NStarStudy, recipes: Sequence[Recipe | None], x_name: str) -> str:
    lines = _law_lines(study, x_name)
    lines += ["", table(STABILITY_HEADER, stability_rows(study))]
    got = [r for r in recipes if r is not None]
    lines += ["", *(_recipe_line(r, x_name) for r in got)] if got else [
        "", "pass --budget C for the IsoCompute recipe at C" if study.law is not None else ""]
    return "\n".join(lines).rstrip()


def law_markdown(study: NStarStudy, recipes: Sequence[Recipe | None], x_name: str) -> str:
    from scalerl.studies.report import markdown_table

    got = [r for r in recipes if r is not None]
    return "\n".join(["```", *_law_lines(study, x_name), "```", "",
                      markdown_table(STABILITY_HEADER, stability_rows(study)), "",
                      *(["```", *(_recipe_line(r, x_name) for r in got), "```"] if got else [])]).rstrip()


__all__ = ["LAW_BUDGETS", "NStarStudy", "Recipe", "VariantShape", "law_markdown", "law_text", "n_star_study",
           "recipe", "variant_shapes"]
