"""What a program did through the endpoint, as token-level trajectories (token in, token out).

Every call to the endpoint is recorded as a `Call`: the exact prompt ids the engine was given, the
completion ids it sampled, their behaviour log-probs and policy versions, and the message (chat) or
text (completions) the client got back. A call continues an earlier call of the same session when
its input starts with that call's input plus the response the client got (a chat history that
echoes the assistant message back, or a completions prompt that appends to the earlier prompt and
its completion). Its prompt is then *stitched*: the earlier call's prompt ids, its completion ids
(never re-tokenized text), then the ids of what the program inserted after it (the chat
template's rendering of the new messages, or the new text). Otherwise the call starts a new window
from a fresh rendering.

Each call holds its `Trace` (the same representation `scalerl.agentic.rollout` builds): the
window's first prompt, then every token since, model tokens with their log-probs, versions and
the engine's loss mask, inserted tokens with mask False, log-prob 0 and the version at the time
they were inserted. The session's trajectory is the trace of its last call; model tokens of calls
outside that chain are not trained and are counted (`untrained_tokens`), as the agentic rollout
counts the windows its context management drops.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trace:
    """One window: `prompt_ids`, then `token_ids` with per-token log-probs, versions, loss mask,
    and the `(kind, start, end)` segments ("model" or "env") over `token_ids`."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    segments: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def context(self) -> list[int]:
        return [*self.prompt_ids, *self.token_ids]

    def copy(self) -> Trace:
        return Trace(list(self.prompt_ids), list(self.token_ids), list(self.logprobs), list(self.versions),
                     list(self.loss_mask), list(self.segments))

    def cut(self, num_tokens: int) -> Trace:
        """The trace with only its first `num_tokens` tokens after the prompt."""
        if not 0 <= num_tokens <= len(self.token_ids):
            raise ValueError(f"cut: {num_tokens} outside [0, {len(self.token_ids)}]")
        segs = [(k, s, min(e, num_tokens)) for k, s, e in self.segments if s < num_tokens]
        return Trace(list(self.prompt_ids), self.token_ids[:num_tokens], self.logprobs[:num_tokens],
                     self.versions[:num_tokens], self.loss_mask[:num_tokens], segs)

    def add(self, kind: str, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int],
            mask: Sequence[bool]) -> None:
        if not len(ids) == len(logprobs) == len(versions) == len(mask):
            raise ValueError("trace: ids, logprobs, versions and mask differ in length")
        start = len(self.token_ids)
        self.token_ids.extend(int(i) for i in ids)
        self.logprobs.extend(float(x) for x in logprobs)
        self.versions.extend(int(v) for v in versions)
        self.loss_mask.extend(bool(m) for m in mask)
        if ids:
            self.segments.append((kind, start, len(self.token_ids)))

    def insert(self, ids: Sequence[int], version: int) -> None:
        """Tokens the program inserted: not the policy's actions (mask False, log-prob 0)."""
        k = len(ids)
        self.add("env", ids, [0.0] * k, [version] * k, [False] * k)

    @property
    def model_tokens(self) -> int:
        return sum(e - s for kind, s, e in self.segments if kind == "model")

    @property
    def env_tokens(self) -> int:
        return sum(e - s for kind, s, e in self.segments if kind == "env")


@dataclass
class Call:
    """One recorded call (one choice of one request): what went in, what came out."""

    kind: str  # "chat" or "completion"
    request: Any  # chat: the normalized message list; completion: the prompt text (or id list)
    response: Any  # chat: the assistant message returned; completion: the text returned
    trace: Trace  # the window up to and including this call's completion
    prompt_len: int  # len(trace.context) before the completion: the prompt the engine was given
    completion_len: int
    finish_reason: str
    parent: int | None  # index of the call this one continues; None: a new window
    dropped_eos: bool = False  # completions: the trailing EOS id was not part of the returned text

    @property
    def prompt_ids(self) -> list[int]:
        return self.trace.context[: self.prompt_len]

    @property
    def completion_ids(self) -> list[int]:
        return self.trace.context[self.prompt_len: self.prompt_len + self.completion_len]


def normalize_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value (the wire format sends them as a JSON string)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def same_assistant_message(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether the assistant message a client sent back is the one the endpoint returned: the same
    content (None and "" alike) and the same tool calls (names and parsed arguments; ids ignored)."""
    if sent.get("role") != "assistant":
        return False
    if (sent.get("content") or "") != (returned.get("content") or ""):
        return False

    def calls(m: dict[str, Any]) -> list[tuple[str, str]]:
        out = []
        for c in m.get("tool_calls") or []:
            fn = c.get("function", c)
            out.append((str(fn.get("name")), json.dumps(normalize_arguments(fn.get("arguments")),
                                                        sort_keys=True)))
        return out

    return calls(sent) == calls(returned)


@dataclass
class Session:
    """The calls of one client (one API key): an episode, in a training run."""

    key: str
    calls: list[Call] = field(default_factory=list)
    tool_calls: int = 0  # tool calls parsed from the responses
    gen_time_s: float = 0.0  # time its calls waited for the engine
    budget_refused: bool = False  # a call was refused: the token budget was spent

    def chat_parent(self, messages: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
        """(index of the call `messages` continues, number of its messages) or None: the latest
        call whose messages are a prefix of `messages`, followed by the assistant message it
        returned, with at least one message after that."""
        for i in range(len(self.calls) - 1, -1, -1):
            c = self.calls[i]
            if c.kind != "chat":
                continue
            n = len(c.request)
            if len(messages) > n + 1 and list(messages[:n]) == c.request and \
                    same_assistant_message(messages[n], c.response):
                return i, n
        return None

    def completion_parent(self, prompt: str) -> int | None:
        """The latest text call whose prompt plus returned text starts `prompt` (and is shorter)."""
        for i in range(len(self.calls) - 1, -1, -1):
            c = self.calls[i]
            if c.kind != "completion" or not isinstance(c.request, str):
                continue
            head = c.request + c.response
            if len(prompt) > len(head) and prompt.startswith(head):
                return i
        return None

    def final(self) -> Call | None:
        return self.calls[-1] if self.calls else None

    def chain(self) -> list[int]:
        """Indices of the calls the last call's trace holds (it and its ancestors)."""
        out: list[int] = []
        i = len(self.calls) - 1 if self.calls else None
        while i is not None:
            out.append(i)
            i = self.calls[i].parent
        return out[::-1]

    def untrained_tokens(self) -> int:
        """Model tokens of calls outside the final chain (not in the trajectory trained on)."""
        chain = set(self.chain())
        return sum(c.completion_len for i, c in enumerate(self.calls) if i not in chain)

    def windows(self) -> int:
        return sum(1 for c in self.calls if c.parent is None)
