"""Compare recipes the way the ScaleRL paper does.

* A recipe is one or more runs that differ only by seed. Its curve uses the mean A and B and the
  geometric-mean C_mid of its seeds; its margin on A (and B) is the largest of: the seed-to-seed
  margin (paper A.5: about +-0.02 on A from 3 seeds), the half-width of its bootstrap interval,
  and a floor the user may set. Two recipes differ in A when ``|A1 - A2| > sqrt(m1^2 + m2^2)``
  (the margins combined as independent errors); likewise for B.
* Who is ahead at compute X: predicted reward with a band, and the probability that the leader
  is really ahead of the runner-up (pairing bootstrap replicates of the two at random).
* Crossover (paper Fig. 13b): the compute at which a slower recipe with a higher asymptote
  overtakes a faster one, with a bootstrap interval.
* Verdicts are honest: "a has the higher A" (or B) needs both recipes' fits to be *identifiable*
  (every seed's data reaches ``IDENTIFIABLE_SPAN`` x C_mid, A and B off their bounds, the reward
  rising, no systematic misfit) *and* the difference to exceed the combined margin; otherwise the
  verdict is ``undetermined``, with the reasons. A fit whose data stops before its midpoint can
  put A anywhere along a flat valley (often on its bound of 1), and a difference of two such A's is
  not a measurement.
* Predictions (who is ahead) more than ``EXTRAPOLATION_LIMIT`` x beyond a recipe's fitted data,
  and those of flagged fits, carry caveats.
* Starting models: runs that started from different weights (``start_model.json`` of a scalerl
  run) compare the recipes *and* their starting points; the comparison says so.
* Fixed-A refit (paper Sec. 4 / Fig. 7): refit every run with A fixed to the mean A of all runs,
  so the remaining difference sits in B; ``efficiency_transform`` linearises a curve for that
  plot: ``F(R) = C_mid^B / ((A - R0) / (R - R0) - 1)`` equals ``C^B`` on the sigmoid, so
  ``ln F`` against ``ln C`` is a line of slope B.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import brentq
from scipy.special import expit

from scalerl.scaling.diagnostics import IDENTIFIABLE_SPAN
from scalerl.scaling.forms import log_compute
from scalerl.scaling.pooled import PooledFit
from scalerl.scaling.sigmoid import SigmoidFit, fit_sigmoid
from scalerl.scaling.uncertainty import Bootstrap, SeedSpread, seed_spread
from scalerl.scaling.validation import CurveError

#: The paper's seed-to-seed margin on A (A.5 / Fig. 8a: about +-0.02 from three seeds of one
#: recipe). ``scalerl compare`` and the studies use it as the floor of every recipe's margin on A:
#: a difference smaller than what reseeding alone moves A by is no verdict, even when a recipe has a
#: single seed (no measured spread) or a few seeds that happened to agree.
PAPER_SEED_MARGIN_A = 0.02

#: Predictions further than this multiple of a run's largest fitted compute carry a caveat. The
#: paper's extrapolations (fit to 50k GPU-h, predict 100k) and the demo's (fit the first half)
#: reach 2x, a little more when the last fitted point falls short of the window's end.
EXTRAPOLATION_LIMIT = 2.5

#: A predicted lead at a compute below this is inside what a first-half extrapolation is accurate
#: to (the paper's +-0.02 on extrapolated points, Sec. 2), so it decides nothing however high
#: P(ahead) is: P(ahead) carries the fits' noise, not an error the seeds of a recipe share.
#: Measured in docs/studies.md ("Do early comparisons decide?"): a tie called at P 0.95 on a
#: predicted lead of 0.017.
LEAD_MARGIN = 0.02

_SEED_SUFFIX = re.compile(r"[-_.](?:seed|s)[-_=]?\d+$", re.IGNORECASE)


def recipe_name(label: str) -> str:
    """Recipe key of a run label: the label without a trailing seed tag.

    ``"scalerl-bs512-seed2" -> "scalerl-bs512"``, ``"cispo_s3" -> "cispo"``; other labels are
    their own recipe.
    """
    stripped = _SEED_SUFFIX.sub("", label)
    return stripped or label


@dataclass(frozen=True, eq=False)
class Recipe:
    """One recipe: its seeds' fits (and bootstraps), representative curve and margins."""

    name: str
    labels: tuple[str, ...]
    fits: tuple[SigmoidFit, ...]
    boots: tuple[Bootstrap, ...]
    spread: SeedSpread
    A_margin: float
    B_margin: float
    # The seeds fitted as one curve (``pooled.fit_pooled``): its parameters and bootstrap replace
    # the mean of the seeds' own fits and their pooled bootstraps.
    pooled: PooledFit | None = None

    @property
    def A(self) -> float:
        return self.pooled.A if self.pooled is not None else self.spread.A_mean

    @property
    def B(self) -> float:
        return self.pooled.B if self.pooled is not None else self.spread.B_mean

    @property
    def C_mid(self) -> float:
        return self.pooled.C_mid if self.pooled is not None else self.spread.C_mid_mean

    @property
    def R0(self) -> float:
        return float(np.mean([f.R0 for f in self.fits]))

    def predict(self, compute: ArrayLike) -> NDArray[np.float64]:
        """Representative curve: the sigmoid at the mean parameters of the seeds."""
        z = log_compute(compute) - math.log(self.C_mid)
        return self.R0 + (self.A - self.R0) * expit(self.B * z)

    def replicate_curves(self, compute: ArrayLike) -> NDArray[np.float64] | None:
        """Bootstrap curves pooled over seeds (seed-to-seed and fit uncertainty together), or None;
        a pooled recipe's: the replicates of its pooled fit."""
        if self.pooled is not None:
            return self.pooled.curves(compute)
        if not self.boots:
            return None
        return np.concatenate([b.curves(compute) for b in self.boots], axis=0)

    def interval(self, name: str) -> tuple[float, float] | None:
        """Percentile interval of a parameter pooled over the seeds' bootstraps (None without any);
        a pooled recipe's: its pooled fit's interval."""
        if self.pooled is not None:
            return self.pooled.interval(name)
        if not self.boots:
            return None
        col = ("A", "B", "C_mid").index(name)
        pooled = np.concatenate([b.samples[:, col] for b in self.boots])
        level = self.boots[0].level
        lo, hi = np.quantile(pooled, [(1 - level) / 2, (1 + level) / 2])
        return float(lo), float(hi)


