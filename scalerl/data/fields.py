"""Turning one raw row (a dict from any file format) into a validated `PromptRecord`.

Datasets name their columns differently ("question", "problem", "solution", ...); a field map says
which column feeds which record field. Columns the map does not use are kept in `metadata`, so
nothing a dataset carries is lost (e.g. a reference solution for SFT or a difficulty label).
Values that a CSV cell can only hold as text (chat messages, tests, metadata) may be JSON strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from typing import Any

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import RowError

RECORD_FIELDS: tuple[str, ...] = ("id", "task", "prompt", "messages", "answer", "tests", "metadata")
CHAT_ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})


def check_field_map(field_map: Mapping[str, str] | None) -> dict[str, str]:
    """Validate a record-field -> column-name map; unknown record fields are a user error."""
    fmap = dict(field_map or {})
    for key, column in fmap.items():
        if key not in RECORD_FIELDS:
            raise ValueError(f"field_map: unknown record field {key!r}; record fields are {RECORD_FIELDS}")
        if not isinstance(column, str) or not column:
            raise ValueError(f"field_map[{key!r}]: column name must be a non-empty string, got {column!r}")
    columns = list(fmap.values())
    dupes = sorted({c for c in columns if columns.count(c) > 1})
    if dupes:
        raise ValueError(f"field_map: column(s) {dupes} mapped to more than one record field")
    return fmap


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True  # a missing cell in a numeric Parquet/pandas column
    return isinstance(value, str) and not value.strip()


def _maybe_json(value: Any, column: str, expect: type) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(f"bad {column}", f"field {column!r}: not valid JSON ({err.msg})") from None
    if not isinstance(value, expect):
        raise RowError(
            f"bad {column}", f"field {column!r}: expected a {expect.__name__}, got {type(value).__name__}"
        )
    return value


def _scalar_text(value: Any, column: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowError(
            f"bad {column}", f"field {column!r}: expected text or a number, got {type(value).__name__}"
        )
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # "42", not "42.0", when a reader parsed an integer column as float
    return str(value).strip()


def _messages(value: Any, column: str) -> list[dict[str, str]]:
    turns = _maybe_json(value, column, list)
    out: list[dict[str, str]] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or not isinstance(turn.get("content"), str):
            raise RowError(f"bad {column}", f"field {column!r}[{i}]: expected {{'role', 'content'}} strings")
        if turn.get("role") not in CHAT_ROLES:
            role = turn.get("role")
            roles = sorted(CHAT_ROLES)
            raise RowError(f"bad {column}", f"field {column!r}[{i}]: role {role!r} not in {roles}")
        out.append({"role": str(turn["role"]), "content": turn["content"]})
    if not any(t["content"].strip() for t in out if t["role"] != "system"):
        raise RowError("empty prompt", f"field {column!r}: no non-empty user/assistant turn")
    return out


def _tests(value: Any, column: str) -> list[dict[str, Any]]:
    raw = _maybe_json(value, column, list)
    if not raw:
        raise RowError(f"bad {column}", f"field {column!r}: empty test list")
    # Arrow stores a list of test dicts as structs with every key, so absent keys come back as None.
    tests = [{k: v for k, v in t.items() if v is not None} if isinstance(t, Mapping) else t for t in raw]
    # The same shapes the code verifier runs (scalerl.rewards.code_verifier.validate_tests), checked
    # here so a bad test list is a load-time row error rather than a failure mid-training.
    for i, test in enumerate(tests):
        ok = isinstance(test, Mapping) and (
            (isinstance(test.get("assert"), str) and not test.keys() & {"stdin", "stdout"})
            or (
                "assert" not in test
                and isinstance(test.get("stdout"), str)
                and isinstance(test.get("stdin", ""), str)
            )
        )
        if not ok:
            raise RowError(
                f"bad {column}",
                f"field {column!r}[{i}]: a test is {{'assert': str}} or {{'stdin': str, 'stdout': str}}",
            )
    return tests


def row_to_record(
    row: Mapping[str, Any],
    *,
    field_map: Mapping[str, str],
    default_task: str | None,
    fallback_id: str,
    source: str,
    gold_free_tasks: Collection[str] = (),
) -> PromptRecord:
    """Build a record from a row, or raise `RowError` naming the field that is wrong.

    A row needs a gold `answer` or `tests` (math an answer, code tests) unless its task is in
    `gold_free_tasks`: tasks scored by a reward model or by a custom verifier that reads neither
    (`scalerl.rewards.registry.gold_free_tasks`)."""

    def column(name: str) -> str:
        return field_map.get(name, name)

    def get(name: str) -> Any:
        value = row.get(column(name))
        return None if _missing(value) else value

    raw_id = get("id")
    rid = fallback_id if raw_id is None else _scalar_text(raw_id, column("id"))

    raw_task = get("task")
    task = default_task if raw_task is None else _scalar_text(raw_task, column("task"))
    if not task:
        raise RowError("missing task", f"no {column('task')!r} field and no default task given")

    raw_prompt, raw_messages = row.get(column("prompt")), get("messages")
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    if isinstance(raw_prompt, list) and raw_messages is None:
        # Many RL datasets keep the chat turns themselves in their "prompt" column.
        messages = _messages(raw_prompt, column("prompt"))
    elif raw_prompt is not None and not _missing(raw_prompt):
        if not isinstance(raw_prompt, str):
            raise RowError(
                "bad prompt", f"field {column('prompt')!r}: expected text, got {type(raw_prompt).__name__}"
            )
        if raw_messages is not None:
            raise RowError(
                "bad prompt", f"both {column('prompt')!r} and {column('messages')!r} given; keep one"
            )
        prompt = raw_prompt
    elif raw_messages is not None:
        messages = _messages(raw_messages, column("messages"))
    elif raw_prompt is not None:
        raise RowError("empty prompt", f"field {column('prompt')!r} is empty")
    else:
        raise RowError("missing prompt", f"no {column('prompt')!r} or {column('messages')!r} field")

    raw_answer, raw_tests = get("answer"), get("tests")
    answer = None if raw_answer is None else _scalar_text(raw_answer, column("answer"))
    tests = None if raw_tests is None else _tests(raw_tests, column("tests"))
    if task in gold_free_tasks:
        pass  # its scorer reads no gold: whatever the row carries is kept, nothing is required
    elif task == "math" and answer is None:
        raise RowError("missing answer", f"task 'math' needs a gold answer in field {column('answer')!r}")
    elif task == "code" and tests is None:
        raise RowError("missing tests", f"task 'code' needs tests in field {column('tests')!r}")
    elif answer is None and tests is None:
        raise RowError(
            "missing answer", f"no gold answer ({column('answer')!r}) or tests ({column('tests')!r})"
        )

    raw_meta = get("metadata")
    metadata: dict[str, Any] = {}
    if raw_meta is not None:
        metadata.update(_maybe_json(raw_meta, column("metadata"), dict))
    used = {column(name) for name in RECORD_FIELDS}
    for key, value in row.items():
        if key not in used and key not in metadata and not _missing(value):
            metadata[key] = value

    return PromptRecord(
        id=rid,
        task=task,
        prompt=prompt,
        messages=messages,
        answer=answer,
        tests=tests,
        metadata=metadata,
        source=source,
    )
