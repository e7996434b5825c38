"""One run, fitted and assessed end to end: the unit that ``scalerl fit`` and ``scalerl compare`` report.

``analyze_curve`` ties the pieces together for a curve read from disk: fit window (compute, step,
epoch), optional record-breaking downsampling, sigmoid fit, bootstrap, profile interval for A,
held-out error of the extrapolation, predictions, optionally the A.4 power law, and the run's
instability flag (training truncation rate past `truncation_threshold`, ScaleRL A.15).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scalerl.scaling.compare import extrapolation_caveat
from scalerl.scaling.compute_needed import DEFAULT_HALF_WIDTH, ComputeAdvice, compute_needed
from scalerl.scaling.diagnostics import TRUNCATION_THRESHOLD, TruncationFlag, truncation_flag
from scalerl.scaling.downsample import record_breaking
from scalerl.scaling.io import Curve, window_mask
from scalerl.scaling.power_law import PowerLawFit, fit_power_law
from scalerl.scaling.sigmoid import Method, SigmoidFit, fit_sigmoid
from scalerl.scaling.uncertainty import Bootstrap, ErrorModel, ProfileInterval, bootstrap, profile_A
from scalerl.scaling.validation import CurveError


@dataclass(frozen=True)
class FitOptions:
    """Everything that shapes a fit, as the CLI exposes it."""

    min_x: float | None = None
    max_x: float | None = None
    min_step: float | None = None
    max_step: float | None = None
    min_epoch: float | None = None
    max_epoch: float | None = None
    r0: float | None = None
    method: Method = "fast"
    a_max: float | None = None
    n_boot: int = 1000
    block: int = 1
    # Residual error model of the bootstrap (`uncertainty.bootstrap`): "local_level" for curves that wander.
    errors: ErrorModel = "iid"
    seed: int = 0
    level: float = 0.95
    downsample_bins: int | None = None
    predict_at: tuple[float, ...] = ()
    power_law: bool = False
    # Fit only x <= this fraction of each run's last x (e.g. 0.5: the first half, the rest held out).
    max_x_fraction: float | None = None
    # Flag runs whose training truncation rate passed this (ScaleRL's instability warning).
    truncation_threshold: float = TRUNCATION_THRESHOLD
    # Target half-width on A for the compute-needed advice (the paper's +-0.02 seed margin).
    a_half_width: float = DEFAULT_HALF_WIDTH

    def __post_init__(self) -> None:
        f = self.max_x_fraction
        if f is not None and not 0 < f <= 1:
            raise CurveError(f"--fit-fraction must be in (0, 1], got {f}")
        if not 0 < self.truncation_threshold <= 1:
            raise CurveError(f"--truncation-threshold must be in (0, 1], got {self.truncation_threshold}")
        if not 0 < self.a_half_width < 1:
            raise CurveError(
                f"--a-width (the target half-width on A) must be in (0, 1), got {self.a_half_width}"
            )

    def window_end(self, curve: Curve) -> float | None:
        """The largest x this curve's fit may use (``max_x`` and ``max_x_fraction`` together)."""
        ends = [e for e in (self.max_x,) if e is not None]
        if self.max_x_fraction is not None and curve.x.size:
            ends.append(self.max_x_fraction * float(curve.x[-1]))
        return min(ends) if ends else None


@dataclass(frozen=True)
class Prediction:
    """Predicted reward at one compute, with confidence (curve) and observation bands."""

    compute: float
    reward: float
    lo: float | None = None
    hi: float | None = None
    obs_lo: float | None = None
    obs_hi: float | None = None
    caveat: str | None = None  # set when the compute is far beyond the fitted data


@dataclass(frozen=True)
class HeldOut:
    """Error of the fitted curve on the points after the fit window (the extrapolation test)."""

    n: int
    mae: float
    max_abs: float
    coverage: float | None  # fraction inside the observation band


@dataclass(frozen=True, eq=False)
class RunAnalysis:
    curve: Curve
    fit: SigmoidFit
    boot: Bootstrap | None
    profile: ProfileInterval | None
    predictions: tuple[Prediction, ...]
    held_out: HeldOut | None
    power_law: PowerLawFit | None
    truncation: TruncationFlag | None = None
    # How much further the run must go to pin A (only for fits that do not pin it: see needs_advice).
    advice: ComputeAdvice | None = None

    @property
    def warnings(self) -> tuple[str, ...]:
        """The fit's diagnostics, then the run's own (its truncation flag)."""
        extra = () if self.truncation is None else (self.truncation.message(),)
        return (*self.fit.diagnostics.warnings, *extra)

    @property
    def reliable(self) -> bool:
        return not self.warnings