def _half_width(boots: Sequence[Bootstrap], name: str) -> float:
    widths = [0.5 * (b.interval(name)[1] - b.interval(name)[0]) for b in boots]
    return float(max(widths)) if widths else 0.0


def make_recipe(
    name: str,
    fits: Mapping[str, SigmoidFit],
    boots: Sequence[Bootstrap] = (),
    margin_A: float = 0.0,
    margin_B: float = 0.0,
    pooled: PooledFit | None = None,
) -> Recipe:
    """Group seeds (labels -> fits) into a recipe; margins as in the module docstring. A pooled
    recipe's margin is the larger of its pooled interval's half-width and the floor: the pooled
    fit already measures how far its seeds' noise moves A."""
    if not fits:
        raise CurveError(f"recipe {name!r} has no runs")
    spread = seed_spread(list(fits.values()))

    def margin(seed_margin: float, boot_half: float, floor: float) -> float:
        parts = [p for p in (seed_margin, boot_half, floor) if math.isfinite(p)]
        return max(parts) if parts else 0.0

    if pooled is not None:
        def half(param: str) -> float:
            iv = pooled.interval(param)
            return 0.0 if iv is None else 0.5 * (iv[1] - iv[0])

        return Recipe(name=name, labels=tuple(fits), fits=tuple(fits.values()), boots=tuple(boots),
                      spread=spread, A_margin=margin(half("A"), 0.0, margin_A),
                      B_margin=margin(half("B"), 0.0, margin_B), pooled=pooled)

    return Recipe(
        name=name,
        labels=tuple(fits),
        fits=tuple(fits.values()),
        boots=tuple(boots),
        spread=spread,
        A_margin=margin(spread.A_margin, _half_width(boots, "A"), margin_A),
        B_margin=margin(spread.B_margin, _half_width(boots, "B"), margin_B),
    )


