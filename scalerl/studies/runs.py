"""Running the runs of a study: one after another, in process, resumable, failures contained.

A study (`scalerl ablate`, the predictive-accuracy study) is a list of `RunSpec`s, each a fully
resolved `RunConfig` whose `output_dir` is the run's directory inside the study directory.
`execute_runs` trains them in order with `scalerl.assembly.run.train_run` (what `scalerl train`
runs) and records the outcome of each in `<run_dir>/study_status.json`:

* a run whose status file says `completed` is skipped (a rerun of the study resumes it);
* a run directory that holds a `metrics.jsonl` but did not complete (killed, or failed) is resumed
  from its latest checkpoint when it has one (`checkpoint.every > 0`), through the same machinery
  as `scalerl train --resume`; without a checkpoint it is rerun from scratch, its directory
  cleared first, so its curve never mixes two attempts;
* a run that raises is reported (traceback on stderr, message in its status file and the study
  summary), counted as failed, and the study moves on to the next run.

Before anything runs, every existing run directory's `config.yaml` is compared with the config the
study would give it now: a study directory reused with different settings is an error naming the
run and the first differing keys, never a silent mix of old and new runs.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalerl.atomic import write_atomic, write_json_atomic
from scalerl.config import ConfigError, RunConfig, build_config, yaml_layer
from scalerl.inputs import InputError

logger = logging.getLogger(__name__)

STATUS_FILE = "study_status.json"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"

RunState = Literal["new", "completed", "partial"]
TrainFn = Callable[..., int]


@dataclass(frozen=True)
class RunSpec:
    """One run of a study. `group` is what its seeds share (the variant or recipe it measures)."""

    name: str
    group: str
    config: RunConfig
    description: str = ""
    seed_index: int = 0

    @property
    def run_dir(self) -> Path:
        return Path(self.config.output_dir)


@dataclass(frozen=True)
class RunOutcome:
    """What happened to one run in this invocation of the study."""

    name: str
    group: str
    run_dir: Path
    status: Literal["completed", "failed"]
    action: Literal["skipped", "trained", "resumed", "rerun"]
    seconds: float
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "run_dir": str(self.run_dir),
            "status": self.status,
            "action": self.action,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


# ---------------------------------------------------------------------------------------------
# Files



def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's study status record, or None when there is none (or it is unreadable)."""
    path = run_dir / STATUS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def run_state(run_dir: Path) -> RunState:
    """`completed` (its status file says so), `partial` (a log exists, it did not complete), `new`."""
    status = read_status(run_dir)
    if status is not None and status.get("status") == "completed" and (run_dir / METRICS_FILE).is_file():
        return "completed"
    if (run_dir / METRICS_FILE).exists():
        return "partial"
    return "new"


# ---------------------------------------------------------------------------------------------
# Consistency of a reused study directory


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(saved: RunConfig, planned: RunConfig, limit: int = 3) -> list[str]:
    """`key (saved X, planned Y)` for the first `limit` settings that differ."""
    a, b = _flatten(saved.model_dump(mode="json")), _flatten(planned.model_dump(mode="json"))
    diffs = [f"{k} (saved {a.get(k)!r}, planned {b.get(k)!r})" for k in sorted(set(a) | set(b))
             if a.get(k) != b.get(k)]
    return diffs[:limit] + ([f"... {len(diffs) - limit} more"] if len(diffs) > limit else [])


def check_reusable(specs: Sequence[RunSpec]) -> None:
    """`ValueError` naming every existing run directory whose saved config is not the planned one.

    The saved `config.yaml` is validated as a `RunConfig` before comparing, so settings added to
    the config tree since it was written take their defaults on both sides.
    """
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"study: run name {dupes[0]!r} occurs twice (run names are directory names)")
    problems = []
    for spec in specs:
        path = spec.run_dir / CONFIG_FILE
        if run_state(spec.run_dir) == "new" or not path.is_file():
            continue
        try:
            saved = build_config([yaml_layer(path)])
        except ConfigError as err:
            problems.append(f"{path}: not a valid run config: {err}")
            continue
        diffs = config_differences(saved, spec.config)
        if diffs:
            problems.append(f"{spec.run_dir}: its {CONFIG_FILE} differs from this study's plan at "
                            + "; ".join(diffs))
    if problems:
        raise InputError(
            "study directory holds runs made with other settings (use another --output-dir, or "
            "remove those run directories to redo them):\n  " + "\n  ".join(problems)
        )


# ---------------------------------------------------------------------------------------------
# Running


def _finished_before(run_dir: Path, checkpoint: Path, max_steps: int) -> bool:
    """The checkpoint is at `max_steps` and the log already holds the evaluation of that step."""
    from scalerl.telemetry import read_rows

    step = int(checkpoint.name.rsplit("_", 1)[-1])
    if step < max_steps:
        return False
    return any(int(r.get("step", -1)) == step for r in read_rows(run_dir / METRICS_FILE, "eval"))


