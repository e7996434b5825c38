"""Parsing `<tool_call>` blocks (Qwen / Hermes JSON)."""

from __future__ import annotations

from scalerl.agentic.toolcalls import CallError, ToolCall, format_tool_call, parse_tool_calls


def test_hermes_blocks_parse_in_order_with_string_or_object_arguments() -> None:
    text = ('<think>two calls</think><tool_call>\n{"name": "calculator", '
            '"arguments": {"expression": "1+2"}}\n</tool_call> then '
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"cats\\"}"}</tool_call>')
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "1+2"}),
                                      ToolCall("search", {"query": "cats"})]


def test_format_round_trips() -> None:
    call = ToolCall("calculator", {"expression": "48213907+55128344"})
    assert parse_tool_calls("ok " + format_tool_call(call)) == [call]


def test_malformed_blocks_are_errors_not_silence() -> None:
    bad = ["<tool_call>{not json}</tool_call>", '<tool_call>["x"]</tool_call>',
           '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
           '<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', '<tool_call>{"name": "f"']
    for text in bad:
        (err,) = parse_tool_calls(text)
        assert isinstance(err, CallError) and err.kind == "malformed", text
    assert parse_tool_calls("no call here, just \\boxed{3}") == []
