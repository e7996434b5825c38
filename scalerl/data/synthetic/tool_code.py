r"""The built-in agentic code task: the `code` task's programs, where the model may run its candidate
in the Python interpreter tool before it answers.

Prompts, tests and the verifier are the `code` task's (`functions.py`: `Write f(x) returning 3*x-12`,
judged by running its tests in the sandbox). Each record also carries the trace of a policy that
tries its program on one test input first (`metadata["tool_trace"]`, read by `scalerl.agentic.sft`):

    <tool_call>{"name": "python", "arguments": {"code": "def f(x):\n    return 3*x-12\nf(4)"}}</tool_call>
    [environment: the tool response 0]
    ```python
    def f(x):
        return 3*x-12
    ```

The probe is the test's call as a last expression (the interpreter prints its value, REPL-style);
for the stdin/stdout level the program runs with `n` set to the test's input. `result` is the
test's expected output, which is what the sandboxed interpreter prints for the gold program
(`tests/agentic/test_tool_code.py` runs every level through it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from scalerl.data.records import PromptRecord
from scalerl.data.synthetic.functions import DEFAULT_CODE_DIFFICULTY, make_code_task

_ASSERT = re.compile(r"assert (f\(.*\)) == (-?\d+)$")
_FENCE = re.compile(r"```python\n(.*)```", re.DOTALL)


def tool_trace_of(record: PromptRecord) -> dict[str, object]:
    """The interpreter call that tries the gold program on the record's first test, and its output."""
    match = _FENCE.fullmatch(str(record.metadata["solution"]))
    if match is None:
        raise ValueError(f"{record.id}: solution is not one fenced python block")
    program = match.group(1)
    test = record.tests[0]
    if "assert" in test:
        parsed = _ASSERT.fullmatch(test["assert"])
        if parsed is None:
            raise ValueError(f"{record.id}: unexpected test {test['assert']!r}")
        code, result = f"{program}{parsed.group(1)}", parsed.group(2)
    else:
        code = program.replace("int(input())", test["stdin"].strip())
        result = test["stdout"].strip()
    return {"name": "python", "arguments": {"code": code}, "result": result}


def make_tool_code_task(
    n: int, seed: int = 0, difficulty: int | tuple[int, int] = DEFAULT_CODE_DIFFICULTY,
    weights: Sequence[float] | None = None,
) -> list[PromptRecord]:
    """`make_code_task(...)` records, each with its `metadata["tool_trace"]`."""
    out = []
    for record in make_code_task(n, seed, difficulty, weights):
        record.metadata["tool_trace"] = tool_trace_of(record)
        out.append(record)
    return out
