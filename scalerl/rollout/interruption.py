"""Forced interruption (ScaleRL length control, arXiv 2510.13786 Sec. 3 / A.10).

Each sample draws a thinking budget `b ~ U{lo, ..., hi}`. If it has generated `b` tokens without
emitting the `think_end_ids` sequence (`</think>`), the engine appends `phrase_ids` (not the policy's
action: loss-masked) and lets it answer within `answer_budget` more sampled tokens. A sample that
closes its thinking itself is never interrupted. The overall `max_new_tokens` limit still applies
and wins (finish reason `length`); an interrupted sample otherwise finishes as `interrupted`, whether
it stops on a stop token or exhausts its answer budget.

This module is the per-sample bookkeeping only; the engines do the token appending.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from scalerl.rollout.protocol import InterruptionSpec


class Action(Enum):
    """What the engine does after a sampled token that was neither a stop token nor the last allowed."""

    CONTINUE = "continue"
    INJECT = "inject"  # append the phrase now, then keep sampling the answer
    FINISH_INTERRUPTED = "finish_interrupted"  # answer budget spent
    FINISH_LENGTH = "finish_length"  # budget reached but the phrase would not fit in max_new_tokens


def draw_think_budget(spec: InterruptionSpec, rng: np.random.Generator) -> int:
    """A thinking budget drawn uniformly from the integers `[think_budget_lo, think_budget_hi]`."""
    return int(rng.integers(spec.think_budget_lo, spec.think_budget_hi + 1))


def ends_with(tokens: Sequence[int], pattern: Sequence[int]) -> bool:
    """Whether `tokens` ends with the token sequence `pattern`."""
    n = len(pattern)
    return 0 < n <= len(tokens) and list(tokens[-n:]) == list(pattern)


@dataclass
class InterruptionState:
    """One sample's progress through think -> (forced phrase) -> answer."""

    spec: InterruptionSpec
    budget: int
    closed: bool = False  # the sample emitted think_end_ids itself
    interrupted_at: int | None = None  # index in token_ids where the forced phrase starts

    @property
    def interrupted(self) -> bool:
        return self.interrupted_at is not None

    def answer_start(self) -> int | None:
        """Index of the first answer token after the phrase, if interrupted."""
        if self.interrupted_at is None:
            return None
        return self.interrupted_at + len(self.spec.phrase_ids)

    def after_token(self, token_ids: Sequence[int], max_new_tokens: int) -> Action:
        """Decide what follows the sampled token just appended to `token_ids`.

        Call only for tokens that did not stop the sample (stop token / `max_new_tokens` reached);
        those are handled by the engine first. On `INJECT` the state records where the phrase starts
        (`len(token_ids)`, i.e. right after this token); the engine then appends `spec.phrase_ids`.
        """
        answer_start = self.answer_start()
        if answer_start is not None:
            answered = len(token_ids) - answer_start
            return Action.FINISH_INTERRUPTED if answered >= self.spec.answer_budget else Action.CONTINUE
        if self.closed:
            return Action.CONTINUE
        if ends_with(token_ids, self.spec.think_end_ids):
            self.closed = True
            return Action.CONTINUE
        if len(token_ids) < self.budget:
            return Action.CONTINUE
        if len(token_ids) + len(self.spec.phrase_ids) >= max_new_tokens:
            # No room for the phrase plus at least one answer token: this is a truncation.
            return Action.FINISH_LENGTH
        self.interrupted_at = len(token_ids)
        return Action.INJECT