def include_mask(curve: Curve, opts: FitOptions) -> np.ndarray | None:
    """Step/epoch windows and downsampling as one boolean mask (None when nothing restricts)."""
    mask = np.ones(curve.x.size, dtype=bool)
    restricted = False
    for column, lo, hi in (("step", opts.min_step, opts.max_step), ("epoch", opts.min_epoch, opts.max_epoch)):
        if lo is not None or hi is not None:
            mask &= window_mask(curve, column, lo, hi)
            restricted = True
    if opts.downsample_bins:
        keep = np.zeros_like(mask)
        keep[record_breaking(curve.x, curve.y, n_bins=opts.downsample_bins)] = True
        mask &= keep
        restricted = True
    return mask if restricted else None


def _predict(fit: SigmoidFit, boot: Bootstrap | None, at: Sequence[float]) -> tuple[Prediction, ...]:
    if not at:
        return ()
    c = np.asarray(at, dtype=np.float64)
    if np.any(~np.isfinite(c)) or np.any(c < 0):
        raise CurveError("--predict-at values must be finite and >= 0")
    pred = fit.predict(c)
    caveats = [extrapolation_caveat("prediction", fit, float(x)) for x in c]
    if boot is None:
        return tuple(Prediction(float(x), float(p), caveat=w)
                     for x, p, w in zip(c, pred, caveats, strict=True))
    lo, hi = boot.band(c)
    olo, ohi = boot.band(c, observation=True)
    return tuple(
        Prediction(float(c[i]), float(pred[i]), float(lo[i]), float(hi[i]), float(olo[i]), float(ohi[i]),
                   caveats[i])
        for i in range(c.size)
    )


def _held_out(fit: SigmoidFit, boot: Bootstrap | None) -> HeldOut | None:
    """Points beyond the window's end: what an extrapolation would have had to predict."""
    after = ~fit.in_fit & (fit.compute > fit.fit_compute.max())
    if not after.any():
        return None
    c, r = fit.compute[after], fit.reward[after]
    err = np.abs(fit.predict(c) - r)
    coverage = None
    if boot is not None:
        lo, hi = boot.band(c, observation=True)
        coverage = float(np.mean((r >= lo) & (r <= hi)))
    return HeldOut(n=int(after.sum()), mae=float(err.mean()), max_abs=float(err.max()), coverage=coverage)


def needs_advice(fit: SigmoidFit, profile: ProfileInterval | None) -> bool:
    """A rising, sigmoid-shaped fit whose A is not determined: data before ~2x C_mid, A on a bound,
    or A's profile interval open on a side. (A flat curve or a misfit has no A to pin: more of
    the same compute would not help, and its warnings say so.)"""
    d = fit.diagnostics
    is_open = profile is not None and (profile.lo_open or profile.hi_open)
    unpinned = not d.identifiable or d.A_at_bound or is_open
    return not fit.A_fixed and d.increasing and not d.misfit and unpinned


def analyze_curve(curve: Curve, opts: FitOptions) -> RunAnalysis:
    """Fit and assess one curve; a ``ValueError`` is re-raised with the run's label and source."""
    max_x = opts.window_end(curve)
    try:
        fit = fit_sigmoid(
            curve.x,
            curve.y,
            r0=opts.r0,
            min_compute=opts.min_x,
            max_compute=max_x,
            method=opts.method,
            include=include_mask(curve, opts),
            a_max=opts.a_max,
        )
        boot = (
            bootstrap(fit, n_boot=opts.n_boot, seed=opts.seed, block=opts.block, level=opts.level,
                      errors=opts.errors)
            if opts.n_boot > 0
            else None
        )
        profile = profile_A(fit, level=opts.level) if opts.n_boot > 0 else None
        power = None
        if opts.power_law:
            # Same cap on A as the sigmoid got (1 for pass rates unless --a-max says otherwise).
            power = fit_power_law(
                curve.x,
                curve.y,
                a_max=fit.bounds[0][1],
                min_compute=opts.min_x,
                max_compute=max_x,
                include=include_mask(curve, opts),
            )
        predictions = _predict(fit, boot, opts.predict_at)
        advice = (compute_needed(fit, boot, profile, half_width=opts.a_half_width, level=opts.level)
                  if needs_advice(fit, profile) else None)
    except CurveError as err:  # the curve's own fault (too few points, an empty window): bad input
        raise CurveError(f"{curve.label} ({curve.source}): {err}") from None
    return RunAnalysis(
        curve=curve,
        fit=fit,
        boot=boot,
        profile=profile,
        predictions=predictions,
        held_out=_held_out(fit, boot),
        power_law=power,
        truncation=None if curve.truncation is None else truncation_flag(
            curve.truncation.steps, curve.truncation.rates, opts.truncation_threshold),
        advice=advice,
    )
