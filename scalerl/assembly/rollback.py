"""Rollback on collapse, the root's half: restore the last stable checkpoint, lower the rate, go on.

The driver stops with `stop_reason` "rollback" when its collapse detector fires
(`scalerl.pipeline.collapse`); `run.train_run` then (at most `rollback.max_rollbacks` times):

1. picks the newest checkpoint on disk whose step the detector judged stable (`restore_point`);
2. records the rollback in `<run_dir>/rollback.json` with the checkpoints to discard (every one
   after the stable step: they hold the diverged trajectory) as `pending`, then deletes them and
   clears `pending` (`roll_back`); a session killed in between finishes the deletion on `--resume`
   (`finish_pending`) and resumes from the stable step, never from a diverged checkpoint;
3. trains again from that checkpoint with `optim.lr` x `rollback.lr_scale` ** rollbacks
   (`config_after`); the resumed metrics log drops the discarded steps' rows, and every later
   step row carries `rollbacks`, `rollback_trigger` and `rollback_steps_lost`.

`rollback.json` is the run's record across sessions: a `--resume` after a SIGKILL reads the count
(so the rate and the remaining budget are right) from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.atomic import write_atomic
from scalerl.config import RunConfig
from scalerl.pipeline.collapse import RollbackHistory, Trigger
from scalerl.training.checkpoint import list_checkpoints, remove_checkpoint

ROLLBACK_FILE = "rollback.json"


@dataclass
class RollbackState:
    """The run's rollbacks (`events`) and a restore still being applied (`pending`)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.events)

    def history(self) -> RollbackHistory:
        return RollbackHistory(rollbacks=self.count,
                               last_trigger=self.events[-1]["trigger"] if self.events else "",
                               steps_lost=sum(int(e["steps_lost"]) for e in self.events))

    @classmethod
    def load(cls, run_dir: Path) -> RollbackState:
        path = run_dir / ROLLBACK_FILE
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(events=list(data.get("events", [])), pending=data.get("pending"))

    def save(self, run_dir: Path) -> None:
        write_atomic(run_dir / ROLLBACK_FILE,
                     json.dumps({"events": self.events, "pending": self.pending}, indent=2) + "\n")


def config_after(cfg: RunConfig, rollbacks: int) -> RunConfig:
    """`cfg` with `optim.lr` x `rollback.lr_scale` ** `rollbacks` (unchanged before any)."""
    if rollbacks == 0:
        return cfg
    out = cfg.model_copy(deep=True)
    out.optim.lr = cfg.optim.lr * cfg.rollback.lr_scale ** rollbacks
    return out


def restore_point(run_dir: Path, stable_steps: list[int]) -> tuple[int, Path] | None:
    """The newest checkpoint on disk whose step is in `stable_steps`, or None."""
    stable = set(stable_steps)
    found = [(step, path) for step, path in list_checkpoints(run_dir) if step in stable]
    return found[-1] if found else None


def finish_pending(run_dir: Path, state: RollbackState) -> int | None:
    """Delete the checkpoints a recorded rollback discards; the step it restores (None if none)."""
    if state.pending is None:
        return None
    discard = {int(s) for s in state.pending["discard"]}
    for step, path in list_checkpoints(run_dir):
        if step in discard:
            remove_checkpoint(path)
    restore = int(state.pending["restore"])
    state.pending = None
    state.save(run_dir)
    return restore


def roll_back(run_dir: Path, state: RollbackState, trigger: Trigger, target: int,
              lr: float) -> dict[str, Any]:
    """Record the rollback from `trigger.step` to the checkpoint of `target` and discard the
    checkpoints after it; returns the event (also appended to `state.events`)."""
    discard = [step for step, _ in list_checkpoints(run_dir) if step > target]
    event = {"trigger": trigger.kind, "detail": trigger.detail, "step": trigger.step, "restored_step": target,
             "steps_lost": trigger.step - target, "lr": lr, "discarded_checkpoints": discard}
    state.events.append(event)
    state.pending = {"restore": target, "discard": discard}
    state.save(run_dir)
    finish_pending(run_dir, state)
    return event
