"""DeepSeek-V3.2 thinking retention and the context-management strategies, on message lists."""

from __future__ import annotations

import pytest

from scalerl.agentic.messages import (
    discard_tool_history,
    retain_thinking,
    summary_context,
    tool_rounds,
)

SYS = {"role": "system", "content": "You can call tools."}
U1 = {"role": "user", "content": "What is the weather in Paris tomorrow?"}
A1 = {"role": "assistant", "content": "<think>I need the date first.</think>",
      "tool_calls": [{"name": "date"}]}
T1 = {"role": "tool", "content": "2025-12-02"}
A2 = {"role": "assistant", "reasoning_content": "Now the forecast for 2025-12-02.", "content": "",
      "tool_calls": [{"name": "weather"}]}
T2 = {"role": "tool", "content": "rain, 9C"}
A3 = {"role": "assistant", "content": "<think>Rain it is.</think>Rain, 9C."}
U2 = {"role": "user", "content": "And in Rome?"}


def test_reasoning_is_kept_while_only_tool_results_are_appended() -> None:
    # Inside one user turn (V3.2 Fig. 4, left): every turn keeps its reasoning.
    history = [SYS, U1, A1, T1, A2, T2]
    assert retain_thinking(history) == history


def test_a_new_user_message_drops_historical_reasoning_but_keeps_tool_calls_and_results() -> None:
    out = retain_thinking([SYS, U1, A1, T1, A2, T2, A3, U2])
    assert out[2] == {"role": "assistant", "content": "", "tool_calls": [{"name": "date"}]}
    assert out[4] == {"role": "assistant", "content": "", "tool_calls": [{"name": "weather"}]}
    assert out[3] == T1 and out[5] == T2  # tool results always kept
    assert out[6] == {"role": "assistant", "content": "Rain, 9C."}  # the answer stays, its thinking goes
    assert out[7] == U2 and out[:2] == [SYS, U1]


def test_reasoning_after_the_new_user_message_is_kept() -> None:
    a4 = {"role": "assistant", "content": "<think>Same tools for Rome.</think>", "tool_calls": [{}]}
    out = retain_thinking([U1, A1, T1, A3, U2, a4])
    assert out[-1] == a4 and "<think>" not in out[1]["content"]


def test_tool_output_relayed_as_user_messages_loses_the_reasoning() -> None:
    # Frameworks that relay tool results as user turns (V3.2 notes Roo Code, Terminus) do not
    # benefit: each relayed result is a new user message.
    relayed = {"role": "user", "content": "tool output: 2025-12-02"}
    out = retain_thinking([U1, A1, relayed])
    assert out[1]["content"] == ""


def test_keep_all_changes_nothing_and_inputs_are_not_mutated() -> None:
    history = [U1, A1, T1, A3, U2]
    snapshot = [dict(m) for m in history]
    assert retain_thinking(history, "keep_all") == history
    retain_thinking(history)
    assert history == snapshot
    with pytest.raises(ValueError, match="unknown rule"):
        retain_thinking(history, "r1")


ROUNDS = [U1, A1, T1, A2, T2, {"role": "assistant", "content": "c3"}, {"role": "tool", "content": "r3"},
          {"role": "assistant", "content": "c4"}, {"role": "tool", "content": "r4"}]


def test_tool_rounds_and_discard_strategies() -> None:
    assert tool_rounds(ROUNDS) == [(1, 3), (3, 5), (5, 7), (7, 9)]
    kept, dropped = discard_tool_history(ROUNDS, 0.75)
    assert dropped == 3 and kept == [U1, ROUNDS[7], ROUNDS[8]]
    kept, dropped = discard_tool_history(ROUNDS, 1.0)
    assert dropped == 4 and kept == [U1]
    kept, dropped = discard_tool_history(ROUNDS[:5], 0.75)  # 2 rounds: one goes, one stays
    assert dropped == 1 and kept == [U1, A2, T2]
    assert discard_tool_history([U1], 0.75) == ([U1], 0)
    with pytest.raises(ValueError):
        discard_tool_history(ROUNDS, 0.0)


def test_summary_restarts_from_the_task_and_the_summary() -> None:
    out = summary_context([SYS, *ROUNDS], "<think>hmm</think> Found: rain, 9C.")
    assert out == [SYS, U1, {"role": "user", "content": "Summary of your work so far: Found: rain, 9C."}]