def undetermined_reasons(recipe: Recipe, parameter: str) -> tuple[str, ...]:
    """Why ``recipe``'s ``parameter`` ("A" or "B") cannot carry a verdict (empty: it can); a pooled
    recipe's come from its pooled fit (A on its bound, data short of its midpoint, departing seeds)."""
    if recipe.pooled is not None:
        return tuple(f"{recipe.name} (pooled): {w}" for w in recipe.pooled.warnings)
    reasons: list[str] = []
    for label, f in zip(recipe.labels, recipe.fits, strict=True):
        d = f.diagnostics
        if not d.increasing:
            reasons.append(f"{label}: the reward does not clearly rise in the fit window")
        if d.misfit:
            reasons.append(f"{label}: systematic misfit (the curve is not sigmoid-shaped)")
        if not d.identifiable and not f.A_fixed:
            reasons.append(f"{label}: data stops at {d.C_max_over_C_mid:.2f}x C_mid "
                           f"(A needs >= {IDENTIFIABLE_SPAN:g}x)")
        if d.A_at_bound and not f.A_fixed:
            reasons.append(f"{label}: A = {f.A:.4g} is on its bound")
        if parameter == "B" and d.B_at_bound:
            reasons.append(f"{label}: B is on its search bound")
        if d.C_mid_at_bound:
            reasons.append(f"{label}: C_mid is on its search bound")
    return tuple(reasons)


def crossovers(
    f: Recipe | SigmoidFit, g: Recipe | SigmoidFit, lo: float, hi: float, n: int = 2000
) -> list[float]:
    """Computes in ``[lo, hi]`` where the two curves cross, ascending (sign changes of
    ``R_f - R_g`` on a log grid of ``n`` points, each refined by Brent's method)."""
    if not 0 < lo < hi:
        raise CurveError(f"need 0 < lo < hi, got {lo}, {hi}")
    grid = np.geomspace(lo, hi, n)
    diff = f.predict(grid) - g.predict(grid)
    roots: list[float] = []
    for i in np.flatnonzero(np.sign(diff[:-1]) * np.sign(diff[1:]) < 0):

        def h(u: float) -> float:
            c = np.array([math.exp(u)])
            return float(f.predict(c)[0] - g.predict(c)[0])

        roots.append(math.exp(brentq(h, math.log(grid[i]), math.log(grid[i + 1]), xtol=1e-12)))
    return roots


def _replicate_crossovers(
    cf: NDArray[np.float64], cg: NDArray[np.float64], grid: NDArray[np.float64], seed: int
) -> NDArray[np.float64]:
    """First crossing of randomly paired replicate curves (NaN where a pair never crosses)."""
    rng = np.random.default_rng(seed)
    k = max(cf.shape[0], cg.shape[0])
    diff = cf[rng.integers(0, cf.shape[0], k)] - cg[rng.integers(0, cg.shape[0], k)]
    change = np.sign(diff[:, :-1]) * np.sign(diff[:, 1:]) < 0
    has = change.any(axis=1)
    i = np.argmax(change, axis=1)
    rows = np.arange(k)
    d0, d1 = diff[rows, i], diff[rows, i + 1]
    lg = np.log(grid)
    t = np.where(d1 != d0, d0 / np.where(d1 != d0, d0 - d1, 1.0), 0.5)
    # A sign change puts t in [0, 1]; rows without one are discarded below, but their arbitrary t
    # could overflow exp(), so clip them into range too.
    t = np.clip(t, 0.0, 1.0)
    out = np.exp(lg[i] + t * (lg[i + 1] - lg[i]))
    return np.where(has, out, np.nan)


@dataclass(frozen=True)
class PairVerdict:
    """How recipe ``a`` compares with recipe ``b`` (differences are a - b)."""

    a: str
    b: str
    A_diff: float
    A_margin: float
    A_differs: bool
    B_diff: float
    B_margin: float
    B_differs: bool
    crossovers: tuple[float, ...]
    crossover_interval: tuple[float, float] | None
    crossover_fraction: float | None
    A_undetermined: tuple[str, ...] = ()
    B_undetermined: tuple[str, ...] = ()

    def verdict(self, parameter: str) -> str:
        """``"a_higher"`` / ``"b_higher"`` (beyond the margin, both fits identifiable),
        ``"within_margin"``, or ``"undetermined"`` (see ``undetermined_reasons``)."""
        diff, differs, why = (
            (self.A_diff, self.A_differs, self.A_undetermined)
            if parameter == "A"
            else (self.B_diff, self.B_differs, self.B_undetermined)
        )
        if why:
            return "undetermined"
        if not differs:
            return "within_margin"
        return "a_higher" if diff > 0 else "b_higher"

    def leader(self, parameter: str) -> str | None:
        """The recipe with the higher ``parameter``, when the verdict names one."""
        v = self.verdict(parameter)
        return self.a if v == "a_higher" else self.b if v == "b_higher" else None

    def to_dict(self) -> dict[str, object]:
        return {
            "a": self.a,
            "b": self.b,
            "A_diff": self.A_diff,
            "A_margin": self.A_margin,
            "A_differs": self.A_differs,
            "A_verdict": self.verdict("A"),
            "A_higher": self.leader("A"),
            "A_undetermined_because": list(self.A_undetermined),
            "B_diff": self.B_diff,
            "B_margin": self.B_margin,
            "B_differs": self.B_differs,
            "B_verdict": self.verdict("B"),
            "B_higher": self.leader("B"),
            "B_undetermined_because": list(self.B_undetermined),
            "crossovers": list(self.crossovers),
            "crossover_interval": None if self.crossover_interval is None else list(self.crossover_interval),
            "crossover_fraction": self.crossover_fraction,
        }


