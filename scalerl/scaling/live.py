"""The live forecast of a training run: the sigmoid refitted on the held-out curve as it grows.

After each evaluation (once ``forecast.min_evals`` evaluations with compute > 0 exist), the run's
eval rows so far are fitted exactly as ``scalerl fit RUN_DIR`` fits them (``io.curve_from_rows``,
``analysis.analyze_curve`` with the default ``FitOptions``: 1000 bootstrap resamples, seed 0, and
the residual error model ``forecast.errors``, default ``local_level``: ``scalerl fit --errors``), in
a background thread, while training goes on. The fit is joined when the next evaluation is
logged (or when the run ends), so the eval row of evaluation ``i`` carries the forecast of the
curve through evaluation ``i - 1`` (``forecast_evals`` points, the last at ``forecast_step``):

    forecast_A, forecast_A_lo, forecast_A_hi   point fit and 95% bootstrap interval of A
    forecast_B, forecast_C_mid                 the other two parameters
    forecast_status                            "ok", "flagged:<why,...>" or "failed:<error>"
    forecast_compute_to_pin                    compute beyond the fitted data to pin A to
                                               +-a_width (compute_needed; 0: pinned, null: > 100x)
    forecast_fit_s, forecast_fit_cpu_s         the fit's wall and CPU time (its thread)
    forecast_wait_s                            how long the training loop waited for it
    forecast_shown                             the steady state a person is shown (``steady_state``
                                               over every fit so far): pinned, open, flagged, failed

What a person reads (the progress line and ``scalerl watch``, both through ``forecast_text``) is
the interval first; the point A only once the shown state is ``pinned`` (an unflagged fit whose
interval is narrower than ``2 * forecast.a_width``, ``fit_state``). The shown state changes only
when a new state has held for ``HOLD`` consecutive fits (``steady_state``), so one noisy fit does
not flip it, and a real change shows ``HOLD - 1`` fits after it first appears.

Joining at the next evaluation makes every logged number a function of the logged rows only
(not of thread timing), and the training loop never waits unless a fit outlasts ``eval.every``
steps. The forecast never feeds back into training; ``--stop-when-known`` only decides when to
stop. At the end the last fit (the whole curve) is written to ``forecast.json`` in the run
folder, which ``scalerl fit RUN_DIR --errors local_level`` reproduces digit for digit.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalerl.config import ForecastConfig
from scalerl.scaling.analysis import FitOptions, RunAnalysis, analyze_curve
from scalerl.scaling.compute_needed import compute_needed
from scalerl.scaling.io import DEFAULT_Y, Curve, curve_from_rows
from scalerl.scaling.validation import CurveError

FORECAST_FILE = "forecast.json"
STATUS_OK = "ok"
PINNED, OPEN, FLAGGED, FAILED = "pinned", "open", "flagged", "failed"
HOLD = 2  # consecutive fits a new state must hold before it is shown


def fit_state(status: str, A_lo: float | None, A_hi: float | None, a_width: float) -> str:
    """One fit's own state: ``failed`` (no fit, or no interval), ``flagged`` (``flagged:...``),
    ``pinned`` (unflagged, ``A_hi - A_lo < 2 a_width``: A known to +-a_width, the width the
    ``compute_to_pin`` advice and ``ablate --prune``'s ``settled`` use) or ``open`` (unflagged,
    wider)."""
    if status.startswith("failed") or A_lo is None or A_hi is None:
        return FAILED
    if status != STATUS_OK:
        return FLAGGED
    return PINNED if A_hi - A_lo < 2.0 * a_width else OPEN


def steady_state(states: Sequence[str], hold: int = HOLD) -> str | None:
    """The state shown after a sequence of fits' states (None before the first fit).

    Rule (hysteresis): the shown state starts as the first fit's; it changes to a state ``s``
    only when the last ``hold`` fits all have state ``s``. So a state that alternates from one
    fit to the next (``open, flagged, open, flagged``) keeps the state it started with, and a
    lasting change is shown ``hold - 1`` fits after its first fit. ``hold = 1``: every fit's
    own state (no hysteresis)."""
    if hold < 1:
        raise ValueError(f"hold must be >= 1, got {hold}")
    shown: str | None = None
    for i, s in enumerate(states):
        held = i + 1 >= hold and all(t == s for t in states[i + 1 - hold: i + 1])
        if shown is None or held:
            shown = s
    return shown


def _fnum(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def row_state(row: Mapping[str, Any], a_width: float) -> str | None:
    """``fit_state`` of the forecast an eval row carries (None: the row carries none)."""
    status = row.get("forecast_status")
    if not isinstance(status, str):
        return None
    return fit_state(status, _fnum(row.get("forecast_A_lo")), _fnum(row.get("forecast_A_hi")), a_width)


def shown_after(rows: Sequence[Mapping[str, Any]], new_state: str, a_width: float,
                hold: int = HOLD) -> str:
    """The shown state once a fit of state ``new_state`` follows the eval rows ``rows``
    (their forecasts' states in order, then the new one: ``steady_state``)."""
    states = [s for r in rows if r.get("kind", "eval") == "eval" and (s := row_state(r, a_width)) is not None]
    shown = steady_state([*states, new_state], hold)
    assert shown is not None  # at least the new state
    return shown


def forecast_text(fields: Mapping[str, Any], a_width: float = 0.02) -> str | None:
    """What a person reads of one forecast (the progress line and ``scalerl watch`` both print
    this): the interval first, the point only when the shown state is ``pinned``.

    ``fields``: an eval row's ``forecast_*`` keys; ``forecast_shown`` is the shown state (a row
    without it, from another reader, shows its own ``fit_state`` under ``a_width``). None: no
    forecast in ``fields``."""
    status = fields.get("forecast_status")
    if not isinstance(status, str):
        return None
    a, lo, hi = (_fnum(fields.get(k)) for k in ("forecast_A", "forecast_A_lo", "forecast_A_hi"))
    shown = fields.get("forecast_shown")
    if shown not in (PINNED, OPEN, FLAGGED, FAILED):
        shown = fit_state(status, lo, hi, a_width)
    if lo is None or hi is None:
        return f"A unknown ({status})"
    interval = f"[{lo:.3f}, {hi:.3f}]"
    if shown == PINNED and a is not None:
        return f"A {a:.3f} {interval} pinned"
    if shown == FLAGGED:
        why = status if status.startswith("flagged:") else "flagged"
        return f"A in {interval}, {why}"
    if shown == FAILED:
        return f"A in {interval}, failed"
    return f"A in {interval}, not pinned"


@dataclass(frozen=True)
class Forecast:
    """One live fit: what the eval row logs (``fields()``) and what the stop rule reads."""

    evals: int  # eval rows with compute > 0 that were fitted
    step: int  # the step of the last fitted evaluation
    x_end: float  # compute of the last fitted evaluation
    A: float | None
    A_lo: float | None
    A_hi: float | None
    B: float | None
    C_mid: float | None
    status: str
    compute_to_pin: float | None
    fit_s: float
    fit_cpu_s: float

    @property
    def width(self) -> float | None:
        """Width ``A_hi - A_lo`` of A's interval (None without one)."""
        if self.A_lo is None or self.A_hi is None:
            return None
        return self.A_hi - self.A_lo

    def known(self, width: float) -> bool:
        """The stop rule of ``--stop-when-known W``: an unflagged fit whose A interval is < W wide."""
        w = self.width
        return self.status == STATUS_OK and w is not None and w < width

    def fields(self) -> dict[str, Any]:
        """The eval row's ``forecast_*`` keys."""
        return {
            "forecast_evals": self.evals, "forecast_step": self.step, "forecast_A": self.A,
            "forecast_A_lo": self.A_lo, "forecast_A_hi": self.A_hi, "forecast_B": self.B,
            "forecast_C_mid": self.C_mid, "forecast_status": self.status,
            "forecast_compute_to_pin": self.compute_to_pin, "forecast_fit_s": self.fit_s,
            "forecast_fit_cpu_s": self.fit_cpu_s,
        }


def flag_reasons(a: RunAnalysis) -> tuple[str, ...]:
    """Short codes for the fit's warnings (the full sentences are what ``scalerl fit`` prints):
    ``before_2x_C_mid`` (data stops before ~2x C_mid: A not identifiable), ``A_at_bound``,
    ``misfit``, ``flat`` (no clear rise), ``few_points`` (4 points for 3 parameters),
    ``truncation`` (the run's truncation flag) and ``other`` for any remaining warning."""
    d = a.fit.diagnostics
    codes = []
    if not d.identifiable:
        codes.append("before_2x_C_mid")
    if d.A_at_bound:
        codes.append("A_at_bound")
    if d.misfit:
        codes.append("misfit")
    if not d.increasing:
        codes.append("flat")
    if any(w.startswith("only ") and "points for" in w for w in d.warnings):
        codes.append("few_points")
    if a.truncation is not None:
        codes.append("truncation")
    if a.warnings and not codes:
        codes.append("other")
    return tuple(codes)


def remaining_to_pin(a: RunAnalysis, half_width: float) -> float | None:
    """Compute beyond the fitted data's end until A's interval is expected to be +-``half_width``
    (``compute_needed``'s median over the plausible curves, minus the fitted end; 0 once pinned;
    None beyond 100x the data or when A was fixed)."""
    advice = compute_needed(a.fit, a.boot, a.profile, half_width=half_width, level=0.95)
    if advice is None or advice.needed is None:
        return None
    return max(advice.needed - advice.fit_end, 0.0)


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def forecast_rows(rows: Sequence[Mapping[str, Any]], cfg: ForecastConfig, label: str = "run",
                  source: str = "metrics.jsonl") -> Forecast | None:
    """The forecast of a run's logged rows (None before ``cfg.min_evals`` evaluations with
    compute > 0). Pure: the same rows give the same numbers."""
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        curve = curve_from_rows(rows, x=cfg.x, y=DEFAULT_Y, label=label, source=source)
    except CurveError:
        return None  # no eval row with the x column yet
    return forecast_curve(curve, cfg, t0, c0)


def forecast_curve(curve: Curve, cfg: ForecastConfig, t0: float | None = None,
                   c0: float | None = None) -> Forecast | None:
    """The forecast of one curve (any reader's: ``scalerl watch`` on other frameworks' logs);
    None before ``cfg.min_evals`` points with x > 0. ``t0``/``c0``: when the work began
    (``perf_counter``, ``thread_time``), for the logged fit time."""
    t0 = time.perf_counter() if t0 is None else t0
    c0 = time.thread_time() if c0 is None else c0
    positive = curve.x > 0
    n = int(positive.sum())
    if n < cfg.min_evals:
        return None
    last = int(curve.x.size - 1)
    step_col = curve.extra.get("step")
    step = int(step_col[last]) if step_col is not None and math.isfinite(step_col[last]) else last
    try:
        a = analyze_curve(curve, FitOptions(a_half_width=cfg.a_width, errors=cfg.errors))
    except CurveError as err:
        return Forecast(n, step, float(curve.x[last]), None, None, None, None, None,
                        f"failed:{err}", None, time.perf_counter() - t0, time.thread_time() - c0)
    lo, hi = a.boot.interval("A") if a.boot is not None else (math.nan, math.nan)
    codes = flag_reasons(a)
    return Forecast(
        evals=n, step=step, x_end=float(curve.x[last]), A=float(a.fit.A), A_lo=_finite(lo), A_hi=_finite(hi),
        B=float(a.fit.B), C_mid=float(a.fit.C_mid),
        status=STATUS_OK if not codes else "flagged:" + ",".join(codes),
        compute_to_pin=remaining_to_pin(a, cfg.a_width),
        fit_s=time.perf_counter() - t0, fit_cpu_s=time.thread_time() - c0,
    )


class LiveForecast:
    """Fits a run's curve in the background after each evaluation (see the module docstring).

    ``before_eval()`` joins the fit in flight and returns the eval row's ``forecast_*`` fields;
    ``after_eval(row)`` records the logged row and starts the next fit; ``latest`` is the last
    joined forecast (what the stop rule reads); ``close()`` joins and writes ``forecast.json``.
    """

    def __init__(self, cfg: ForecastConfig, run_dir: str | Path, label: str,
                 rows: Sequence[Mapping[str, Any]] = ()) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.label = label
        self.rows: list[dict[str, Any]] = [dict(r) for r in rows]
        self.latest: Forecast | None = None
        self.fits = 0
        self.wait_s = 0.0
        self._thread: threading.Thread | None = None
        self._result: Forecast | None = None
        self._error: BaseException | None = None
        evals = [i for i, r in enumerate(self.rows) if r.get("kind") == "eval"]
        if evals:
            # A resumed run: the fit its last evaluation started (on the rows up to that eval row,
            # as the uninterrupted run's was) is redone before its next evaluation.
            self._start(evals[-1] + 1)

    def _work(self, rows: list[dict[str, Any]]) -> None:
        try:
            self._result = forecast_rows(rows, self.cfg, self.label, str(self.run_dir / "metrics.jsonl"))
        except BaseException as err:  # re-raised on the training thread by join(): a bug is ours
            self._error = err

    def _start(self, upto: int | None = None) -> None:
        self._result = None
        snapshot = list(self.rows[:upto])
        self._thread = threading.Thread(target=self._work, args=(snapshot,), name="scalerl-forecast",
                                        daemon=True)
        self._thread.start()

    def join(self) -> Forecast | None:
        """Wait for the fit in flight (if any); the newest forecast."""
        if self._thread is not None:
            t0 = time.perf_counter()
            self._thread.join()
            self.wait_s = time.perf_counter() - t0
            self._thread = None
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            if self._result is not None:
                self.latest = self._result
                self.fits += 1
        return self.latest

    def before_eval(self) -> dict[str, Any]:
        """The fields for the eval row about to be logged: the forecast of the rows before it."""
        self.wait_s = 0.0
        had = self._thread is not None
        forecast = self.join()
        if forecast is None or not had:
            return {}
        state = fit_state(forecast.status, forecast.A_lo, forecast.A_hi, self.cfg.a_width)
        shown = shown_after(self.rows, state, self.cfg.a_width)
        return {**forecast.fields(), "forecast_wait_s": self.wait_s, "forecast_shown": shown}

    def after_row(self, row: Mapping[str, Any]) -> None:
        """Record a logged step row (its truncation rate is part of what ``scalerl fit`` reads)."""
        self.rows.append(dict(row))

    def after_eval(self, row: Mapping[str, Any]) -> None:
        """Record the logged eval row and start fitting the curve through it (a fit still in
        flight is joined first: one fit at a time, each on a fixed set of rows)."""
        self.join()
        self.rows.append(dict(row))
        self._start()

    def close(self) -> Forecast | None:
        """Join the last fit and write ``forecast.json`` (the forecast of the whole curve)."""
        forecast = self.join()
        if forecast is not None:
            from scalerl.atomic import write_atomic

            write_atomic(self.run_dir / FORECAST_FILE, json.dumps(asdict(forecast), indent=2) + "\n")
        return forecast


__all__ = ["FAILED", "FLAGGED", "FORECAST_FILE", "HOLD", "OPEN", "PINNED", "Forecast", "LiveForecast",
           "fit_state", "flag_reasons", "forecast_curve", "forecast_rows", "forecast_text",
           "remaining_to_pin", "row_state", "shown_after", "steady_state"]
