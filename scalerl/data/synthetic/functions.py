"""The synthetic code task: write a tiny Python function (or stdin/stdout program) from its formula.

Short enough for the embedded char-level model (prompts under 40 characters, gold completions
under 45 tokens) and checked by running tests in the sandbox (`scalerl.rewards.code_reward`).
Difficulty is the shape of the program:

    level 1  Write f(x) returning x+7              (assert tests)
    level 2  Write f(x) returning 3*x-12           (assert tests)
    level 3  Write f(x,y) returning 4*x+9*y        (assert tests)
    level 4  Read n, print 5*n+3                   (stdin/stdout tests)
    level 5  Write f(x) returning 2*x*x-13*x+40    (assert tests)

Gold completion, in the fenced form the tiny tokenizer has single tokens for:

    ```python
    def f(x):
        return 3*x-12
    ```
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.data.synthetic.draws import level_range, level_weights, unique_draws

N_TESTS = 4
TEST_INPUTS = range(-9, 10)


def _signed(value: int, first: bool = False) -> str:
    """A coefficient as it is written in the formula: "+7", "-7", or "7" when it leads."""
    if first:
        return str(value)
    return f"+{value}" if value >= 0 else str(value)


@dataclass(frozen=True)
class _Shape:
    """One level: the coefficient ranges, the formula text, and how to evaluate it."""

    ranges: tuple[tuple[int, int], ...]  # (low, count) per coefficient; sign chosen separately
    signed: tuple[bool, ...]  # which coefficients may be negative
    formula: Callable[[Sequence[int]], str]
    value: Callable[[Sequence[int], Sequence[int]], int]
    arity: int
    stdio: bool = False

    @property
    def size(self) -> int:
        return int(np.prod([count * (2 if s else 1) for (_, count), s in zip(self.ranges, self.signed,
                                                                             strict=True)]))

    def decode(self, index: int) -> list[int]:
        coeffs = []
        for (low, count), signed in zip(self.ranges, self.signed, strict=True):
            index, offset = divmod(index, count)
            value = low + offset
            if signed:
                index, negative = divmod(index, 2)
                value = -value if negative else value
            coeffs.append(value)
        return coeffs


_SHAPES: tuple[_Shape, ...] = (
    _Shape(((1, 999),), (True,), lambda c: f"x{_signed(c[0])}", lambda c, v: v[0] + c[0], 1),
    _Shape(((2, 98), (1, 999)), (False, True), lambda c: f"{c[0]}*x{_signed(c[1])}",
           lambda c, v: c[0] * v[0] + c[1], 1),
    _Shape(((2, 98), (2, 98)), (False, True), lambda c: f"{c[0]}*x{_signed(c[1])}*y",
           lambda c, v: c[0] * v[0] + c[1] * v[1], 2),
    _Shape(((2, 98), (1, 999)), (False, True), lambda c: f"{c[0]}*n{_signed(c[1])}",
           lambda c, v: c[0] * v[0] + c[1], 1, stdio=True),
    _Shape(((2, 8), (2, 98), (1, 99)), (False, True, True),
           lambda c: f"{c[0]}*x*x{_signed(c[1])}*x{_signed(c[2])}",
           lambda c, v: c[0] * v[0] * v[0] + c[1] * v[0] + c[2], 1),
)
CODE_LEVELS: int = len(_SHAPES)
DEFAULT_CODE_DIFFICULTY: tuple[int, int] = (1, CODE_LEVELS)


def level_size(level: int) -> int:
    return _SHAPES[level - 1].size


def _program(shape: _Shape, formula: str) -> tuple[str, str]:
    """(prompt, gold completion) for a formula."""
    if shape.stdio:
        body = f"n=int(input())\nprint({formula})\n"
        return f"Read n, print {formula}", f"```python\n{body}```"
    args = "x" if shape.arity == 1 else "x,y"
    body = f"def f({args}):\n    return {formula}\n"
    return f"Write f({args}) returning {formula}", f"```python\n{body}```"


def _tests(shape: _Shape, coeffs: Sequence[int], rng: np.random.Generator) -> list[dict[str, Any]]:
    # Distinct inputs: with N_TESTS >= 3 points no other formula of the same shape passes them all.
    base = len(TEST_INPUTS)
    picks = rng.choice(base**shape.arity, size=N_TESTS, replace=False).tolist()
    tests: list[dict[str, Any]] = []
    for pick in picks:
        args = [TEST_INPUTS[(pick // base**i) % base] for i in range(shape.arity)]
        result = shape.value(coeffs, args)
        if shape.stdio:
            tests.append({"stdin": f"{args[0]}\n", "stdout": f"{result}\n"})
        else:
            call = ", ".join(str(a) for a in args)
            tests.append({"assert": f"assert f({call}) == {result}"})
    return tests


def code_record(level: int, coeffs: Sequence[int], rng: np.random.Generator) -> PromptRecord:
    """One code prompt of `level` with these coefficients; test inputs are drawn from `rng`."""
    shape = _SHAPES[level - 1]
    formula = shape.formula(coeffs)
    prompt, solution = _program(shape, formula)
    return PromptRecord(
        id=f"code-{level}-{formula}",
        task="code",
        prompt=prompt,
        tests=_tests(shape, coeffs, rng),
        metadata={"solution": solution, "difficulty": level},
    )


def iter_code_task(
    seed: int,
    difficulty: int | tuple[int, int] = DEFAULT_CODE_DIFFICULTY,
    weights: Sequence[float] | None = None,
) -> Iterator[PromptRecord]:
    """Distinct code prompts in a seeded order, levels mixed by `weights` (uniform by default)."""
    levels = level_range(difficulty, CODE_LEVELS, "code")
    probs = level_weights(levels, weights, "code")
    rng = np.random.default_rng([seed, 0x636F6465])
    for pos, index in unique_draws(rng, [level_size(lv) for lv in levels], probs):
        level = levels[pos]
        yield code_record(level, _SHAPES[level - 1].decode(index), rng)


def make_code_task(
    n: int,
    seed: int = 0,
    difficulty: int | tuple[int, int] = DEFAULT_CODE_DIFFICULTY,
    weights: Sequence[float] | None = None,
) -> list[PromptRecord]:
    """`n` distinct code prompts (`task="code"`), the first `n` of `iter_code_task(seed, ...)`.

    Each record has `tests` (asserts, or stdin/stdout for level 4), `metadata["solution"]` (the gold
    completion) and `["difficulty"]`.
    """
    if n < 0:
        raise DataError(f"n: must be >= 0, got {n}")
    out: list[PromptRecord] = []
    for record in iter_code_task(seed, difficulty, weights):
        if len(out) == n:
            break
        out.append(record)
    if len(out) < n:
        raise DataError(f"n: only {len(out)} distinct code problems exist at difficulty {difficulty!r}")
    return out
