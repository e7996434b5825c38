r"""The synthetic math task: column addition with a step-by-step `<think>` trace and a `\boxed{}` answer.

Built for the embedded char-level tiny model, so prompts stay under 20 characters and gold
completions under 60 tokens. Difficulty is the shape of the sum (how many operands, how many
digits each), which sets the number of columns and how large the carries get:

    level 1  3+5           level 5  372+481
    level 2  37+5          level 6  37+48+19
    level 3  37+48         level 7  3721+4815
    level 4  372+48        level 8  372+481+195

The gold trace adds one column per step, right to left, writing the column's digits (a shorter
operand contributes 0), the carry in, the column sum, and the answer digits found so far:

    Compute 57+68  ->  <think>7+8=15>5;5+6+1=12>125</think>\boxed{125}

Every step reads digits at a fixed place and copies the partial answer from the step before, so a
small transformer can learn the procedure, and the answer is the last partial copied out. Longer
sums chain more steps, so a model's per-step error rate turns into a pass rate that falls with the
level: a mixed-level set has easy, medium and hard prompts, as a real prompt set does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.data.synthetic.draws import level_range, level_weights, unique_draws

# Digits of each operand, per level (level = position + 1).
MATH_LEVELS: tuple[tuple[int, ...], ...] = (
    (1, 1),
    (2, 1),
    (2, 2),
    (3, 2),
    (3, 3),
    (2, 2, 2),
    (4, 4),
    (3, 3, 3),
)
DEFAULT_MATH_DIFFICULTY: tuple[int, int] = (1, len(MATH_LEVELS))


def _operand_range(digits: int) -> tuple[int, int]:
    """(smallest value, count) of numbers with exactly `digits` digits; one-digit numbers include 0."""
    if digits == 1:
        return 0, 10
    return 10 ** (digits - 1), 9 * 10 ** (digits - 1)


def level_size(level: int) -> int:
    """How many distinct problems a level has (before the operand order is shuffled)."""
    return int(np.prod([_operand_range(d)[1] for d in MATH_LEVELS[level - 1]]))


def _decode(level: int, index: int) -> list[int]:
    values = []
    for digits in MATH_LEVELS[level - 1]:
        low, count = _operand_range(digits)
        index, offset = divmod(index, count)
        values.append(low + offset)
    return values


def _arrange(level: int, operands: list[int], rng: np.random.Generator) -> list[int]:
    """Shuffle where the longer and shorter operands stand ("37+5" or "5+37").

    Only the order of different-length operands is shuffled: swapping two same-length operands
    would turn one problem index into another one's text and repeat a prompt.
    """
    shapes = MATH_LEVELS[level - 1]
    queues = {d: [x for x, s in zip(operands, shapes, strict=True) if s == d] for d in set(shapes)}
    return [queues[shapes[i]].pop(0) for i in rng.permutation(len(shapes))]


def addition_trace(operands: Sequence[int]) -> str:
    r"""The gold completion for summing `operands`: `<think>` column steps, then `\boxed{sum}`."""
    if len(operands) < 2 or any(x < 0 for x in operands):
        raise DataError(f"operands: need two or more non-negative integers, got {list(operands)}")
    reversed_digits = [str(x)[::-1] for x in operands]
    width = max(len(d) for d in reversed_digits)
    steps, partial, carry = [], "", 0
    for col in range(width):
        terms = [int(d[col]) if col < len(d) else 0 for d in reversed_digits]
        if col > 0:
            terms.append(carry)
        total = sum(terms)
        last = col == width - 1
        partial = (str(total) if last else str(total % 10)) + partial
        carry = total // 10
        steps.append("+".join(map(str, terms)) + f"={total}>{partial}")
    if int(partial) != sum(operands):
        raise AssertionError(f"trace for {operands} ends at {partial}, not {sum(operands)}")
    return "<think>" + ";".join(steps) + "</think>\\boxed{" + str(sum(operands)) + "}"


def math_record(operands: Sequence[int], level: int | None = None) -> PromptRecord:
    """One addition prompt; its id is the expression, so the same problem always has the same id."""
    expr = "+".join(str(x) for x in operands)
    metadata: dict[str, object] = {"solution": addition_trace(operands), "operands": list(operands)}
    if level is not None:
        metadata["difficulty"] = level
    return PromptRecord(
        id=f"math-{expr}",
        task="math",
        prompt=f"Compute {expr}",
        answer=str(sum(operands)),
        metadata=metadata,
    )


def iter_math_task(
    seed: int,
    difficulty: int | tuple[int, int] = DEFAULT_MATH_DIFFICULTY,
    weights: Sequence[float] | None = None,
) -> Iterator[PromptRecord]:
    """Distinct addition prompts in a seeded order, levels mixed by `weights` (uniform by default).

    The stream is as long as the chosen levels have problems: practically unlimited from level 5 on.
    """
    levels = level_range(difficulty, len(MATH_LEVELS), "math")
    probs = level_weights(levels, weights, "math")
    rng = np.random.default_rng([seed, 0x6D617468])
    for pos, index in unique_draws(rng, [level_size(lv) for lv in levels], probs):
        level = levels[pos]
        yield math_record(_arrange(level, _decode(level, index), rng), level)


def make_math_task(
    n: int,
    seed: int = 0,
    difficulty: int | tuple[int, int] = DEFAULT_MATH_DIFFICULTY,
    weights: Sequence[float] | None = None,
) -> list[PromptRecord]:
    """`n` distinct addition prompts (`task="math"`); the first `n` of `iter_math_task(seed, ...)`.

    `difficulty` is one level or an inclusive (lo, hi) range of `MATH_LEVELS`; `weights` gives the
    relative share of each level in that range. Each record carries `metadata["solution"]` (the gold
    completion, for SFT warm-starts), `["difficulty"]` and `["operands"]`.
    """
    if n < 0:
        raise DataError(f"n: must be >= 0, got {n}")
    out: list[PromptRecord] = []
    for record in iter_math_task(seed, difficulty, weights):
        if len(out) == n:
            break
        out.append(record)
    if len(out) < n:
        raise DataError(f"n: only {len(out)} distinct math problems exist at difficulty {difficulty!r}")
    return out
