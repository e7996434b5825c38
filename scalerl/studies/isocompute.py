"""The compute-optimal choice per budget, read off a study's fitted curves (IsoCompute).

A study of one axis (generations per prompt at a fixed total batch, batch size, generation
length, or any grid) fits every variant's pass rate against compute, R_v(C). At a budget C the
compute-optimal variant is `argmax_v R_v(C)`: the frontier of the IsoCompute analysis, which asks
which setting to use for the compute one has, not which one ends highest (ScaleRL Sec. 5 finds
the answer moves with the budget: larger batches and longer generations start slower and end
higher). A variant's value at C is the mean over its seeds of their fitted curves, with the mean
of their bootstrap confidence bands; the choice is `separated` when the best variant's band lies
above the runner-up's band, else the data cannot tell them apart at that budget. A budget past a
variant's last evaluation is an extrapolation of its curve, and marked so.

Numbers only: see `choices_text` / `choices_markdown` for the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scalerl.inputs import InputError
from scalerl.scaling.report import num, table
from scalerl.studies.fitting import StudyFits

DEFAULT_BUDGETS = 5


@dataclass(frozen=True)
class VariantAt:
    """One variant's fitted pass rate at a budget: mean over its seeds, band, whether extrapolated."""

    variant: str
    reward: float
    lo: float | None
    hi: float | None
    extrapolated: bool


@dataclass(frozen=True)
class BudgetChoice:
    """The variants at one budget, best first, and whether the best is separated from the next."""

    budget: float
    ranked: tuple[VariantAt, ...]

    @property
    def best(self) -> VariantAt:
        return self.ranked[0]

    @property
    def runner_up(self) -> VariantAt | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def separated(self) -> bool | None:
        """Best's band above the runner-up's; None without bands (no bootstrap) or a runner-up."""
        b, r = self.best, self.runner_up
        if r is None or b.lo is None or r.hi is None:
            return None
        return bool(b.lo > r.hi)

    def to_dict(self) -> dict[str, object]:
        return {"budget": self.budget, "best": self.best.variant, "separated": self.separated,
                "ranked": [v.__dict__ for v in self.ranked]}


def default_budgets(fits: StudyFits, n: int = DEFAULT_BUDGETS) -> list[float]:
    """`n` budgets spaced evenly in log compute, from where every variant has data (the largest of
    the variants' first positive computes) to the largest final compute of the study."""
    groups: dict[str, list[np.ndarray]] = {}
    for r in fits.runs:
        if r.analysis is not None:
            groups.setdefault(r.group, []).append(r.analysis.curve.x)
    if not groups:
        return []
    starts = [min(float(x[x > 0].min()) for x in xs if (x > 0).any()) for xs in groups.values()]
    end = max(float(x.max()) for xs in groups.values() for x in xs)
    lo = max(starts)
    if not lo < end:
        return [end]
    return [float(v) for v in np.geomspace(lo, end, n)]


def compute_optimal(fits: StudyFits, budgets: Sequence[float] | None = None) -> list[BudgetChoice]:
    """The ranking of the study's variants at each budget (see the module docstring)."""
    by_group: dict[str, list] = {}
    for r in fits.runs:
        if r.analysis is not None:
            by_group.setdefault(r.group, []).append(r.analysis)
    if len(by_group) < 2:
        return []
    chosen = list(budgets) if budgets is not None else default_budgets(fits)
    for b in chosen:
        if not (np.isfinite(b) and b > 0):
            raise InputError(f"--budget: must be a positive compute, got {b}")
    out = []
    for budget in chosen:
        c = np.array([budget])
        at = []
        for group, analyses in by_group.items():
            reward = float(np.mean([a.fit.predict(c)[0] for a in analyses]))
            bands = [a.boot.band(c) for a in analyses if a.boot is not None]
            lo = float(np.mean([b[0][0] for b in bands])) if len(bands) == len(analyses) else None
            hi = float(np.mean([b[1][0] for b in bands])) if len(bands) == len(analyses) else None
            last = max(float(a.curve.x.max()) for a in analyses)
            at.append(VariantAt(group, reward, lo, hi, budget > last))
        at.sort(key=lambda v: -v.reward)
        out.append(BudgetChoice(float(budget), tuple(at)))
    return out


HEADER = ["budget", "best", "fitted pass rate", "runner-up", "its pass rate", "separated"]


def _rows(choices: Sequence[BudgetChoice]) -> list[list[str]]:
    def cell(v: VariantAt) -> str:
        band = f" [{v.lo:.3f}, {v.hi:.3f}]" if v.lo is not None and v.hi is not None else ""
        return f"{v.reward:.3f}{band}" + (" *" if v.extrapolated else "")

    rows = []
    for ch in choices:
        r = ch.runner_up
        sep = {True: "yes", False: "no (bands overlap)", None: "-"}[ch.separated]
        rows.append([num(ch.budget, 4), ch.best.variant, cell(ch.best), "-" if r is None else r.variant,
                     "-" if r is None else cell(r), sep])
    return rows


def legend(x_name: str) -> str:
    return (f"Compute-optimal variant per budget ({x_name}), read off the fitted curves (IsoCompute): the "
            "variant with the highest fitted pass rate there (mean over its seeds, [bootstrap band]); "
            "separated: its band lies above the runner-up's; * = beyond that variant's last evaluation "
            "(an extrapolation).")


def choices_text(choices: Sequence[BudgetChoice], x_name: str) -> str:
    if not choices:
        return "compute-optimal choice: needs at least two fitted variants"
    return legend(x_name) + "\n" + table(HEADER, _rows(choices))


def choices_markdown(choices: Sequence[BudgetChoice], x_name: str) -> str:
    from scalerl.studies.report import markdown_table

    if not choices:
        return "_Needs at least two fitted variants._"
    return legend(x_name) + "\n\n" + markdown_table(HEADER, _rows(choices))


__all__ = ["BudgetChoice", "VariantAt", "choices_markdown", "choices_text", "compute_optimal",
           "default_budgets"]
