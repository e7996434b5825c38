"""`agentic.tool_parser`: each format parsed from strings written the way the models' chat templates
and vLLM's tool-parser documentation write them, and wired into the tool environment."""

from __future__ import annotations

import pytest

from scalerl.agentic.environment import ToolEnvironment
from scalerl.agentic.toolcalls import (
    TOOL_PARSERS,
    CallError,
    ToolCall,
    parse_turn,
    turn_stop_text,
)
from scalerl.agentic.tools import ToolBox, ToolSettings, tool_factories
from scalerl.config import AgenticConfig

CALC = ToolCall("calculator", {"expression": "2+3"})

# One call per format, as each model family writes it.
WRITTEN = {
    "hermes": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>',
    "llama3_json": '{"name": "calculator", "parameters": {"expression": "2+3"}}',
    "mistral": '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2+3"}}]',
    "qwen3_xml": "<tool_call>\n<function=calculator>\n<parameter=expression>\n2+3\n</parameter>\n"
                 "</function>\n</tool_call>",
}


@pytest.mark.parametrize("parser", TOOL_PARSERS)
def test_each_format_parses_its_own_call_and_no_other(parser: str) -> None:
    assert parse_turn(WRITTEN[parser], parser) == [CALC]
    assert parse_turn("The answer is \\boxed{5}.", parser) == []  # an answer is no call
    for other, text in WRITTEN.items():
        if other != parser and not {parser, other} <= {"hermes", "qwen3_xml"}:
            assert not any(isinstance(c, ToolCall) for c in parse_turn(text, parser)), (parser, other)


def test_llama3_variants() -> None:
    two = ('<|python_tag|>{"name": "calculator", "parameters": {"expression": "2+3"}}; '
           '{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}')
    assert parse_turn(two, "llama3_json") == [CALC, ToolCall("search", {"query": "x"})]
    assert parse_turn('{"answer": 5}', "llama3_json") == []  # JSON without a name: an answer
    (bad,) = parse_turn('<|python_tag|>{"name": "calculator", "parameters": ', "llama3_json")
    assert isinstance(bad, CallError) and bad.kind == "malformed"


def test_mistral_variants() -> None:
    v11 = '[TOOL_CALLS]calculator[ARGS]{"expression": "2+3"}[TOOL_CALLS]search[ARGS]{"query": "x"}'
    assert parse_turn(v11, "mistral") == [CALC, ToolCall("search", {"query": "x"})]
    many = ('[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2+3"}}, '
            '{"name": "search", "arguments": {"query": "x"}}]')
    assert parse_turn(many, "mistral") == [CALC, ToolCall("search", {"query": "x"})]
    (bad,) = parse_turn("[TOOL_CALLS][{]", "mistral")
    assert isinstance(bad, CallError)


def test_qwen3_xml_values_and_errors() -> None:
    text = ("<tool_call>\n<function=search>\n<parameter=query>\nlong text, with commas\n</parameter>\n"
            "<parameter=k>\n3\n</parameter>\n<parameter=filters>\n[\"a\", \"b\"]\n</parameter>\n"
            "</function>\n</tool_call>")
    assert parse_turn(text, "qwen3_xml") == [ToolCall("search", {"query": "long text, with commas", "k": 3,
                                                                 "filters": ["a", "b"]})]
    (bad,) = parse_turn("<tool_call>\n<function=search>\n", "qwen3_xml")
    assert isinstance(bad, CallError) and "without" in bad.detail
    (empty,) = parse_turn("<tool_call>{}</tool_call>", "qwen3_xml")
    assert isinstance(empty, CallError)


def test_the_turn_stops_after_a_tagged_call_only() -> None:
    assert turn_stop_text("hermes") == turn_stop_text("qwen3_xml") == "</tool_call>"
    assert turn_stop_text("llama3_json") is None and turn_stop_text("mistral") is None
    with pytest.raises(ValueError, match=r"agentic\.tool_parser"):
        parse_turn("x", "nope")


@pytest.mark.parametrize("parser", TOOL_PARSERS)
def test_the_environment_runs_the_call_in_the_configured_format(parser: str) -> None:
    from scalerl.data.records import PromptRecord

    a = AgenticConfig(environment="tools", tools=["calculator"], tool_parser=parser)
    env = ToolEnvironment(ToolBox(tool_factories(a.tools, ToolSettings(timeout_s=5))), parser=a.tool_parser)
    try:
        env.reset(PromptRecord(id="p", task="math", prompt="2+3?", answer="5"))
        result = env.step(WRITTEN[parser])
        assert result.tool_calls == 1 and not result.done
        assert "5" in result.observations[0]["content"]
    finally:
        env.close()