def _default_train(cfg: RunConfig, run_dir: Path, *, resume: Path | None = None,
                   device: str | None = None, say: Callable[[str], None]) -> int:
    from scalerl.assembly.run import train_run
    from scalerl.pipeline.preemption import STOP_SIGNALS, exit_status

    code = train_run(cfg, run_dir, resume=resume, device=device, say=say)
    if code in {exit_status(sig.name) for sig in STOP_SIGNALS}:
        # SIGINT / SIGTERM stopped the run at a checkpoint: the study stops too (resumed next time).
        raise KeyboardInterrupt
    return code


def execute_runs(
    specs: Sequence[RunSpec],
    *,
    device: str | None = None,
    train_fn: TrainFn | None = None,
    say: Callable[[str], None] = logger.info,
    parallel: int = 1,
) -> list[RunOutcome]:
    """Train every run (see the module docstring); returns one outcome per run, in `specs` order.

    `train_fn(cfg, run_dir, resume=..., device=...) -> int` defaults to `scalerl train`'s
    `train_run`; a non-zero return counts as a failure. `KeyboardInterrupt` stops the study (the
    interrupted run is resumed or rerun next time). `parallel` > 1 calls `train_fn` for that many
    runs at once, from threads: for a `train_fn` that runs each on a cluster
    (`scalerl.studies.ray_runs`), whose scheduler queues what does not fit.
    """
    train = train_fn or functools.partial(_default_train, say=say)
    check_reusable(specs)
    if parallel < 1:
        raise InputError(f"parallel: must be >= 1, got {parallel}")
    jobs = [(i, spec) for i, spec in enumerate(specs, start=1)]
    if parallel == 1:
        return [_execute_one(spec, f"[{i}/{len(specs)}] {spec.name}", train, device, say) for i, spec in jobs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="scalerl-study") as executor:
        futures = [executor.submit(_execute_one, spec, f"[{i}/{len(specs)}] {spec.name}", train, device, say)
                   for i, spec in jobs]
        return [f.result() for f in futures]


def _execute_one(
    spec: RunSpec, head: str, train: TrainFn, device: str | None, say: Callable[[str], None]
) -> RunOutcome:
    from scalerl.training.checkpoint import latest_valid_checkpoint

    run_dir = spec.run_dir
    state = run_state(run_dir)
    if state == "completed":
        say(f"{head}: already completed in {run_dir}, skipped")
        return RunOutcome(spec.name, spec.group, run_dir, "completed", "skipped", 0.0)
    resume = None
    if state == "partial":
        resume = latest_valid_checkpoint(run_dir, warn=lambda m: say(f"{head}: warning: {m}"))
    if resume is not None and _finished_before(run_dir, resume, spec.config.max_steps):
        # Killed after its last checkpoint and evaluation, before the status file: nothing is
        # left to train (resuming would only log a second evaluation of the same step).
        write_json_atomic(run_dir / STATUS_FILE, {"status": "completed", "action": "recovered",
                                                   "seconds": 0.0, "error": None})
        say(f"{head}: had finished (last checkpoint {resume.name}), marked completed")
        return RunOutcome(spec.name, spec.group, run_dir, "completed", "skipped", 0.0)
    if state == "partial" and resume is None:
        # No checkpoint to continue from: start over, so the curve is one attempt's.
        shutil.rmtree(run_dir)
    action: Literal["trained", "resumed", "rerun"] = (
        "resumed" if resume is not None else "rerun" if state == "partial" else "trained"
    )
    say(f"{head}: {spec.description or spec.group}"
        + (f" (resuming from {resume})" if resume is not None else " (rerun from scratch)"
           if action == "rerun" else ""))
    start = time.perf_counter()
    error = None
    try:
        code = train(spec.config, run_dir, resume=resume, device=device)
        if code:
            error = f"training exited with status {code}"
    except Exception as err:  # one broken run must not end the study; it is reported below
        error = f"{type(err).__name__}: {err}"
        say(traceback.format_exc().rstrip())  # where the run broke, through the caller's sink
    seconds = time.perf_counter() - start
    status: Literal["completed", "failed"] = "failed" if error else "completed"
    record = {"status": status, "action": action, "seconds": round(seconds, 3), "error": error,
              "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / STATUS_FILE, record)
    say(f"{head}: {status} in {seconds:.0f} s" + (f": {error}" if error else ""))
    return RunOutcome(spec.name, spec.group, run_dir, status, action, seconds, error)


__all__ = [
    "STATUS_FILE",
    "RunOutcome",
    "RunSpec",
    "check_reusable",
    "config_differences",
    "execute_runs",
    "read_status",
    "run_state",
    "write_atomic",
    "write_json_atomic",
]
