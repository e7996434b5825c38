"""Faults inside a step, counted, and the limits past which a run stops instead of going on.

Every fault is counted in the step rows (`verifier_failures`, `groups_dropped`, `skipped_no_signal`,
`skipped_nonfinite`) and a run goes on through occasional ones. A run of them in a row means
something is broken rather than unlucky, and each kind has its limit (a config key, None: no limit):

* a verifier raises, hangs past its timeout or returns a non-finite or invalid score: the sample
  scores `rewards.failure_reward`, counted in `verifier_failures`; limit
  `rewards.max_consecutive_failures` (samples in a row);
* dynamic sampling drops a group (all rewards equal): counted in `groups_dropped`, a refill is
  drawn; limit `algorithm.max_consecutive_dropped_groups` (groups in a row);
* every group of a batch filtered (zero variance): a no-op step, counted in `skipped_no_signal`;
  limit `optim.max_consecutive_noop_steps` (steps in a row; default none);
* NaN / Inf in log-probs, loss or gradient: the step is skipped, counted in `skipped_nonfinite`;
  limit `optim.max_consecutive_bad_steps` (the trainer's `TrainingDivergedError`).

A skipped step changes neither the weights nor the optimizer or LR-schedule state (the trainer
zeroes the gradients and returns before `optimizer.step()`); a failed sample gets
`rewards.failure_reward`. Past a limit the run raises `FaultLimitError` (`TrainingDivergedError`
for the trainer's), `scalerl train` prints it and exits 1, and the last checkpoint is the one to
resume from once the cause is fixed.
"""

from __future__ import annotations


class FaultLimitError(RuntimeError):
    """A counted fault occurred more times in a row than its configured limit allows."""


class RunLength:
    """Length of the current run of consecutive faults, checked against a limit (None: none)."""

    def __init__(self, limit: int | None, what: str, key: str) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"{key}: must be >= 1 or null, got {limit}")
        self.limit = limit
        self.what = what
        self.key = key
        self.count = 0

    def add(self, faulty: bool) -> None:
        """Record one outcome: a fault lengthens the run, anything else ends it."""
        self.count = self.count + 1 if faulty else 0

    def check(self, detail: str = "") -> None:
        """Raise `FaultLimitError` if the run of faults reached the limit."""
        if self.limit is not None and self.count >= self.limit:
            tail = f" (last: {detail})" if detail else ""
            raise FaultLimitError(f"{self.count} {self.what} in a row{tail}; stopping ({self.key}="
                                  f"{self.limit}). Fix the cause and resume from the last checkpoint.")
