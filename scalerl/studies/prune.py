"""Prune a study by forecast (`scalerl ablate --prune`): stop variants whose answer is known.

While the study's runs train (one after another, or side by side as Ray tasks), `PruneController`
polls every run folder's `metrics.jsonl` for its newest live forecast (`forecast_A`,
`forecast_A_lo`, `forecast_A_hi`, `forecast_status` on the eval rows: `scalerl.scaling.live`)
and stops a run, by writing `stop_request.json` into its folder, when its unflagged forecast says
either of the two below. A run training in this process is decided at the evaluation whose row
carries the forecast, before it asks whether to stop (`assembly.forecast.observe_evaluations`), so
it stops there; a run elsewhere (a Ray task) is decided by the polling thread and honours the
request after its next step (`stopped_by: pruned` in both):

* `below_leader`: its whole A interval lies below the leader's lower bound by more than the seed
  margin, `A_hi + margin < A_lo(leader)` (the leader: the run whose newest unflagged forecast has
  the highest A; the margin: the paper's +-0.02 from three seeds, ScaleRL A.5), or
* `settled`: its A interval is narrower than `2 * a_width` (A is pinned to +-a_width: more
  compute would not change the answer).

The leader and a settled run need an unflagged fit (data past ~2x C_mid, A off its bounds, no
misfit); the run judged below the leader may be flagged: its own interval says how high it could
go (an early fit's reaches far up and stops nothing), and a collapsed run (flagged `flat`) lies
below the leader whatever its A. `prune_report` tells, per run, when it stopped and why, and
the compute saved against running it to `max_steps` (estimated from its compute per step so far:
one step of a recipe costs about the same compute throughout).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalerl.assembly.forecast import STOP_REQUEST_FILE, observe_evaluations, read_stop_request
from scalerl.atomic import write_json_atomic
from scalerl.scaling.compare import PAPER_SEED_MARGIN_A
from scalerl.scaling.compute_needed import DEFAULT_HALF_WIDTH
from scalerl.scaling.io import read_rows

METRICS_FILE = "metrics.jsonl"
SESSIONS_FILE = "sessions.jsonl"
BELOW_LEADER = "below_leader"
SETTLED = "settled"


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class RunForecast:
    """A run's newest live forecast (from its last eval row that carries one)."""

    name: str
    step: int
    compute: float | None
    A: float
    A_lo: float | None
    A_hi: float | None
    status: str

    @property
    def usable(self) -> bool:
        return self.status == "ok" and self.A_lo is not None and self.A_hi is not None


def latest_forecast(name: str, rows: Sequence[Mapping[str, Any]], x: str,
                    usable: bool = False) -> RunForecast | None:
    """The newest forecast in a run's rows (`usable`: the newest unflagged one; None: none yet)."""
    for row in reversed(rows):
        a = _num(row.get("forecast_A"))
        if row.get("kind") == "eval" and a is not None:
            f = RunForecast(name, int(row.get("step", 0)), _num(row.get(x)), a,
                            _num(row.get("forecast_A_lo")), _num(row.get("forecast_A_hi")),
                            str(row.get("forecast_status", "")))
            if f.usable or not usable:
                return f
    return None


def leader_of(forecasts: Sequence[RunForecast]) -> RunForecast | None:
    """The run with the highest A among the usable (unflagged) forecasts."""
    usable = [f for f in forecasts if f.usable]
    return max(usable, key=lambda f: f.A) if usable else None


def prune_reason(f: RunForecast, leader: RunForecast | None, margin: float, a_width: float) -> str | None:
    """Why `f` may stop now (`settled` first, then `below_leader`), or None. See the module docstring:
    `A_hi - A_lo < 2 a_width`; `A_hi + margin < A_lo(leader)`."""
    if f.A_lo is None or f.A_hi is None or f.status.startswith("failed"):
        return None
    if f.usable and f.A_hi - f.A_lo < 2.0 * a_width:
        return SETTLED
    # The leader's bound must be trustworthy (unflagged); the run's own interval may come from a
    # flagged fit: a fit that cannot locate A has an interval reaching far up (it is not stopped),
    # while a collapsed run (flagged flat) sits below the leader whatever A is.
    if (leader is not None and leader.name != f.name and leader.A_lo is not None
            and f.A_hi + margin < leader.A_lo):
        return BELOW_LEADER
    return None


@dataclass(frozen=True)
class PrunedRun:
    """One stop request: which run, on which forecast, why, against which leader."""

    run: str
    reason: str
    step: int
    compute: float | None
    A: float
    A_lo: float | None
    A_hi: float | None
    leader: str | None
    leader_lo: float | None
    margin: float


