"""The live forecast and the stop requests, wired into a run (`build._build_training`).

`ForecastingSink` sits on the run's metrics sink: every logged row is recorded for the live fit
(`scalerl.scaling.live.LiveForecast`), each eval row gets the `forecast_*` fields of the fit
joined just before it, and a new fit starts once it is written. `StopAfterEval` is the driver's
`stop_after_eval` hook: `forecast_known` when `forecast.stop_when_known` is set and the newest
forecast pins A that tightly (unflagged), `pruned` when a study wrote `stop_request.json` into
the run folder (`scalerl.studies.prune`); `stop_requested` is the `stop_after_step` hook that
honours that request between evaluations too. The driver never imports the scaling package: this
root hands it the hook.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scalerl.config import ForecastConfig
from scalerl.scaling.live import LiveForecast

#: written by a study's controller into a run folder: the run stops after its next step
STOP_REQUEST_FILE = "stop_request.json"
FORECAST_KNOWN = "forecast_known"
PRUNED = "pruned"


class ForecastingSink:
    """A metrics sink that adds the live forecast to eval rows (see the module docstring)."""

    def __init__(self, sink: Any, live: LiveForecast) -> None:
        self.sink = sink
        self.live = live

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> Any:
        row = self.sink.log_step(step, metrics)
        self.live.after_row(row)
        return row

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> Any:
        fields = self.live.before_eval()
        row = self.sink.log_eval(step, {**metrics, **fields})
        self.live.after_eval(row)
        return row

    def log_samples(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        self.sink.log_samples(step, rows)


#: Observers of this process's runs, called with a run's folder just before the run asks whether
#: to stop after an evaluation (`StopAfterEval`). A study whose runs train in this process registers
#: its prune controller here (`scalerl.studies.prune`), so the decision on the row just logged is
#: taken before the run goes on: the run stops at that evaluation, whatever the controller's
#: polling interval and however fast the run's steps are.
_EVAL_OBSERVERS: list[Callable[[Path], None]] = []
_OBSERVERS_LOCK = threading.Lock()


def observe_evaluations(observer: Callable[[Path], None]) -> Callable[[], None]:
    """Register `observer` (see `_EVAL_OBSERVERS`); returns the function that unregisters it."""
    with _OBSERVERS_LOCK:
        _EVAL_OBSERVERS.append(observer)

    def remove() -> None:
        with _OBSERVERS_LOCK:
            if observer in _EVAL_OBSERVERS:
                _EVAL_OBSERVERS.remove(observer)

    return remove


def read_stop_request(run_dir: Path) -> dict[str, Any] | None:
    """The stop request in `run_dir` (its JSON object; `{}` when unreadable: a request all the
    same, half-written by its controller), or None."""
    path = run_dir / STOP_REQUEST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stop_requested(run_dir: Path) -> Callable[[int], str | None]:
    """The driver's `stop_after_step` hook: `pruned` once a study wrote its stop request (one stat
    per step), so a pruned run does not train on to its next evaluation."""

    def hook(step: int) -> str | None:
        return PRUNED if read_stop_request(run_dir) is not None else None

    return hook


class StopAfterEval:
    """The driver's `stop_after_eval` hook (see the module docstring)."""

    def __init__(self, cfg: ForecastConfig, run_dir: Path, live: LiveForecast | None) -> None:
        self.stop_when_known = cfg.stop_when_known
        self.run_dir = run_dir
        self.live = live

    def __call__(self, step: int) -> str | None:
        with _OBSERVERS_LOCK:
            observers = list(_EVAL_OBSERVERS)
        for observer in observers:
            observer(self.run_dir)
        if read_stop_request(self.run_dir) is not None:
            return PRUNED
        if self.live is not None and self.stop_when_known is not None:
            latest = self.live.latest
            if latest is not None and latest.known(self.stop_when_known):
                return FORECAST_KNOWN
        return None


__all__ = ["FORECAST_KNOWN", "PRUNED", "STOP_REQUEST_FILE", "ForecastingSink", "StopAfterEval",
           "observe_evaluations", "read_stop_request", "stop_requested"]
