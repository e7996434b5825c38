"""Fitting the runs of a study and tabulating them the way the ScaleRL paper does (Fig. 7).

Every run's held-out curve is fitted with `scalerl.scaling` on the first part of its compute
(`FitSettings.fraction` of its final compute, or up to an absolute `max_x`), and the fit predicts
the run's last evaluation, the extrapolation test of the paper (fit on the first half, check the
rest). Runs that share a `group` (the seeds of one variant) are combined with
`scalerl.scaling.compare`: mean parameters, bootstrap intervals pooled over the seeds, and the
seed-to-seed spread as the margin. Then every run is refitted with A fixed to the mean A of all
runs (paper Sec. 4), so differences in efficiency show up in B alone; B at that fixed A gets a
bootstrap interval of its own.

Numbers only: nothing here trains or writes; see `report.py` for the text and files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from scalerl.inputs import InputError
from scalerl.scaling.analysis import FitOptions, RunAnalysis, analyze_curve
from scalerl.scaling.compare import PAPER_SEED_MARGIN_A, Comparison, compare, fixed_A_refit
from scalerl.scaling.io import DEFAULT_X, Curve, read_run_dir
from scalerl.scaling.uncertainty import Bootstrap, bootstrap


@dataclass(frozen=True)
class FitSettings:
    """Which columns to fit, on which window, with how much bootstrap.

    `max_x` (absolute) wins over `fraction` (of each run's final compute); `x=None`/`y=None` use
    the scaling module's defaults (`compute_device_hours`, `val_pass_rate`).
    """

    x: str | None = None
    y: str | None = None
    fraction: float = 0.5
    max_x: float | None = None
    n_boot: int = 200
    level: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise InputError(f"fit fraction: must be in (0, 1], got {self.fraction}")
        if self.max_x is not None and not (math.isfinite(self.max_x) and self.max_x > 0):
            raise InputError(f"fit max x: must be a positive number, got {self.max_x}")
        if self.n_boot != 0 and self.n_boot < 10:
            raise InputError(f"bootstrap: use 0 (no intervals) or at least 10 resamples, got {self.n_boot}")
        if not 0 < self.level < 1:
            raise InputError(f"level: must be in (0, 1), got {self.level}")

    def window_end(self, curve: Curve) -> float:
        return self.max_x if self.max_x is not None else self.fraction * float(curve.x.max())

    def describe(self) -> str:
        where = (f"x <= {self.max_x:g}" if self.max_x is not None
                 else f"the first {self.fraction:.0%} of each run's final compute")
        boot = (f"{self.level:.0%} bootstrap intervals ({self.n_boot} resamples, seed {self.seed})"
                if self.n_boot else "no intervals")
        return f"fitted on {where}; {boot}"

    def to_dict(self) -> dict[str, object]:
        return {"x": self.x, "y": self.y, "fraction": self.fraction, "max_x": self.max_x,
                "n_boot": self.n_boot, "level": self.level, "seed": self.seed}


@dataclass(frozen=True, eq=False)
class RunFit:
    """One run's fit, or why there is none. `final_*` is the run's last evaluation and what the
    fit predicted for it (with the bootstrap's observation band: where a new evaluation lands)."""

    name: str
    group: str
    run_dir: Path
    analysis: RunAnalysis | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.analysis is not None

    @property
    def final_x(self) -> float | None:
        return None if self.analysis is None else float(self.analysis.curve.x[-1])

    @property
    def observed_final(self) -> float | None:
        return None if self.analysis is None else float(self.analysis.curve.y[-1])

    @property
    def predicted_final(self) -> float | None:
        if self.analysis is None or not self.analysis.predictions:
            return None
        return self.analysis.predictions[0].reward

    @property
    def predicted_band(self) -> tuple[float, float] | None:
        p = None if self.analysis is None or not self.analysis.predictions else self.analysis.predictions[0]
        if p is None or p.obs_lo is None or p.obs_hi is None:
            return None
        return p.obs_lo, p.obs_hi

    @property
    def extrapolates(self) -> bool:
        """True when the last evaluation lies beyond the fit window (a real prediction)."""
        return self.analysis is not None and not bool(self.analysis.fit.in_fit[-1])

    @property
    def abs_error(self) -> float | None:
        p, o = self.predicted_final, self.observed_final
        return None if p is None or o is None else abs(p - o)


def fit_run(run_dir: str | Path, name: str, group: str, settings: FitSettings) -> RunFit:
    """Read and fit one run directory; a bad or too-short curve becomes `RunFit.error`."""
    path = Path(run_dir)
    try:
        # Studies keep the paper's axis unless told (`scalerl fit` prefers flops when logged).
        curve = replace(read_run_dir(path, settings.x or DEFAULT_X, settings.y), label=name)
        opts = FitOptions(max_x=settings.window_end(curve), n_boot=settings.n_boot, level=settings.level,
                          seed=settings.seed, predict_at=(float(curve.x[-1]),))
        return RunFit(name, group, path, analysis=analyze_curve(curve, opts))
    except (ValueError, FileNotFoundError) as err:
        return RunFit(name, group, path, error=str(err))


@dataclass(frozen=True)
class GroupRow:
    """One line of the Fig. 7 table: a variant (its seeds combined)."""

    group: str
    runs: tuple[str, ...]
    A: float
    A_interval: tuple[float, float] | None
    A_margin: float
    B: float
    B_interval: tuple[float, float] | None
    B_margin: float
    C_mid: float
    C_mid_interval: tuple[float, float] | None
    B_fixed: float | None
    B_fixed_interval: tuple[float, float] | None
    observed_final: float
    predicted_final: float | None
    warnings: tuple[str, ...]

    @property
    def reliable(self) -> bool:
        return not self.warnings

    def to_dict(self) -> dict[str, object]:
        def pair(v: tuple[float, float] | None) -> list[float] | None:
            return None if v is None else [v[0], v[1]]

        return {
            "variant": self.group, "runs": list(self.runs),
            "A": self.A, "A_interval": pair(self.A_interval), "A_margin": self.A_margin,
            "B": self.B, "B_interval": pair(self.B_interval), "B_margin": self.B_margin,
            "C_mid": self.C_mid, "C_mid_interval": pair(self.C_mid_interval),
            "B_at_fixed_A": self.B_fixed, "B_at_fixed_A_interval": pair(self.B_fixed_interval),
            "observed_final": self.observed_final, "predicted_final": self.predicted_final,
            "reliable": self.reliable, "warnings": list(self.warnings),
        }


@dataclass(frozen=True, eq=False)
class StudyFits:
    """All fits of a study: per run, per group (table rows), the comparison and the fixed-A refit."""

    runs: tuple[RunFit, ...]
    rows: tuple[GroupRow, ...]
    comparison: Comparison | None
    fixed_A: float | None  # noqa: N815 (the paper's symbol)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def analyses(self) -> list[RunAnalysis]:
        return [r.analysis for r in self.runs if r.analysis is not None]


def _pooled(boots: Sequence[Bootstrap], name: str) -> tuple[float, float] | None:
    if not boots:
        return None
    col = ("A", "B", "C_mid").index(name)
    level = boots[0].level
    pooled = np.concatenate([b.samples[:, col] for b in boots])
    lo, hi = np.quantile(pooled, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _mean(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return float(np.mean(got)) if got else None


def analyze_study(fits: Sequence[RunFit], settings: FitSettings, order: Sequence[str] = ()) -> StudyFits:
    """Combine fitted runs into table rows (groups in `order`, then any others in run order)."""
    ok = [f for f in fits if f.analysis is not None]
    notes: list[str] = []
    if not ok:
        return StudyFits(tuple(fits), (), None, None, ("no run could be fitted",))
    by_label = {f.name: f.analysis for f in ok}
    cmp = compare(
        {label: a.fit for label, a in by_label.items()},
        {label: a.boot for label, a in by_label.items() if a.boot is not None},
        group_seeds=True,
        margin_A=PAPER_SEED_MARGIN_A,  # the paper's seed margin: the floor of every verdict on A
        recipes={f.name: f.group for f in ok},
        refit_fixed_A=False,
        seed=settings.seed,
    )
    fixed_boots: dict[str, Bootstrap] = {}
    refit = None
    if len(ok) >= 2:
        try:
            refit = fixed_A_refit({label: a.fit for label, a in by_label.items()})
            if settings.n_boot:
                for label, f in refit.fits.items():
                    try:
                        fixed_boots[label] = bootstrap(f, n_boot=settings.n_boot, seed=settings.seed,
                                                       level=settings.level)
                    except ValueError as err:
                        notes.append(f"{label}: no interval for B at fixed A ({err})")
        except ValueError as err:
            notes.append(f"fixed-A refit not possible: {err}")
    if refit is not None:
        cmp = replace(cmp, A_fixed_refit=refit, B_at_fixed_A=refit.recipe_B(cmp.recipes))
    recipes = {r.name: r for r in cmp.recipes}
    groups = [g for g in order if g in recipes] + [r.name for r in cmp.recipes if r.name not in order]
    rows = []
    for name in groups:
        r = recipes[name]
        members = [f for f in ok if f.group == name]
        warnings = tuple(f"{f.name}: {w}" for f in members for w in f.analysis.warnings)  # type: ignore[union-attr]
        rows.append(
            GroupRow(
                group=name,
                runs=r.labels,
                A=r.A, A_interval=r.interval("A"), A_margin=r.A_margin,
                B=r.B, B_interval=r.interval("B"), B_margin=r.B_margin,
                C_mid=r.C_mid, C_mid_interval=r.interval("C_mid"),
                B_fixed=cmp.B_at_fixed_A.get(name),
                B_fixed_interval=_pooled([fixed_boots[lb] for lb in r.labels if lb in fixed_boots], "B"),
                observed_final=float(np.mean([f.observed_final for f in members])),
                predicted_final=_mean([f.predicted_final for f in members]),
                warnings=warnings,
            )
        )
    return StudyFits(tuple(fits), tuple(rows), cmp, None if refit is None else refit.A, tuple(notes))


def group_order(names: Mapping[str, str]) -> list[str]:
    """Groups in first-appearance order of a `{run name: group}` mapping."""
    return list(dict.fromkeys(names.values()))


__all__ = ["FitSettings", "GroupRow", "RunFit", "StudyFits", "analyze_study", "fit_run", "group_order"]
