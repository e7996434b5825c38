"""Built-in synthetic tasks for the embedded default: no download, deterministic from a seed.

`make_synthetic("math" | "code" | "math+code", n, seed)` builds prompt sets of any size (distinct
problems, mixed difficulty); `write_synthetic_jsonl` writes one in the loaders' format.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scalerl.data.loaders import write_jsonl_atomic
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.data.synthetic.arithmetic import (
    DEFAULT_MATH_DIFFICULTY,
    MATH_LEVELS,
    addition_trace,
    iter_math_task,
    make_math_task,
    math_record,
)
from scalerl.data.synthetic.functions import (
    CODE_LEVELS,
    DEFAULT_CODE_DIFFICULTY,
    iter_code_task,
    make_code_task,
)

SYNTHETIC_TASKS: tuple[str, ...] = ("math", "code", "math+code", "tool_math", "tool_code")


def _mixed(n: int, seed: int, difficulty: int | tuple[int, int] | None) -> list[PromptRecord]:
    """Math and code prompts interleaved at random, half each on average (multi-task training).

    One `difficulty` range serves both tasks; its top is capped at the code task's last level.
    """
    if n < 0:
        raise DataError(f"n: must be >= 0, got {n}")
    lo, hi = (1, len(MATH_LEVELS)) if difficulty is None else (
        (difficulty, difficulty) if isinstance(difficulty, int) else tuple(difficulty)
    )
    if lo > CODE_LEVELS:
        raise DataError(f"difficulty: math+code needs lo <= {CODE_LEVELS} (the code levels), got {lo}")
    is_math = np.random.default_rng([seed, 0x6D6978]).random(n) < 0.5
    streams = {True: iter_math_task(seed, (lo, hi)), False: iter_code_task(seed, (lo, min(hi, CODE_LEVELS)))}
    out: list[PromptRecord] = []
    for m in is_math.tolist():
        record = next(streams[m], None)
        if record is None:
            task = "math" if m else "code"
            raise DataError(f"n: not enough distinct {task} problems at difficulty {(lo, hi)} for n={n}")
        out.append(record)
    return out


def make_synthetic(
    task: str,
    n: int,
    seed: int = 0,
    difficulty: int | tuple[int, int] | None = None,
    weights: Sequence[float] | None = None,
) -> list[PromptRecord]:
    """`n` prompts of a built-in task; `difficulty=None` means every level.

    "math+code" mixes the two tasks at random, half each on average (`weights` does not apply).
    """
    if task == "math+code":
        if weights is not None:
            raise DataError("weights: per-level weights apply to 'math' or 'code', not 'math+code'")
        return _mixed(n, seed, difficulty)
    if task == "math":
        return make_math_task(n, seed, DEFAULT_MATH_DIFFICULTY if difficulty is None else difficulty, weights)
    if task == "code":
        return make_code_task(n, seed, DEFAULT_CODE_DIFFICULTY if difficulty is None else difficulty, weights)
    if task == "tool_math":  # the agentic task (long additions; the calculator tool is the right move)
        from scalerl.data.synthetic.tool_math import DEFAULT_TOOL_MATH_DIFFICULTY, make_tool_math_task

        levels = DEFAULT_TOOL_MATH_DIFFICULTY if difficulty is None else difficulty
        return make_tool_math_task(n, seed, levels, weights)
    if task == "tool_code":  # the code task with an interpreter trace (run the candidate, then answer)
        from scalerl.data.synthetic.tool_code import make_tool_code_task

        return make_tool_code_task(n, seed, DEFAULT_CODE_DIFFICULTY if difficulty is None else difficulty,
                                   weights)
    raise DataError(f"task: unknown synthetic task {task!r}; built-in tasks are {SYNTHETIC_TASKS}")


def write_synthetic_jsonl(
    path: str | os.PathLike[str],
    task: str,
    n: int,
    seed: int = 0,
    difficulty: int | tuple[int, int] | None = None,
    weights: Sequence[float] | None = None,
) -> Path:
    """Write `make_synthetic(...)` as JSON lines that `load_prompts` reads back unchanged: whole or
    not at all (a temporary file beside `path`, renamed over it), so a file it replaces stays as it
    was until the new one is complete."""
    return write_jsonl_atomic(make_synthetic(task, n, seed, difficulty, weights), path)


__all__ = [
    "CODE_LEVELS",
    "DEFAULT_CODE_DIFFICULTY",
    "DEFAULT_MATH_DIFFICULTY",
    "MATH_LEVELS",
    "SYNTHETIC_TASKS",
    "addition_trace",
    "iter_code_task",
    "iter_math_task",
    "make_code_task",
    "make_math_task",
    "make_synthetic",
    "math_record",
    "write_synthetic_jsonl",
]
