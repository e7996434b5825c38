"""scalerl.rollout.interruption: budget drawing and the think -> phrase -> answer decisions."""

from __future__ import annotations

import numpy as np

from scalerl.rollout.interruption import Action, InterruptionState, draw_think_budget, ends_with
from scalerl.rollout.protocol import InterruptionSpec

SPEC = InterruptionSpec(
    think_budget_lo=4, think_budget_hi=6, answer_budget=3, phrase_ids=(50, 51), think_end_ids=(9, 10)
)


def test_budget_is_uniform_over_the_closed_range() -> None:
    rng = np.random.default_rng(0)
    draws = [draw_think_budget(SPEC, rng) for _ in range(3000)]
    assert set(draws) == {4, 5, 6}
    counts = np.bincount(draws)[4:]
    assert (np.abs(counts / 3000 - 1 / 3) < 0.04).all()


def test_ends_with() -> None:
    assert ends_with([1, 9, 10], (9, 10))
    assert not ends_with([9, 10, 1], (9, 10))
    assert not ends_with([10], (9, 10))


def test_interrupts_at_budget_then_counts_the_answer() -> None:
    state = InterruptionState(SPEC, budget=4)
    tokens: list[int] = []
    actions = []
    for t in (20, 21, 22, 23):
        tokens.append(t)
        actions.append(state.after_token(tokens, max_new_tokens=100))
    assert actions == [Action.CONTINUE] * 3 + [Action.INJECT]
    assert state.interrupted_at == 4
    tokens += list(SPEC.phrase_ids)
    answer = []
    for t in (30, 31, 32):
        tokens.append(t)
        answer.append(state.after_token(tokens, max_new_tokens=100))
    assert answer == [Action.CONTINUE, Action.CONTINUE, Action.FINISH_INTERRUPTED]


def test_closing_think_in_time_is_never_interrupted() -> None:
    state = InterruptionState(SPEC, budget=4)
    tokens: list[int] = []
    for t in (20, 9, 10, 21, 22, 23, 24, 25):
        tokens.append(t)
        assert state.after_token(tokens, max_new_tokens=100) is Action.CONTINUE
    assert state.closed and not state.interrupted


def test_no_room_for_the_phrase_is_a_truncation() -> None:
    state = InterruptionState(SPEC, budget=4)
    tokens = [20, 21, 22, 23]
    # 4 tokens + 2 phrase tokens leave no room for an answer within 6.
    assert state.after_token(tokens, max_new_tokens=6) is Action.FINISH_LENGTH
    assert InterruptionState(SPEC, budget=4).after_token(tokens, max_new_tokens=7) is Action.INJECT