def compare_pair(a: Recipe, b: Recipe, lo: float, hi: float, seed: int = 0) -> PairVerdict:
    """A/B differences against the combined margins, and crossovers in ``[lo, hi]``."""
    dA, dB = a.A - b.A, a.B - b.B
    mA = math.hypot(a.A_margin, b.A_margin)
    mB = math.hypot(a.B_margin, b.B_margin)
    roots = crossovers(a, b, lo, hi)
    interval: tuple[float, float] | None = None
    fraction: float | None = None
    grid = np.geomspace(lo, hi, 400)
    ca, cb = a.replicate_curves(grid), b.replicate_curves(grid)
    if ca is not None and cb is not None:
        reps = _replicate_crossovers(ca, cb, grid, seed)
        crossed = reps[np.isfinite(reps)]
        fraction = float(crossed.size / reps.size)
        if crossed.size >= 10:
            q = a.pooled.level if a.pooled is not None else a.boots[0].level
            lo_q, hi_q = np.quantile(crossed, [(1 - q) / 2, (1 + q) / 2])
            interval = (float(lo_q), float(hi_q))
    why_A = undetermined_reasons(a, "A") + undetermined_reasons(b, "A")
    why_B = undetermined_reasons(a, "B") + undetermined_reasons(b, "B")
    return PairVerdict(
        a=a.name,
        b=b.name,
        A_diff=dA,
        A_margin=mA,
        A_differs=abs(dA) > mA and not why_A,
        B_diff=dB,
        B_margin=mB,
        B_differs=abs(dB) > mB and not why_B,
        crossovers=tuple(roots),
        crossover_interval=interval,
        crossover_fraction=fraction,
        A_undetermined=why_A,
        B_undetermined=why_B,
    )


@dataclass(frozen=True)
class Standing:
    """Predicted rewards at one compute, best first; ``p_ahead`` = P(leader > runner-up)."""

    compute: float
    ranking: tuple[tuple[str, float, float | None, float | None], ...]
    p_ahead: float | None
    caveats: tuple[str, ...] = ()

    @property
    def leader(self) -> str:
        return self.ranking[0][0]

    @property
    def lead(self) -> float | None:
        """The leader's predicted reward minus the runner-up's (None with one recipe)."""
        return self.ranking[0][1] - self.ranking[1][1] if len(self.ranking) >= 2 else None

    def to_dict(self) -> dict[str, object]:
        return {
            "compute": self.compute,
            "leader": self.leader,
            "p_ahead": self.p_ahead,
            "caveats": list(self.caveats),
            "ranking": [{"recipe": n, "reward": r, "lo": lo, "hi": hi} for n, r, lo, hi in self.ranking],
        }


