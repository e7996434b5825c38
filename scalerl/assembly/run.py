"""One RL run from a resolved `RunConfig`: the run directory's files, the warm start, the session log.

`train_run(cfg, run_dir)` is what `scalerl train`, `scalerl demo` and every study run (in process or
as a Ray task) execute: it writes `config.yaml` and `start_model.json` (a new run), appends to
`sessions.jsonl` when a session starts and why it stopped, trains through `build.train` under the
signal handlers and the torch thread budget, and returns the exit status (0, 1 for a run that
failed on its own, 128 + the signal for a stopped one). `prepare_model` replaces "no model" by the
cached SFT warm start of the tiny model; `resolve_run_config` layers recipe, config files and
overrides (or a resumed run's saved config).

Its lines (what runs, why it stopped, where to continue) go to the `say` sink the caller gives:
the commands pass `stderr_say` (one line on stderr); a library caller that passes none gets
`log_say`, the `scalerl.assembly.run` logger at INFO, so nothing is printed unless it asks.
Nothing here exits: a failed run is a status, bad input an exception for the command to report.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalerl.assembly.failures import is_input_error
from scalerl.atomic import write_atomic
from scalerl.config import RunConfig, build_config, config_to_yaml, override_layer, yaml_layer
from scalerl.ownership import claim_output_dir
from scalerl.recipes import recipe_path

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SESSIONS_FILE = "sessions.jsonl"
#: the traceback of a run that failed on our side (not bad input)
ERROR_LOG = "error.log"
#: the kind `scalerl train` marks its run directories with (`scalerl.ownership`)
TRAIN_KIND = "train"

Say = Callable[[str], None]
_log = logging.getLogger(__name__)


def stderr_say(message: str) -> None:
    """The commands' sink: one line on stderr, flushed (interleaves with the progress bar)."""
    print(message, file=sys.stderr, flush=True)


def log_say(message: str) -> None:
    """The library default: the line goes to this module's logger at INFO (silent unless the
    application configures logging), never to a stream the caller did not hand over."""
    _log.info("%s", message)


def resolve_run_config(
    recipe: str | None,
    config_files: list[str],
    overrides: list[str],
    resume_dir: Path | None = None,
) -> RunConfig:
    """Recipe, then config files, then overrides; a resumed run starts from its saved config."""
    layers = []
    if resume_dir is not None and (resume_dir / CONFIG_FILE).is_file():
        layers.append(yaml_layer(resume_dir / CONFIG_FILE))
    else:
        layers.append(yaml_layer(recipe_path(recipe or "scalerl")))
    layers.extend(yaml_layer(f) for f in config_files)
    layers.append(override_layer(overrides))
    cfg = build_config(layers)
    if recipe and cfg.recipe is None:
        cfg.recipe = recipe
    elif cfg.recipe is None and resume_dir is None:
        cfg.recipe = "scalerl"
    return cfg


def prepare_model(cfg: RunConfig, say: Say = log_say) -> RunConfig:
    """The embedded default: replace 'no model' by the cached SFT warm start of the tiny model."""
    if cfg.model.name_or_path is not None:
        return cfg
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.training.sft import SFTConfig, progress_printer

    sft = SFTConfig(seed=cfg.model.init_seed)  # one base model for every RL seed
    say(f"warm start: SFT of the tiny model on synthetic reasoning traces ({sft.steps} steps the first "
        "time, then cached)")
    path = warm_start_default(cfg, sft, on_step=progress_printer(sft.steps, prefix="warm start"))
    say(f"warm start: {path}")
    out = cfg.model_copy(deep=True)
    out.model.name_or_path = str(path)
    return out


def default_name(cfg: RunConfig) -> RunConfig:
    """A run not named by the user is named after its output directory (plot and table labels)."""
    if "name" in cfg.model_fields_set:
        return cfg
    out = cfg.model_copy(deep=True)
    out.name = Path(cfg.output_dir).name or cfg.name
    return out


def finished_step(checkpoint: Path, cfg: RunConfig) -> int | None:
    """The checkpoint's step if it already reached `max_steps` (a finished run), else None."""
    from scalerl.training.checkpoint import checkpoint_step

    step = checkpoint_step(checkpoint)
    return step if step is not None and step >= cfg.max_steps else None


