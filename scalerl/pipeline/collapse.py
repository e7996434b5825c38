"""The collapse detector: when a run has diverged and which of its checkpoints were stable.

ScaleRL (A.17.4) restarts a run that collapsed from a stable checkpoint. `CollapseDetector` reads
the run's own rows and fires on the first of these signals (each off when its key is null):

* held-out pass rate below the best seen by more than its noise band. `val_pass_rate` is mean@k
  over P held-out prompts: the mean of P*k Bernoulli draws whose variance, over a fixed prompt
  set, is at most b(1 - b) / (P k) at pass rate b. The difference of two such evaluations has
  standard error at most sigma = sqrt(2 b (1 - b) / (P k)), taken at the best pass rate b, and the
  detector fires when  b - v > z * sigma  (z = `rollback.pass_drop_se`). A best of 0 cannot drop;
  a best of 1 has sigma 0, so any drop fires.
* `rollback.nonfinite_steps` step rows in a row whose update was skipped as non-finite
  (`skipped_nonfinite`, the trainer's guard; it stops the run at
  `optim.max_consecutive_bad_steps`, so the detector's count is the smaller one).
* a step's `truncation_rate` above `rollback.truncation_rate`, or its `entropy` above
  `rollback.entropy_max` (an excursion: the model babbles to the length limit or its
  distribution flattens).

A checkpoint is stable when the detector has seen no trouble at its step: no non-finite step in the
current run of steps, the last evaluation inside the noise band, no excursion in the last row.
The detector's state (best pass rate, the stable steps) is saved in each checkpoint with the
pipeline state, so a restored run judges from the state it had at that step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scalerl.config import RollbackConfig


def pass_rate_band(best: float, prompts: int, k: int, z: float) -> float:
    """z * sqrt(2 b (1 - b) / (P k)): the largest drop from the best held-out mean@k that noise
    explains (two evaluations of P prompts x k samples, each a mean of Bernoulli draws)."""
    if prompts < 1 or k < 1:
        raise ValueError(f"pass_rate_band: prompts={prompts}, k={k} (both must be >= 1)")
    return z * math.sqrt(2.0 * best * (1.0 - best) / (prompts * k))


@dataclass(frozen=True)
class Trigger:
    """Why the detector fired: `kind` (pass_rate, nonfinite, truncation, entropy), at `step`."""

    kind: str
    step: int
    detail: str


@dataclass
class RollbackHistory:
    """The run's rollbacks so far (kept by the composition root across restarts): stamped on every
    step row as `rollbacks`, `rollback_trigger` (the last one's kind, "" before any) and
    `rollback_steps_lost` (steps trained and then discarded, summed)."""

    rollbacks: int = 0
    last_trigger: str = ""
    steps_lost: int = 0

    def row_fields(self) -> dict[str, Any]:
        return {"rollbacks": float(self.rollbacks), "rollback_trigger": self.last_trigger,
                "rollback_steps_lost": float(self.steps_lost)}


@dataclass
class CollapseDetector:
    """Reads step and eval rows; `observe_*` return a `Trigger` when the run has collapsed."""

    rule: RollbackConfig
    heldout_prompts: int
    k: int
    history: RollbackHistory = field(default_factory=RollbackHistory)
    best: float | None = None
    nonfinite_run: int = 0
    trouble: bool = False  # the last row or evaluation showed a sign short of a trigger
    stable_steps: list[int] = field(default_factory=list)

    def observe_step(self, step: int, row: Mapping[str, Any]) -> Trigger | None:
        r: RollbackConfig = self.rule
        self.nonfinite_run = self.nonfinite_run + 1 if row.get("skipped_nonfinite") else 0
        self.trouble = self.nonfinite_run > 0
        if r.nonfinite_steps is not None and self.nonfinite_run >= r.nonfinite_steps:
            return Trigger("nonfinite", step, f"{self.nonfinite_run} non-finite steps in a row "
                           f"(rollback.nonfinite_steps={r.nonfinite_steps})")
        trunc = row.get("truncation_rate")
        if r.truncation_rate is not None and trunc is not None and float(trunc) > r.truncation_rate:
            return Trigger("truncation", step, f"truncation_rate {float(trunc):.3f} > "
                           f"rollback.truncation_rate={r.truncation_rate:g}")
        ent = row.get("entropy")
        if r.entropy_max is not None and ent is not None and float(ent) > r.entropy_max:
            return Trigger("entropy", step,
                           f"entropy {float(ent):.3f} > rollback.entropy_max={r.entropy_max:g}")
        return None

    def observe_eval(self, step: int, metrics: Mapping[str, Any]) -> Trigger | None:
        value = metrics.get("val_pass_rate")
        z = self._z()
        if value is None or z is None or self.heldout_prompts < 1:
            return None
        v = float(value)
        if self.best is None or v > self.best:
            self.best = v
            return None
        band = pass_rate_band(self.best, self.heldout_prompts, self.k, z)
        if self.best - v > band:
            self.trouble = True
            return Trigger("pass_rate", step, f"val_pass_rate {v:.3f} < best {self.best:.3f} - {band:.3f} "
                           f"(rollback.pass_drop_se={z:g}, P={self.heldout_prompts}, "
                           f"k={self.k})")
        return None

    def _z(self) -> float | None:
        rule: RollbackConfig = self.rule
        return rule.pass_drop_se

    def mark_checkpoint(self, step: int) -> None:
        """Called as the checkpoint of `step` is written: remember it if nothing looked wrong."""
        if not self.trouble and self.nonfinite_run == 0 and step not in self.stable_steps:
            self.stable_steps.append(step)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "nonfinite_run": self.nonfinite_run, "trouble": self.trouble,
                "stable_steps": list(self.stable_steps)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best = None if state.get("best") is None else float(state["best"])
        self.nonfinite_run = int(state.get("nonfinite_run", 0))
        self.trouble = bool(state.get("trouble", False))
        self.stable_steps = [int(s) for s in state.get("stable_steps", [])]