def standing_at(recipes: Sequence[Recipe], compute: float, level: float = 0.95, seed: int = 0) -> Standing:
    """Which recipe is ahead at ``compute`` (predicted reward, band, probability of the lead)."""
    rows = []
    curves = {}
    for r in recipes:
        pred = float(r.predict(np.array([compute]))[0])
        reps = r.replicate_curves(np.array([compute]))
        lo = hi = None
        if reps is not None:
            curves[r.name] = reps[:, 0]
            lo, hi = (float(v) for v in np.quantile(reps[:, 0], [(1 - level) / 2, (1 + level) / 2]))
        rows.append((r.name, pred, lo, hi))
    rows.sort(key=lambda row: -row[1])
    p_ahead = None
    if len(rows) >= 2 and rows[0][0] in curves and rows[1][0] in curves:
        rng = np.random.default_rng(seed)
        x, y = curves[rows[0][0]], curves[rows[1][0]]
        k = max(x.size, y.size)
        p_ahead = float(np.mean(x[rng.integers(0, x.size, k)] > y[rng.integers(0, y.size, k)]))
    st = Standing(compute=float(compute), ranking=tuple(rows), p_ahead=p_ahead,
                  caveats=prediction_caveats(recipes, compute))
    if st.lead is not None and st.lead < LEAD_MARGIN:
        small = (f"{rows[0][0]} leads {rows[1][0]} by {st.lead:.3f}, under the +-{LEAD_MARGIN:g} a "
                 "first-half extrapolation is accurate to: not a decision")
        st = replace(st, caveats=(*st.caveats, small))
    return st


def extrapolation_caveat(label: str, fit: SigmoidFit, compute: float) -> str | None:
    """A sentence when ``compute`` is more than ``EXTRAPOLATION_LIMIT`` x beyond ``fit``'s data."""
    top = float(fit.fit_compute.max())
    if top > 0 and compute > EXTRAPOLATION_LIMIT * top:
        return (f"{label}: {compute / top:.1f}x beyond its fitted data (up to {top:.4g}); "
                f"extrapolations past ~{EXTRAPOLATION_LIMIT:g}x are untested")
    return None


def prediction_caveats(recipes: Sequence[Recipe], compute: float) -> tuple[str, ...]:
    """Caveats on predictions at ``compute``: far extrapolations and flagged fits."""
    out = []
    for r in recipes:
        if r.pooled is not None and compute > r.pooled.max_compute:
            # Measured in docs/studies.md ("Do early comparisons decide?"): at 2x beyond the data
            # each recipe's seeds missed in one direction, and the pooled P(ahead) decided a tie.
            out.append(f"{r.name} (pooled): its band assumes the seeds' extrapolation errors are "
                       "independent; where they are shared (seeds that miss in one direction) the "
                       "band and P(ahead) are over-confident (compare the seeds unpooled to rank "
                       "recipes)")
        for label, f in zip(r.labels, r.fits, strict=True):
            far = extrapolation_caveat(label, f, compute)
            if far:
                out.append(far)
            if not f.diagnostics.reliable:
                out.append(f"{label}: its fit is flagged ({len(f.diagnostics.warnings)} warning(s)); "
                           "its band understates the uncertainty")
    return tuple(out)


@dataclass(frozen=True, eq=False)
class FixedARefit:
    """Every run refitted with A = ``A`` (the mean A of all runs unless given); B carries the difference."""

    A: float
    fits: Mapping[str, SigmoidFit]

    def recipe_B(self, recipes: Sequence[Recipe]) -> dict[str, float]:
        """Mean refitted B per recipe (over its seeds), keyed by recipe name."""
        return {r.name: float(np.mean([self.fits[label].B for label in r.labels])) for r in recipes}


def fixed_A_refit(fits: Mapping[str, SigmoidFit], A: float | None = None) -> FixedARefit:
    """Paper Sec. 4: refit each run (same window, same R0) with A fixed to the mean fitted A."""
    if not fits:
        raise CurveError("no fits to refit")
    common = float(np.mean([f.A for f in fits.values()])) if A is None else float(A)
    refits = {}
    for label, f in fits.items():
        if common <= f.R0:
            raise CurveError(f"{label}: the common A = {common:.4g} is not above its R0 = {f.R0:.4g}")
        refits[label] = fit_sigmoid(
            f.compute, f.reward, r0=f.R0, include=f.in_fit, fixed_A=common, method="fast"
        )
    return FixedARefit(A=common, fits=refits)


