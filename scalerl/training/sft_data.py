"""Reading SFT data: (prompt, response) pairs from JSONL, JSON or Parquet files.

A row gives the prompt as `prompt` (text) or `messages` (chat turns), and the target response as
`response`, `completion` or `solution`, or `metadata.solution` (what the synthetic tasks write).
With `messages` and no response column, a final assistant turn is the target and the turns before
it the prompt. `field_map` renames columns (`{"prompt": "question", "response": "answer"}`).
Errors name the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from scalerl.data.records import PromptRecord

RESPONSE_COLUMNS: tuple[str, ...] = ("response", "completion", "solution")
SFT_SUFFIXES: tuple[str, ...] = (".jsonl", ".ndjson", ".json", ".parquet")


def _rows(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}:{i}", row
        return
    if suffix not in SFT_SUFFIXES:
        raise ValueError(f"{path}: unsupported SFT data format (expected one of {', '.join(SFT_SUFFIXES)})")
    text = path.read_text(encoding="utf-8")
    if suffix == ".json" and text.lstrip().startswith("["):
        for i, row in enumerate(json.loads(text)):
            yield f"{path}:{i}", row
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None


def _response_of(row: Mapping[str, Any], field_map: Mapping[str, str]) -> str | None:
    if "response" in field_map:
        value = row.get(field_map["response"])
        return value if isinstance(value, str) else None
    for name in RESPONSE_COLUMNS:
        if isinstance(row.get(name), str):
            return row[name]
    meta = row.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            meta = None
    if isinstance(meta, Mapping) and isinstance(meta.get("solution"), str):
        return meta["solution"]
    return None


def row_to_pair(
    row: Mapping[str, Any], where: str, field_map: Mapping[str, str] | None = None
) -> tuple[PromptRecord, str]:
    """One (prompt record, response text) pair, or a `ValueError` naming `where` and the field."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    fmap = dict(field_map or {})
    prompt = row.get(fmap.get("prompt", "prompt"))
    messages = row.get(fmap.get("messages", "messages"))
    response = _response_of(row, fmap)
    if isinstance(messages, str):
        messages = json.loads(messages)
    ends_with_answer = isinstance(messages, list) and messages and messages[-1].get("role") == "assistant"
    if response is None and ends_with_answer:
        response, messages = messages[-1].get("content"), messages[:-1]
    if not isinstance(response, str) or not response:
        raise ValueError(
            f"{where}: no response (a {'/'.join(RESPONSE_COLUMNS)} column, metadata.solution, "
            "or a final assistant turn in messages)"
        )
    rid = str(row.get(fmap.get("id", "id")) or where)
    task = str(row.get(fmap.get("task", "task")) or "sft")
    try:
        if isinstance(prompt, str) and prompt.strip():
            record = PromptRecord(id=rid, task=task, prompt=prompt, source=where)
        elif isinstance(messages, list) and messages:
            record = PromptRecord(id=rid, task=task, messages=[dict(m) for m in messages], source=where)
        else:
            raise ValueError("no prompt (a prompt column or chat messages before the response)")
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return record, response


def _files(root: Path) -> list[Path]:
    if not root.exists():
        raise FileNotFoundError(f"SFT data not found: {root}")
    files = [root]
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.suffix.lower() in SFT_SUFFIXES)
    if not files:
        raise ValueError(f"{root}: no {', '.join(SFT_SUFFIXES)} files")
    return files


def is_sft_file(path: str | Path) -> bool:
    """Whether `path` holds prompt/response rows: its first row has a `response` or `completion`
    column, or chat `messages` ending in an assistant turn. (`solution`, which synthetic prompt files
    carry in their metadata, does not count: those are prompt files.)"""
    root = Path(path)
    if not root.exists():
        return False
    try:
        files = _files(root)
        where_row = next(iter(_rows(files[0])), None)
    except ValueError:
        return False
    if where_row is None or not isinstance(where_row[1], Mapping):
        return False
    row = where_row[1]
    messages = row.get("messages")
    ends = isinstance(messages, list) and bool(messages) and isinstance(messages[-1], Mapping) \
        and messages[-1].get("role") == "assistant"
    return isinstance(row.get("response"), str) or isinstance(row.get("completion"), str) or ends


def read_sft_rows(
    path: str | Path, field_map: Mapping[str, str] | None = None
) -> list[tuple[Mapping[str, Any], PromptRecord, str]]:
    """Every row of a file (or folder) as (the row as read, its prompt record, its response): what
    `scalerl data curate` and `decontaminate` filter and write back unchanged."""
    rows = [(row, *row_to_pair(row, where, field_map)) for f in _files(Path(path)) for where, row in _rows(f)]
    if not rows:
        raise ValueError(f"{path}: no SFT rows")
    return rows


def read_sft_pairs(
    path: str | Path, field_map: Mapping[str, str] | None = None
) -> list[tuple[PromptRecord, str]]:
    """All pairs of a file, or of every supported file in a folder (sorted by name)."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"SFT data not found: {root}")
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.suffix.lower() in SFT_SUFFIXES)
    else:
        files = [root]
    if not files:
        raise ValueError(f"{root}: no {', '.join(SFT_SUFFIXES)} files")
    pairs = [row_to_pair(row, where, field_map) for f in files for where, row in _rows(f)]
    if not pairs:
        raise ValueError(f"{root}: no SFT rows")
    return pairs