def record_session(run_dir: Path, event: dict[str, Any]) -> None:
    """Append one line to `sessions.jsonl` (a session's start, and its stop unless it was killed)."""
    with (run_dir / SESSIONS_FILE).open("a", encoding="utf-8") as f:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(), **event}
        f.write(json.dumps(line) + "\n")
        f.flush()


def _drop_if_empty(run_dir: Path, fresh: bool) -> None:
    """A run that failed before its first logged row leaves no directory behind (it made it)."""
    if fresh and not (run_dir / METRICS_FILE).exists():
        shutil.rmtree(run_dir, ignore_errors=True)


def train_run(cfg: RunConfig, run_dir: Path, *, resume: Path | None = None, device: str | None = None,
              say: Say = log_say, owner: str | None = None, session: dict[str, Any] | None = None) -> int:
    """Train `cfg` in `run_dir` (resuming from the checkpoint `resume`); the exit status.

    `owner`: the kind of command that claims `run_dir` (`scalerl.ownership.claim_output_dir`: it must
    be new, empty or that command's own); None where the caller owns it already (a study's run).
    `session`: more for the session's start record (`config_changes` with `from_step` on a resume
    that changed keys, `parent` for a run started from another run's checkpoint); with either,
    `config.yaml` is rewritten to `cfg`, the config the run goes on with."""
    from scalerl.assembly.run_folder import ensure_run_id
    from scalerl.model_identity import START_MODEL_FILE, model_identity
    from scalerl.pipeline.faults import FaultLimitError
    from scalerl.pipeline.preemption import StopRequest, exit_status, stop_on_signals
    from scalerl.training.checkpoint import CheckpointWriteError, latest_checkpoint
    from scalerl.training.threads import run_threads
    from scalerl.training.trainer import TrainingDivergedError

    fresh = not run_dir.exists()
    if owner is not None:
        claim_output_dir(run_dir, owner, "--output-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    session = dict(session or {})
    new_run = resume is None or "parent" in session
    if new_run or session.get("config_changes"):
        write_atomic(run_dir / CONFIG_FILE, config_to_yaml(cfg))
    if new_run:
        identity = model_identity(cfg.model.name_or_path, cfg.model.tiny.model_dump())
        write_atomic(run_dir / START_MODEL_FILE, json.dumps(identity, indent=2) + "\n")
    session["run_id"] = ensure_run_id(run_dir, session.get("parent"))
    say(f"train: {cfg.name} (recipe {cfg.recipe}, {cfg.pipeline.off_policy} k={cfg.pipeline.k}, "
        f"{cfg.algorithm.loss_type}/{cfg.algorithm.aggregation}/{cfg.algorithm.adv_norm}) -> {run_dir}"
        + (f", resuming from {resume}" if resume else ""))
    started = time.monotonic()
    record_session(run_dir, {"event": "start", "resumed_from": str(resume) if resume else None, **session})
    stop = StopRequest()
    try:
        with stop_on_signals(stop, say=say), run_threads(cfg.model, device) as threads:
            if threads is not None:
                say(f"train: {threads} CPU thread(s) for torch (scalerl/training/threads.py)")
            result = _train_with_rollback(cfg, run_dir, resume, device, stop, say)
    except (CheckpointWriteError, FaultLimitError, TrainingDivergedError) as err:
        # Not bad input: the run itself failed. One clear line, and where to continue from.
        last = latest_checkpoint(run_dir)
        say(f"train: error: {err}" + (f"; --resume continues from {last}" if last else ""))
        record_session(run_dir, {"event": "stop", "stop_reason": type(err).__name__, "exit_status": 1,
                                 "error": str(err), "wall_s": time.monotonic() - started})
        return 1
    except Exception as err:
        if not is_input_error(err):
            # Ours, not the user's (a bug, a library's failure): the traceback goes to the run's
            # error.log and the stop, with its cause, to sessions.jsonl; the command shows the
            # traceback and exits 1. The directory stays, whatever was logged.
            write_atomic(run_dir / ERROR_LOG, "".join(traceback.format_exception(err)))
            record_session(run_dir, {"event": "stop", "stop_reason": "internal_error", "exit_status": 1,
                                     "error": f"{type(err).__name__}: {err}", "error_log": ERROR_LOG,
                                     "wall_s": time.monotonic() - started})
            say(f"train: internal error; traceback in {run_dir / ERROR_LOG}")
            raise
        _drop_if_empty(run_dir, fresh)
        raise
    except BaseException:
        _drop_if_empty(run_dir, fresh)
        raise
    if result.stop_reason == "collapsed":
        say(f"train: collapsed at step {result.steps} and no rollback is left (rollback.max_rollbacks="
            f"{cfg.rollback.max_rollbacks}, or no stable checkpoint); see {run_dir / 'rollback.json'}")
        record_session(run_dir, {"event": "stop", "step": result.steps, "stop_reason": "collapsed",
                                 "trigger": result.rollback.kind if result.rollback else None,
                                 "exit_status": 1, "wall_s": time.monotonic() - started})
        return 1
    status = exit_status(result.signal) if result.stop_reason == "signal" and result.signal else 0
    record_session(run_dir, {"event": "stop", "step": result.steps, "stop_reason": result.stop_reason,
                             "signal": result.signal, "exit_status": status,
                             "wall_s": time.monotonic() - started})
    summary = ", ".join(
        f"{k} {result.last_eval[k]:.3f}" for k in ("val_pass_rate", "val_pass_at_k") if k in result.last_eval
    )
    reason = result.stop_reason if result.signal is None else f"{result.signal}, checkpointed"
    say(f"train: stopped after step {result.steps} ({reason}); max version lag "
        f"{result.max_version_lag}" + (f"; last eval: {summary}" if summary else ""))
    if status:
        say(f"train: continue with `scalerl train --output-dir {run_dir} --resume`")
        return status
    if result.stop_reason == "max_steps" and cfg.max_time_s is not None:
        say(f"train: max_steps={cfg.max_steps} was reached before max_time_s={cfg.max_time_s:g}; raise "
            "--max-steps to train for the whole time")
    say(f"train: fit its curve with `scalerl fit {run_dir} --x flops`")
    return 0


def _train_with_rollback(cfg: RunConfig, run_dir: Path, resume: Path | None, device: str | None,
                         stop: Any, say: Say) -> Any:
    """`build.train`, restarted from the last stable checkpoint each time the collapse detector
    fires (`assembly/rollback.py`); a run without `rollback.enabled` trains once."""
    from scalerl.assembly.build import train
    from scalerl.assembly.rollback import (
        ROLLBACK_FILE,
        RollbackState,
        config_after,
        finish_pending,
        restore_point,
        roll_back,
    )
    from scalerl.training.checkpoint import checkpoint_dir

    if not cfg.rollback.enabled:
        return train(cfg, run_dir, resume=resume, device=device, stop=stop)
    if resume is None:
        state = RollbackState()  # a new run: any record in the directory belonged to the run it replaces
        state.save(run_dir)
    else:
        state = RollbackState.load(run_dir)
        restore = finish_pending(run_dir, state)  # a session killed mid-rollback
        if restore is not None:
            resume = checkpoint_dir(run_dir) / f"step_{restore:06d}"
            say(f"train: finishing the rollback to step {restore} recorded in {run_dir / ROLLBACK_FILE}")
    while True:
        run_cfg = config_after(cfg, state.count)
        result = train(run_cfg, run_dir, resume=resume, device=device, stop=stop, rollbacks=state.history())
        if result.stop_reason != "rollback":
            return result
        trigger = result.rollback
        point = restore_point(run_dir, result.stable_steps)
        if state.count >= cfg.rollback.max_rollbacks or point is None:
            result.stop_reason = "collapsed"
            return result
        target, resume = point
        lr = config_after(cfg, state.count + 1).optim.lr
        event = roll_back(run_dir, state, trigger, target, lr)
        record_session(run_dir, {"event": "rollback", **event})
        say(f"train: collapse at step {trigger.step} ({trigger.detail}); rollback {state.count}/"
            f"{cfg.rollback.max_rollbacks} to the stable checkpoint of step {target}, optim.lr {lr:g}")


__all__ = ["CONFIG_FILE", "ERROR_LOG", "METRICS_FILE", "SESSIONS_FILE", "TRAIN_KIND", "default_name",
           "finished_step",
           "log_say", "prepare_model", "record_session", "resolve_run_config", "stderr_say", "train_run"]
