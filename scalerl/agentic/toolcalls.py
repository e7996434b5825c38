"""Tool calls in the model's output: the Qwen / Hermes `<tool_call>` JSON format.

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
    if not isinstance(obj, dict):
        return CallError("malformed", f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return CallError("malformed", "no 'name' string")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            return CallError("malformed", f"'arguments' string is not JSON ({err.msg})")
    if not isinstance(args, dict):
        return CallError("malformed", f"'arguments' must be an object, got {type(args).__name__}")
    return ToolCall(name, args)


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
