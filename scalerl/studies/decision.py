"""Do early comparisons decide? Score `compare` on cut runs against where the full runs end.

The question a researcher asks of an early comparison is which recipe ends ahead at the budget
they will spend. This module answers it from several seeds of each recipe, run to that budget:

* **The budget** ``C_end`` is the smallest final compute over all runs, so every recipe is judged
  at the same compute.
* **The truth** for a pair of recipes is where their full runs are at ``C_end``: each seed's level
  is the mean of its last ``tail`` evaluations at or below ``C_end`` (one evaluation is noisy), and
  the pair is *separated* when Welch's t-test on the two recipes' seed levels rejects equal means
  at ``alpha`` (two-sided). Unseparated pairs are ties: no early answer may call them.
* **The early call** at fraction ``f``: every run's curve is cut at ``f x C_end`` (the points
  beyond are dropped before anything is fitted), each cut run is fitted as `scalerl fit` does,
  and `scaling.compare.compare` is asked for the standing at ``C_end`` (what `scalerl compare
  --at C_end` prints) with the seeds of a recipe grouped: its replicate curves are all its seeds'
  bootstrap replicates together, so P(ahead) carries where *a seed* of the recipe may land (each
  fit's extrapolation error and the seed-to-seed spread), not only the noise of the mean. A pair
  is *decided* when the leader of the two is ahead with probability ``>= level`` over those
  replicates, its predicted lead is at least ``margin`` (`scaling.compare.LEAD_MARGIN`, the
  paper's +-0.02 on extrapolated points: P(ahead) carries the fits' noise, not an extrapolation
  error the seeds of a recipe share), and neither recipe's fits are flagged (compare's caveat: a
  flagged fit's band understates its uncertainty). Otherwise it is undecided. ``block_flagged=False``
  drops the last condition (the rule the second set of docs/studies.md proposed: flagged fits
  decide on P(ahead) and the margin like the others).
* **Why not the pooled fit** (``pool=True``, the `--pool` fit of `scaling.pooled`, each seed's own
  fit when pooling fails): its band narrows like ``1 / sqrt(S)`` because it treats the seeds'
  errors as independent. Extrapolation errors are not: on the shipped reference runs at 50%,
  every seed of a recipe misses its final level in the same direction (scalerl's three seeds
  over-predict by +0.005 to +0.022, lr 3e-5's under-predict by -0.008 to -0.022), so the pooled
  P(ahead) calls a pair the full runs cannot separate at 1.00. ``pool=True`` keeps that call
  reproducible (docs/studies.md).
* **The score** per fraction: decided pairs that name the full runs' leader (correct), decided
  pairs that name the other recipe of a separated pair (a confident wrong call), decided ties
  (the full runs cannot separate them), and separated pairs left undecided (missed, not wrong).

``benchmarks/decision_study.py`` runs it on run folders or on the CSV export of them;
``tests/studies/test_decision.py`` replays the shipped reference runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np
from scipy import stats

from scalerl.scaling.analysis import FitOptions, RunAnalysis, analyze_curve
from scalerl.scaling.compare import LEAD_MARGIN, compare, standing_at
from scalerl.scaling.io import Curve
from scalerl.scaling.pooled import PooledFit, fit_pooled
from scalerl.scaling.validation import CurveError

TAIL = 3
ALPHA = 0.05
LEVEL = 0.95


def budget(curves: Mapping[str, Sequence[Curve]]) -> float:
    """``C_end``: the smallest final compute of any run (every recipe is judged there)."""
    return min(float(c.x[-1]) for runs in curves.values() for c in runs)


def level_at(curve: Curve, c_end: float, tail: int = TAIL) -> float:
    """Mean of the last ``tail`` evaluations at or below ``c_end``."""
    y = curve.y[curve.x <= c_end * (1 + 1e-12)]
    if y.size == 0:
        raise CurveError(f"{curve.label}: no evaluation at or below {c_end:.4g}")
    return float(np.mean(y[-tail:]))


@dataclass(frozen=True)
class PairTruth:
    """Where the full runs of recipes ``a`` and ``b`` are at ``C_end`` (difference a - b)."""

    a: str
    b: str
    diff: float
    p_value: float
    separated: bool

    @property
    def leader(self) -> str | None:
        if not self.separated:
            return None
        return self.a if self.diff > 0 else self.b


def welch_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test for equal means (1.0 when both samples are constant
    and equal; 0.0 when constant and different)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.ptp(xa) == 0 and np.ptp(ya) == 0:
        return 1.0 if xa[0] == ya[0] else 0.0
    return float(stats.ttest_ind(xa, ya, equal_var=False).pvalue)


def truths(levels: Mapping[str, Sequence[float]], alpha: float = ALPHA) -> dict[tuple[str, str], PairTruth]:
    """Every pair of recipes (in the mapping's order): separated when Welch's p < ``alpha``."""
    out = {}
    for a, b in combinations(levels, 2):
        p = welch_p(levels[a], levels[b])
        out[(a, b)] = PairTruth(a, b, float(np.mean(levels[a]) - np.mean(levels[b])), p, p < alpha)
    return out


def cut(curve: Curve, x_max: float) -> Curve:
    """The curve's points with x <= ``x_max`` only (nothing later is seen by the fit)."""
    keep = curve.x <= x_max * (1 + 1e-12)
    return replace(curve, x=curve.x[keep], y=curve.y[keep], lines=curve.lines[keep],
                   extra={k: v[keep] for k, v in curve.extra.items()}, truncation=None)


@dataclass(frozen=True)
class EarlyCall:
    """Compare's answer for one pair at one fraction."""

    a: str
    b: str
    leader: str
    p_ahead: float | None
    flagged: bool
    decided: bool
    A_verdict: str
    lead: float  # the leader's predicted reward minus the other's, at the budget


def _pool(name: str, analyses: Sequence[RunAnalysis], n_boot: int, seed: int) -> PooledFit | None:
    try:
        return fit_pooled(name, [(x.curve.label, x.fit) for x in analyses], n_boot=n_boot, seed=seed)
    except CurveError:  # e.g. a seed's R0 at A's bound: compare falls back to the seeds' own fits
        return None


def early_calls(curves: Mapping[str, Sequence[Curve]], fraction: float, c_end: float,
                opts: FitOptions, level: float = LEVEL, pool: bool = False,
                margin: float = LEAD_MARGIN,
                block_flagged: bool = True) -> tuple[dict[tuple[str, str], EarlyCall], list[str]]:
    """Compare's call for every pair with each run cut at ``fraction x c_end`` (see the module
    docstring), and notes on what could not be fitted."""
    notes: list[str] = []
    analyses: dict[str, list[RunAnalysis]] = {}
    for name, runs in curves.items():
        for c in runs:
            part = cut(c, fraction * c_end)
            try:
                fitted = analyze_curve(part, opts)
            except CurveError as err:
                notes.append(f"{c.label} at {fraction:g}: not fitted ({err})")
                continue
            analyses.setdefault(name, []).append(fitted)
    if len(analyses) < 2:  # too early to fit two recipes: every pair is undecided
        return {}, notes
    pooled = {n: p for n, a in analyses.items() if pool and len(a) >= 2
              for p in [_pool(n, a, opts.n_boot, opts.seed)] if p is not None}
    fits = {x.curve.label: x.fit for a in analyses.values() for x in a}
    boots = {x.curve.label: x.boot for a in analyses.values() for x in a if x.boot is not None}
    named = {x.curve.label: n for n, a in analyses.items() for x in a}
    cmp = compare(fits, boots, at=(c_end,), recipes=named, seed=opts.seed, pooled=pooled,
                  refit_fixed_A=False)
    by_name = {r.name: r for r in cmp.recipes}
    verdicts = {(p.a, p.b): p for p in cmp.pairs}
    out = {}
    for a, b in combinations(curves, 2):
        if a not in by_name or b not in by_name:
            continue
        ra, rb = by_name[a], by_name[b]
        st = standing_at([ra, rb], c_end, level=level, seed=opts.seed)
        flagged = any(not f.diagnostics.reliable for f in (*ra.fits, *rb.fits))
        pv = verdicts.get((a, b)) or verdicts.get((b, a))
        A_verdict = "?" if pv is None else (pv.leader("A") or pv.verdict("A"))
        p = st.p_ahead
        lead = st.lead
        assert lead is not None  # two recipes ranked
        decided = p is not None and p >= level and lead >= margin and not (flagged and block_flagged)
        out[(a, b)] = EarlyCall(a, b, st.leader, p, flagged, decided, A_verdict, lead)
    return out, notes


@dataclass(frozen=True)
class Score:
    """How the early calls at one fraction fared against the full runs."""

    fraction: float
    pairs: int
    separated: int
    decided: int
    correct: int
    wrong: int  # decided, separated, the other recipe named: a confident wrong call
    decided_ties: int  # decided although the full runs cannot separate the pair
    missed: int  # separated, left undecided

    @property
    def correct_share(self) -> float | None:
        return None if self.decided == 0 else self.correct / self.decided

    def meets(self, share: float = 0.9) -> bool:
        """The issue's bar: decided pairs >= ``share`` correct, no decided tie, no wrong call."""
        ok_share = self.correct_share is None or self.correct_share >= share
        return ok_share and self.wrong == 0 and self.decided_ties == 0


def score(fraction: float, truth: Mapping[tuple[str, str], PairTruth],
          calls: Mapping[tuple[str, str], EarlyCall]) -> Score:
    decided = [k for k, c in calls.items() if c.decided]
    correct = sum(1 for k in decided if truth[k].leader == calls[k].leader)
    wrong = sum(1 for k in decided if truth[k].separated and truth[k].leader != calls[k].leader)
    ties = sum(1 for k in decided if not truth[k].separated)
    missed = sum(1 for k, t in truth.items() if t.separated and not (k in calls and calls[k].decided))
    return Score(fraction, len(truth), sum(t.separated for t in truth.values()), len(decided),
                 correct, wrong, ties, missed)


def _call_text(c: EarlyCall | None) -> str:
    if c is None:
        return "not fitted"
    p = "-" if c.p_ahead is None else f"{c.p_ahead:.2f}"
    state = ("DECIDED" if c.decided else "undecided") + (", flagged" if c.flagged else "")
    return f"{c.leader} p={p} lead {c.lead:+.3f} {state} (A: {c.A_verdict})"


def render(levels: Mapping[str, Sequence[float]], c_end: float, truth: Mapping[tuple[str, str], PairTruth],
           calls: Mapping[float, Mapping[tuple[str, str], EarlyCall]], scores: Sequence[Score]) -> str:
    """The per-recipe levels, the per-pair table and one summary line per fraction."""
    lines = [f"budget C_end {c_end:.4g}; level per seed = mean of the last {TAIL} evaluations at or "
             "below it", ""]
    for name, lv in levels.items():
        lines.append(f"  {name}: " + ", ".join(f"{v:.3f}" for v in lv) + f"  (mean {np.mean(lv):.3f})")
    lines.append("")
    for (a, b), t in truth.items():
        head = (f"{a} vs {b}: full runs {t.diff:+.3f} (Welch p {t.p_value:.3g}) -> "
                + (f"{t.leader} ahead" if t.separated else "not separated"))
        lines.append(head)
        for f, cs in calls.items():
            lines.append(f"    at {f:.0%}: {_call_text(cs.get((a, b)))}")
    lines.append("")
    for s in scores:
        share = "-" if s.correct_share is None else f"{s.correct_share:.0%}"
        bar = "met" if s.meets() else "NOT met"
        lines.append(f"at {s.fraction:.0%}: {s.decided} of {s.pairs} pairs decided, {s.correct} correct "
                     f"({share}), {s.wrong} wrong, {s.decided_ties} decided ties; {s.separated} separated "
                     f"by the full runs, {s.missed} of them undecided; bar {bar}")
    return "\n".join(lines)


def study(curves: Mapping[str, Sequence[Curve]], fractions: Sequence[float], opts: FitOptions,
          alpha: float = ALPHA, level: float = LEVEL, pool: bool = False,
          margin: float = LEAD_MARGIN, block_flagged: bool = True) -> dict[str, object]:
    """Everything the study reports (see the module docstring; ``pool``: the early calls from
    each recipe's pooled fit instead of its seeds' own fits; ``margin``: the smallest predicted
    lead that decides, 0 for P(ahead) alone; ``block_flagged=False``: a flagged fit does not keep
    its pairs undecided)."""
    if len(curves) < 2:
        raise CurveError("the decision study needs at least two recipes")
    for f in fractions:
        if not 0 < f < 1:
            raise CurveError(f"--fractions: each must be in (0, 1), got {f}")
    c_end = budget(curves)
    levels = {n: [level_at(c, c_end) for c in runs] for n, runs in curves.items()}
    truth = truths(levels, alpha)
    calls, notes = {}, []
    for f in fractions:
        calls[f], n = early_calls(curves, f, c_end, opts, level, pool, margin, block_flagged)
        notes.extend(n)
    scores = [score(f, truth, calls[f]) for f in fractions]
    return {"c_end": c_end, "levels": levels, "truth": truth, "calls": calls, "scores": scores,
            "notes": notes, "text": render(levels, c_end, truth, calls, scores)}


__all__ = ["ALPHA", "LEAD_MARGIN", "LEVEL", "TAIL", "CurveError", "EarlyCall", "PairTruth", "Score", "budget",
           "cut", "early_calls", "level_at", "render", "score", "study", "truths", "welch_p"]
