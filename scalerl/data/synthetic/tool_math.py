r"""The built-in agentic task: additions whose operands are too long to add reliably by hand.

`Compute 48213907+55128344`. The tiny default can add digit by digit (the `math` task's column
trace), but every column is a chance to slip, so its pass rate falls with the operand length. A
calculator call is exact: the right move is to call the tool and copy its result,

    <tool_call>{"name": "calculator", "arguments": {"expression": "48213907+55128344"}}</tool_call>
    [environment: the tool response 103342251]
    \boxed{103342251}

so a policy that learns to prefer the tool (and to copy its operands and its result without a
slip) gains reward. Records are `task="math"` (the math verifier judges the boxed answer) and carry
both gold traces: `metadata["solution"]`, the column-addition trace, and `metadata["tool_call"]`,
the expression the tool trace sends (see `scalerl.agentic.sft`). Levels are the operand lengths:

    level 1  3 digits + 3 digits  ...  level 6  8 digits + 8 digits
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.data.synthetic.arithmetic import addition_trace
from scalerl.data.synthetic.draws import level_range, level_weights, unique_draws

TOOL_MATH_LEVELS: tuple[int, ...] = (3, 4, 5, 6, 7, 8)  # digits of each of the two operands
DEFAULT_TOOL_MATH_DIFFICULTY: tuple[int, int] = (1, len(TOOL_MATH_LEVELS))


def tool_math_record(a: int, b: int, level: int | None = None) -> PromptRecord:
    expr = f"{a}+{b}"
    metadata: dict[str, object] = {"solution": addition_trace([a, b]), "tool_call": expr, "operands": [a, b]}
    if level is not None:
        metadata["difficulty"] = level
    return PromptRecord(id=f"tool-math-{expr}", task="math", prompt=f"Compute {expr}", answer=str(a + b),
                        metadata=metadata)


def iter_tool_math_task(
    seed: int, difficulty: int | tuple[int, int] = DEFAULT_TOOL_MATH_DIFFICULTY,
    weights: Sequence[float] | None = None,
) -> Iterator[PromptRecord]:
    """Distinct problems in a seeded order, levels mixed by `weights` (uniform by default)."""
    levels = level_range(difficulty, len(TOOL_MATH_LEVELS), "tool_math")
    probs = level_weights(levels, weights, "tool_math")
    rng = np.random.default_rng([seed, 0x746F6F6C])
    sizes = [(9 * 10 ** (TOOL_MATH_LEVELS[lv - 1] - 1)) ** 2 for lv in levels]
    for pos, index in unique_draws(rng, sizes, probs):
        digits = TOOL_MATH_LEVELS[levels[pos] - 1]
        count = 9 * 10 ** (digits - 1)
        i, j = divmod(index, count)
        yield tool_math_record(10 ** (digits - 1) + i, 10 ** (digits - 1) + j, levels[pos])


def make_tool_math_task(
    n: int, seed: int = 0, difficulty: int | tuple[int, int] = DEFAULT_TOOL_MATH_DIFFICULTY,
    weights: Sequence[float] | None = None,
) -> list[PromptRecord]:
    """`n` distinct long additions (the first `n` of `iter_tool_math_task(seed, ...)`)."""
    if n < 0:
        raise DataError(f"n: must be >= 0, got {n}")
    out: list[PromptRecord] = []
    for record in iter_tool_math_task(seed, difficulty, weights):
        if len(out) == n:
            break
        out.append(record)
    return out
