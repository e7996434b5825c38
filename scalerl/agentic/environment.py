"""The environment protocol: the (environment, tools, task, verifier) tuple of DeepSeek-V3.2.

An `Environment` is one episode's world. `reset(task)` starts it from a task record and returns
the initial messages; `step(action)` receives the text of one model turn and returns the
observations (tool results, or any message) and whether the episode is over; `score()` is its
verdict at the end: a number in [0, 1] or a `VerifierResult` when the environment judges the
episode itself, None to let the task's verifier (`rewards`: math, code, a custom verifier by
dotted path) judge the final answer; `close()` destroys its state. `tool_schemas` lists the tools
for chat templates that render them.

The rollout (`scalerl.agentic.rollout`) owns the limits that hold for every environment: the turn
limit, the token budget, the context budget and its management, thinking retention.

`ToolEnvironment` is the built-in one: it parses `<tool_call>` blocks (`toolcalls.py`), runs the
tools of a `ToolBox`, and ends when a turn calls no tool (that turn is the answer). A malformed
call, an unknown tool, a tool that raises or exceeds `timeout_s`: the model gets an error
observation (`error (<kind>): ...`), the kind is counted in `StepResult.errors`, the episode goes
on. Other environments load by dotted path (`agentic.environment: "my_pkg.envs:make_env"`, called
with the `ToolBox`), or through an adapter for an existing library (`skyrl.py`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from scalerl.agentic.messages import Message
from scalerl.agentic.toolcalls import CallError, ToolCall, parse_turn
from scalerl.agentic.tools import Tool, ToolBox, ToolError
from scalerl.data.records import PromptRecord
from scalerl.rewards.registry import VerifierResult


@dataclass
class StepResult:
    """What one model turn did: observations to append, whether the episode ended, counts."""

    observations: list[Message]
    done: bool
    tool_calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)


@runtime_checkable
class Environment(Protocol):
    tool_schemas: list[dict[str, Any]]

    def reset(self, task: PromptRecord) -> list[Message]: ...

    def step(self, action: str) -> StepResult: ...

    def score(self) -> float | VerifierResult | None: ...

    def close(self) -> None: ...


EnvironmentFactory = Callable[[], Environment]


def error_observation(kind: str, message: str, name: str = "") -> Message:
    return {"role": "tool", "name": name, "content": f"error ({kind}): {message}"}


class ToolEnvironment:
    """Tool use on any task: each turn's `<tool_call>`s are run; a turn without one is the answer."""

    def __init__(self, tools: ToolBox, *, timeout_s: float = 10.0, system_prompt: str | None = None,
                 parser: str = "hermes") -> None:
        self.toolbox = tools
        self.parser = parser
        self.timeout_s = float(timeout_s)
        self.system_prompt = system_prompt
        self.tool_schemas = tools.schemas()
        self._tools: dict[str, Tool] = {}
        self.abandoned_calls = 0  # tool threads still running after their timeout

    def reset(self, task: PromptRecord) -> list[Message]:
        self.close()
        self._tools = self.toolbox.open()
        return task.chat(self.system_prompt)

    def step(self, action: str) -> StepResult:
        calls = parse_turn(action, self.parser)
        if not calls:
            return StepResult([], done=True)
        result = StepResult([], done=False, tool_calls=len(calls))
        for call in calls:
            obs, kind = self._run(call)
            result.observations.append(obs)
            if kind is not None:
                result.errors[kind] += 1
        return result

    def _run(self, call: ToolCall | CallError) -> tuple[Message, str | None]:
        if isinstance(call, CallError):
            return error_observation(call.kind, call.detail), call.kind
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return error_observation("unknown_tool", f"no tool {call.name!r} (tools: {known})", call.name), \
                "unknown_tool"
        box: list[Any] = []

        def target() -> None:
            try:
                box.append(tool.call(call.arguments))
            except BaseException as exc:  # reported to the model and counted, never raised
                box.append(exc)

        thread = threading.Thread(target=target, name=f"tool-{call.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            self.abandoned_calls += 1
            return error_observation("timeout", f"{call.name} took over {self.timeout_s:g} s", call.name), \
                "timeout"
        value = box[0]
        if isinstance(value, ToolError):
            return error_observation(value.kind, str(value), call.name), value.kind
        if isinstance(value, BaseException):
            detail = f"{call.name} raised {type(value).__name__}: {value}"[:500]
            return error_observation("tool_error", detail, call.name), "tool_error"
        if not isinstance(value, str):
            return error_observation("tool_error", f"{call.name} returned {type(value).__name__}, not text",
                                     call.name), "tool_error"
        return {"role": "tool", "name": call.name, "content": value}, None

    def score(self) -> float | VerifierResult | None:
        return None  # the task's verifier judges the answer

    def close(self) -> None:
        for tool in self._tools.values():
            tool.close()
        self._tools = {}


def final_answer_text(turn_texts: Sequence[str]) -> str:
    """What the task's verifier reads: the last model turn (the answer turn)."""
    return turn_texts[-1] if turn_texts else ""
