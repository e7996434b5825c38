"""The prompt record: one training or evaluation prompt, whatever the task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalerl.data.rejects import DataError


@dataclass
class PromptRecord:
    """One prompt.

    `prompt` (plain text) or `messages` (chat turns, `[{"role": ..., "content": ...}]`) holds the
    question; `answer` is the gold answer for math-style tasks, `tests` the test cases for code
    (`{"stdin", "stdout"}` or `{"assert"}` dicts). `task` selects the verifier (e.g. "math", "code",
    or a registered custom name). `source` is where the record came from ("file:line") so errors
    downstream can point at it.
    """

    id: str
    task: str
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    answer: str | None = None
    tests: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        where = f" ({self.source})" if self.source else ""
        if not self.id:
            raise DataError(f"id: empty prompt id{where}")
        if (self.prompt is None) == (self.messages is None):
            raise DataError(f"prompt/messages: exactly one must be given for prompt {self.id!r}{where}")
        if self.prompt is not None and not self.prompt.strip():
            raise DataError(f"prompt: empty prompt text for prompt {self.id!r}{where}")
        if self.messages is not None and not self.messages:
            raise DataError(f"messages: empty chat for prompt {self.id!r}{where}")

    def chat(self, system_prompt: str | None = None) -> list[dict[str, str]]:
        """The prompt as chat turns, with an optional system prompt prepended."""
        if self.messages is not None:
            turns = list(self.messages)
        else:
            turns = [{"role": "user", "content": self.prompt or ""}]
        if system_prompt and not (turns and turns[0].get("role") == "system"):
            turns = [{"role": "system", "content": system_prompt}, *turns]
        return turns

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task": self.task,
            "prompt": self.prompt,
            "messages": self.messages,
            "answer": self.answer,
            "tests": self.tests,
            "metadata": self.metadata,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PromptRecord:
        return cls(**{k: d[k] for k in ("id", "task", "prompt", "messages", "answer", "tests",
                                         "metadata", "source") if k in d})
