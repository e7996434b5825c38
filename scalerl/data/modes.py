"""Thinking and non-thinking modes per prompt row (DeepSeek-V3.2 trains every domain in both).

A row's `thinking` column (true or false; absent: the run's own setting) picks how its prompt is
rendered (`scalerl.data.tokenize.encode_prompt`):

* `thinking: true`: the run's system prompt, else the `<think>` one (`THINK_SYSTEM_PROMPT`), and
  `enable_thinking=True` passed to the chat template (Qwen3's switch; templates without it ignore it);
* `thinking: false`: no `<think>` system prompt (a custom `data.system_prompt` stays) and
  `enable_thinking=False`.

Text templates that carry their own instruction (`r1`, `qwen_math`) take no per-row mode. Metrics
split by mode (`<name>/mode=think`, `<name>/mode=nothink`) in training rows and evaluations.
"""

from __future__ import annotations

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError

MODES = {True: "think", False: "nothink"}


def row_thinking(record: PromptRecord) -> bool | None:
    """The row's `thinking` column: True, False, or None when absent; a `DataError` naming the row
    for any other value."""
    value = record.metadata.get("thinking")
    if value is None or isinstance(value, bool):
        return value
    where = record.source or f"prompt {record.id!r}"
    raise DataError(f"{where}: column 'thinking' must be true or false, got {value!r}")


def row_mode(record: PromptRecord) -> str | None:
    """"think" / "nothink" for a row with a `thinking` column, else None."""
    thinking = row_thinking(record)
    return None if thinking is None else MODES[thinking]