class PruneController:
    """Polls the runs' forecasts and writes their stop requests (see the module docstring).

    `runs` maps a run's name to its folder. `poll()` is one pass (what the background thread
    repeats every `interval_s` seconds until `stop()`)."""

    def __init__(self, runs: Mapping[str, Path], *, x: str = "compute_device_hours",
                 margin: float = PAPER_SEED_MARGIN_A, a_width: float = DEFAULT_HALF_WIDTH,
                 interval_s: float = 2.0) -> None:
        if not margin >= 0:
            raise ValueError(f"prune margin must be >= 0, got {margin}")
        if not 0 < a_width < 1:
            raise ValueError(f"prune a_width must be in (0, 1), got {a_width}")
        self.runs = {name: Path(d) for name, d in runs.items()}
        self.x, self.margin, self.a_width, self.interval_s = x, margin, a_width, interval_s
        self.pruned: dict[str, PrunedRun] = {}
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the polling thread and the runs' own threads both poll
        self._unobserve: Callable[[], None] | None = None

    def poll(self) -> list[PrunedRun]:
        """Read every run's newest forecast; request the stop of those that may stop. The new requests."""
        with self._lock:
            return self._poll()

    def _observe(self, run_dir: Path) -> None:
        """A run of this process is about to ask whether to stop after an evaluation: decide now."""
        if Path(run_dir) in self.runs.values():
            self.poll()

    def _poll(self) -> list[PrunedRun]:
        rows = {name: read_rows(d / METRICS_FILE) for name, d in self.runs.items()}
        forecasts = [f for name, r in rows.items() if (f := latest_forecast(name, r, self.x)) is not None]
        # Each run's newest unflagged forecast competes for the lead: a last evaluation whose fit
        # is flagged (a misfit after a jump) does not withdraw the bound the run had established.
        leader = leader_of([f for name, r in rows.items()
                            if (f := latest_forecast(name, r, self.x, usable=True)) is not None])
        new = []
        for f in forecasts:
            if f.name in self.pruned or _finished(self.runs[f.name]):
                continue
            reason = prune_reason(f, leader, self.margin, self.a_width)
            if reason is None:
                continue
            decision = PrunedRun(f.name, reason, f.step, f.compute, f.A, f.A_lo, f.A_hi,
                                 None if leader is None else leader.name,
                                 None if leader is None else leader.A_lo, self.margin)
            if read_stop_request(self.runs[f.name]) is None:
                write_json_atomic(self.runs[f.name] / STOP_REQUEST_FILE, asdict(decision))
            self.pruned[f.name] = decision
            new.append(decision)
        return new

    def _loop(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.poll()

    def start(self) -> PruneController:
        # Runs in this process are decided at their evaluation (`assembly.forecast`); runs elsewhere
        # (Ray tasks) by the polling thread, within `interval_s` of their row.
        self._unobserve = observe_evaluations(self._observe)
        self._thread = threading.Thread(target=self._loop, name="scalerl-prune", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._unobserve is not None:
            self._unobserve()
            self._unobserve = None
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _finished(run_dir: Path) -> bool:
    """The run's last session has stopped (a stop request now would only stop its resumption)."""
    rows = read_rows(run_dir / SESSIONS_FILE)
    return bool(rows) and rows[-1].get("event") == "stop"


def run_usage(run_dir: Path, x: str, max_steps: int) -> dict[str, Any]:
    """What a run used, how it stopped, and its compute if it had run to `max_steps`
    (`compute * max_steps / steps`: the compute per step so far, extended)."""
    rows = read_rows(run_dir / METRICS_FILE)
    steps = [r for r in rows if r.get("kind") == "step"]
    last = steps[-1] if steps else {}
    step = int(last.get("step", 0))
    used = _num(last.get(x))
    sessions = read_rows(run_dir / SESSIONS_FILE)
    stops = [s for s in sessions if s.get("event") == "stop"]
    stopped_by = stops[-1].get("stop_reason") if stops else None
    full = used * max_steps / step if used is not None and step > 0 else None
    return {"step": step, "max_steps": max_steps, "stopped_by": stopped_by, "compute": used,
            "compute_full": full, "saved": None if full is None or used is None else full - used}


def prune_report(controller: PruneController, max_steps: Mapping[str, int]) -> dict[str, Any]:
    """Per run: when it stopped and why (its stop request, its session's stop), the compute used
    and saved; and the study's totals (`saved_fraction` of the compute of running all to the end)."""
    runs = []
    for name, d in controller.runs.items():
        usage = run_usage(d, controller.x, max_steps[name])
        request = controller.pruned.get(name)
        runs.append({"run": name, **usage, "request": None if request is None else asdict(request)})
    full = [r["compute_full"] for r in runs]
    used = [r["compute"] for r in runs]
    total_full = sum(full) if all(v is not None for v in full) else None
    total_used = sum(used) if all(v is not None for v in used) else None
    saved = None if total_full is None or total_used is None else total_full - total_used
    return {"x": controller.x, "margin": controller.margin, "a_width": controller.a_width, "runs": runs,
            "compute_used": total_used, "compute_full": total_full, "compute_saved": saved,
            "saved_fraction": None if saved is None or not total_full else saved / total_full,
            "n_pruned": sum(1 for r in runs if r["stopped_by"] == "pruned")}


def prune_text(report: Mapping[str, Any]) -> str:
    """The report's lines: one per run, then the total saved."""
    lines = [f"pruning by forecast (margin {report['margin']:g} on A, settled at +-{report['a_width']:g}):"]
    for r in report["runs"]:
        req = r["request"]
        why = "" if req is None else (
            f" ({req['reason']}: A {req['A']:.3f} [{req['A_lo']:.3f}, {req['A_hi']:.3f}]"
            + (f", leader {req['leader']} lo {req['leader_lo']:.3f}"
               if req["reason"] == BELOW_LEADER else "")
            + f", forecast at step {req['step']})")
        comp = "" if r["compute"] is None else f", {report['x']} {r['compute']:.4g}"
        saved = "" if not r["saved"] else f", saved {r['saved']:.4g}"
        lines.append(f"  {r['run']}: stopped at step {r['step']}/{r['max_steps']} by {r['stopped_by']}"
                     f"{comp}{saved}{why}")
    if report["compute_saved"] is not None:
        lines.append(f"  compute saved: {report['compute_saved']:.4g} of {report['compute_full']:.4g} "
                     f"({report['saved_fraction']:.1%}) against running every run to max_steps")
    return "\n".join(lines)


__all__ = ["BELOW_LEADER", "SETTLED", "PruneController", "PrunedRun", "RunForecast", "latest_forecast",
           "leader_of", "prune_reason", "prune_report", "prune_text", "read_rows", "run_usage"]