def efficiency_transform(
    reward: ArrayLike, A: float, B: float, C_mid: float, R0: float
) -> NDArray[np.float64]:
    """``F(R) = C_mid^B / ((A - R0) / (R - R0) - 1)`` (paper Sec. 4); NaN unless R0 < R < A.

    On the sigmoid ``(A - R0) / (R - R0) - 1 = (C_mid / C)^B``, so ``F = C^B``: plotted against C
    on log-log axes every run becomes a line of slope B. Computed as
    ``exp(B ln C_mid - ln((A - R) / (R - R0)))`` to stay finite for FLOP-scale compute.
    """
    r = np.asarray(reward, dtype=np.float64)
    sign = 1.0 if A > R0 else -1.0
    valid = (sign * (r - R0) > 0) & (sign * (A - r) > 0)
    ratio = np.where(valid, (A - r) / np.where(valid, r - R0, 1.0), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(valid, np.exp(B * math.log(C_mid) - np.log(ratio)), np.nan)


def efficiency_slope(fit: SigmoidFit) -> float:
    """Least-squares slope of ``ln F(R)`` on ``ln C`` over the fitted points (an estimate of B that
    uses only A, R0 and the data: C_mid cancels in the slope). NaN with fewer than 2 valid points."""
    F = efficiency_transform(fit.fit_reward, fit.A, fit.B, fit.C_mid, fit.R0)
    ok = np.isfinite(F) & (F > 0)
    if ok.sum() < 2:
        return math.nan
    x, y = np.log(fit.fit_compute[ok]), np.log(F[ok])
    return float(np.polyfit(x, y, 1)[0])


@dataclass(frozen=True, eq=False)
class Comparison:
    """Everything ``scalerl compare`` reports."""

    recipes: tuple[Recipe, ...]
    pairs: tuple[PairVerdict, ...]
    standings: tuple[Standing, ...]
    A_fixed_refit: FixedARefit | None
    B_at_fixed_A: Mapping[str, float]
    start_models: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def same_start_model(self) -> bool | None:
        """True when every run recorded the same starting model, False when they differ, None when
        some run did not record one (then nothing is known)."""
        keys = list(self.start_models.values())
        if not keys or any(k is None for k in keys):
            return None
        return len(set(keys)) == 1


def compare(
    fits: Mapping[str, SigmoidFit],
    boots: Mapping[str, Bootstrap] | None = None,
    at: Sequence[float] = (),
    margin_A: float = 0.0,
    margin_B: float = 0.0,
    group_seeds: bool = True,
    recipes: Mapping[str, str] | None = None,
    fixed_A: float | None = None,
    refit_fixed_A: bool = True,
    seed: int = 0,
    start_models: Mapping[str, str | None] | None = None,
    pooled: Mapping[str, PooledFit] | None = None,
) -> Comparison:
    """Compare runs (labels -> fits): group seeds into recipes, then pairs, standings, fixed-A refit.

    ``at`` defaults to the largest compute any run reached. Crossovers are searched from the
    smallest fitted compute to 100x the largest. A run's recipe is ``recipes[label]`` when given
    (e.g. from config.yaml), else its label without a seed tag (``recipe_name``); with
    ``group_seeds=False`` every run is its own recipe. ``start_models`` maps labels to a key of
    the model each run started from (``scalerl.model_identity.identity_key``; None: unknown).
    ``pooled`` maps recipe names to their pooled fits (``pooled.fit_pooled``), used in place of
    the mean of their seeds' fits.
    """
    if len(fits) < 1:
        raise CurveError("nothing to compare")
    boots = boots or {}
    groups: dict[str, list[str]] = {}
    named = recipes or {}
    for label in fits:
        key = (named.get(label) or recipe_name(label)) if group_seeds else label
        groups.setdefault(key, []).append(label)
    grouped = tuple(
        make_recipe(
            name,
            {lb: fits[lb] for lb in labels},
            [boots[lb] for lb in labels if lb in boots],
            margin_A,
            margin_B,
            (pooled or {}).get(name),
        )
        for name, labels in groups.items()
    )
    lo = min(float(f.fit_compute.min()) for f in fits.values())
    hi = max(float(f.compute.max()) for f in fits.values())
    pairs = tuple(
        compare_pair(grouped[i], grouped[j], lo, 100.0 * hi, seed=seed)
        for i in range(len(grouped))
        for j in range(i + 1, len(grouped))
    )
    points = tuple(at) if at else (hi,)
    level = next(iter(boots.values())).level if boots else 0.95
    standings = tuple(standing_at(grouped, c, level=level, seed=seed) for c in points)
    refit = fixed_A_refit(fits, fixed_A) if refit_fixed_A and len(fits) >= 2 else None
    return Comparison(
        recipes=grouped,
        pairs=pairs,
        standings=standings,
        A_fixed_refit=refit,
        B_at_fixed_A=refit.recipe_B(grouped) if refit is not None else {},
        start_models=dict(start_models or {}),
    )
