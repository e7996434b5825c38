"""Tool calls in the model's output, in the formats models are trained to write (`agentic.tool_parser`).

The default, `hermes`, is the Qwen / Hermes `<tool_call>` JSON format described below. The others:

* `llama3_json` (Llama 3.1/3.2/3.3 JSON tool calling): the turn is one JSON object, or several
  separated by `;`, each `{"name": ..., "parameters": {...}}` (`arguments` accepted too),
  optionally after `<|python_tag|>`.
* `mistral` (Mistral's function calling): `[TOOL_CALLS]` followed by a JSON array of
  `{"name": ..., "arguments": {...}}` (tokenizer v3), or by `name[ARGS]{...}` per call (v11+).
* `qwen3_xml` (Qwen3-Coder): `<tool_call><function=NAME><parameter=P>value</parameter>...
  </function></tool_call>`; a value that parses as JSON (a number, a list, an object, true) is
  taken as that value, anything else as the string, stripped of the newline around it.

vLLM's own parsers are not used (they need vLLM's request objects); the formats above follow
vLLM's tool-parser documentation and the models' chat templates, and each is tested on strings
written the way those templates write them (`tests/agentic/test_tool_parsers.py`).

Qwen2.5/Qwen3 chat templates (and NousResearch's Hermes function-calling format before them) have
the model write each call as

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "48213907+55128344"}}
    </tool_call>

That is the format parsed here, for every tokenizer: where the vocabulary has `<tool_call>` as one
token (Qwen) it is matched as text after decoding like any other. `arguments` may also be a JSON
string holding an object (the OpenAI wire format). A block that does not parse, lacks a name, or is
left open at the end of the turn is a *malformed* call: it is returned as a `CallError`, so the
environment answers it with an error observation instead of silently dropping it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CallError:
    """A block that is not a valid call; `kind` is the error kind counted in metrics."""

    kind: str
    detail: str


def format_tool_call(call: ToolCall) -> str:
    """The text the model writes for `call` (what SFT traces use): one `<tool_call>` JSON block."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, separators=(", ", ": "))
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def _parse_block(body: str) -> ToolCall | CallError:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return CallError("malformed", f"not JSON ({err.msg} at char {err.pos})")
    return _call_from_object(obj, ("arguments",))


def parse_tool_calls(text: str) -> list[ToolCall | CallError]:
    """Every `<tool_call>` block of one model turn, in order (calls and malformed blocks).

    An opening tag without its closing tag after the last complete block is one malformed call
    (a turn cut off mid-call by its token budget, or a model that forgot to close it).
    """
    out: list[ToolCall | CallError] = [_parse_block(m.group(1)) for m in _BLOCK.finditer(text)]
    tail = text[m.end():] if (m := _last_match(text)) is not None else text
    if TOOL_CALL_OPEN in tail:
        out.append(CallError("malformed", f"{TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}"))
    return out


def _last_match(text: str) -> re.Match[str] | None:
    last = None
    for last in _BLOCK.finditer(text):  # noqa: B007 - the loop variable is the result
        pass
    return last


# --------------------------------------------------------------------------------------------
# The other formats (`agentic.tool_parser`)

TOOL_PARSERS = ("hermes", "llama3_json", "mistral", "qwen3_xml")
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
_QWEN3_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_QWEN3_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def turn_stop_text(parser: str) -> str | None:
    """The text that ends a turn with a call (generation stops there); None: the model's end of
    turn does (the JSON formats end the turn after the call)."""
    return TOOL_CALL_CLOSE if parser in ("hermes", "qwen3_xml") else None


def _call_from_object(obj: Any,
                      args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | CallError:
    """A call from its decoded JSON object: a `name` string and an arguments object (or a JSON
    string holding one, the OpenAI wire format) under the first of `args_keys` present."""
    if not isinstance(obj, dict):
        return CallError("malformed", f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return CallError("malformed", "no 'name' string")
    key = next((k for k in args_keys if k in obj), args_keys[0])
    args: Any = obj.get(key, {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            return CallError("malformed", f"'{key}' string is not JSON ({err.msg})")
    if not isinstance(args, dict):
        return CallError("malformed", f"'{key}' must be an object, got {type(args).__name__}")
    return ToolCall(name, args)


def _json_values(text: str) -> list[Any] | CallError:
    """Consecutive JSON values in `text`, separated by whitespace or `;`."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i >= len(text):
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as err:
            return CallError("malformed", f"not JSON ({err.msg} at char {err.pos})")
        values.append(value)


def _parse_llama3_json(text: str) -> list[ToolCall | CallError]:
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    body = body.removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        # prose is an answer; a python tag followed by something else is a broken call
        return [CallError("malformed", f"{PYTHON_TAG} without a JSON call")] if tagged else []
    values = _json_values(body)
    if isinstance(values, CallError):
        return [values]
    if not tagged and not all(isinstance(v, dict) and "name" in v for v in values):
        return []  # a JSON answer, not a call
    return [_call_from_object(v) for v in values]


def _parse_mistral(text: str) -> list[ToolCall | CallError]:
    if MISTRAL_CALLS not in text:
        return []
    out: list[ToolCall | CallError] = []
    for chunk in text.split(MISTRAL_CALLS)[1:]:
        chunk = chunk.strip()
        if "[ARGS]" in chunk and not chunk.startswith("["):  # v11: name[ARGS]{...}
            name, _, args = chunk.partition("[ARGS]")
            values = _json_values(args)
            if isinstance(values, CallError):
                out.append(values)
                continue
            if len(values) != 1:
                out.append(CallError("malformed", "[ARGS] must hold one JSON object"))
                continue
            out.append(_call_from_object({"name": name.strip(), "arguments": values[0]}))
            continue
        values = _json_values(chunk)
        if isinstance(values, CallError):
            out.append(values)
            continue
        for value in values:
            out.extend(_call_from_object(v) for v in (value if isinstance(value, list) else [value]))
    return out


def _xml_value(raw: str) -> Any:
    text = raw.strip("\n")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parse_qwen3_xml(text: str) -> list[ToolCall | CallError]:
    out: list[ToolCall | CallError] = []
    for block in _BLOCK.finditer(text):
        functions = list(_QWEN3_FUNCTION.finditer(block.group(1)))
        if not functions:
            out.append(CallError("malformed", "<tool_call> without <function=NAME>...</function>"))
        for fn in functions:
            params = _QWEN3_PARAMETER.finditer(fn.group(2))
            args = {m.group(1).strip(): _xml_value(m.group(2)) for m in params}
            out.append(ToolCall(fn.group(1).strip(), args))
    tail = text[m.end():] if (m := _last_match(text)) is not None else text
    if TOOL_CALL_OPEN in tail:
        out.append(CallError("malformed", f"{TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}"))
    return out


def parse_turn(text: str, parser: str = "hermes") -> list[ToolCall | CallError]:
    """The calls of one model turn in `parser`'s format (`TOOL_PARSERS`)."""
    if parser == "hermes":
        return parse_tool_calls(text)
    if parser == "llama3_json":
        return _parse_llama3_json(text)
    if parser == "mistral":
        return _parse_mistral(text)
    if parser == "qwen3_xml":
        return _parse_qwen3_xml(text)
    raise ValueError(f"agentic.tool_parser: unknown parser {parser!r} (known: {', '.join(TOOL_PARSERS)})")
