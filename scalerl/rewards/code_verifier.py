"""Code answers: the last fenced block after the thinking, run against tests in the sandbox.

A test is `{"stdin": str, "stdout": str}` (the program runs as a script on that input; outputs
are compared after normalisation: CRLF to LF, trailing spaces of each line and blank lines at
both ends dropped) or `{"assert": str}` (a Python statement run after the program's code, in
its namespace, with `__name__ == "solution"` so a `__main__` block does not run). Each test is a
separate sandboxed run, so one crash or hang fails only that test.

An assert test passes only if the harness, after the statement, echoes a random token that it
read from stdin before running the program: `sys.exit(0)`, printing "OK" or killing the harness
does not fake a pass. It does not stop a program that inspects the harness's own stack frame
or returns objects whose `__eq__` always says True; stdin/stdout tests are immune to both.
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from scalerl.rewards.answer import extract_code
from scalerl.rewards.sandbox import Sandbox, SandboxResult, default_sandbox

Status = Literal["ok", "error", "timeout", "no_answer"]

_SOLUTION = "solution.py"
_HARNESS = "harness.py"
_CHECK = "check.py"
_HARNESS_SOURCE = '''\
import os
import sys


def _run():
    token = sys.stdin.readline().strip()
    with open("solution.py", encoding="utf-8") as fh:
        solution = compile(fh.read(), "solution.py", "exec")
    with open("check.py", encoding="utf-8") as fh:
        check = compile(fh.read(), "<test>", "exec")
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    exec(solution, namespace)
    exec(check, namespace)
    sys.stdout.flush()
    os.write(1, ("\\n" + token + "\\n").encode())


_run()
'''


@dataclass(frozen=True)
class TestOutcome:
    """One test's run: `reason` is "ok", "wrong_answer", or the sandbox's account of a failure."""

    passed: bool
    reason: str
    tree_bounded: bool = True  # the run's whole tree was under a cgroup's memory/task bound


@dataclass(frozen=True)
class CodeResult:
    """All tests of one completion; `status` is "ok" whenever the tests could be run."""

    passed: int
    total: int
    status: Status
    detail: str
    tests: tuple[TestOutcome, ...] = ()

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def validate_tests(tests: Any, where: str = "tests") -> list[dict[str, str]]:
    """Check the test list's shape; ValueError names the bad entry (`tests[3]: ...`)."""
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"{where}: expected a non-empty list of test dicts, got {type(tests).__name__}")
    for i, test in enumerate(tests):
        if not isinstance(test, dict):
            raise ValueError(f"{where}[{i}]: expected a dict, got {type(test).__name__}")
        keys = set(test)
        if "assert" in keys:
            if keys & {"stdin", "stdout"}:
                raise ValueError(f"{where}[{i}]: give either 'assert' or 'stdin'/'stdout', not both")
            fields = ("assert",)
        elif "stdout" in keys:
            fields = ("stdin", "stdout") if "stdin" in keys else ("stdout",)
        else:
            raise ValueError(f"{where}[{i}]: needs an 'assert' or a 'stdout' key, has {sorted(keys)}")
        for name in fields:
            if not isinstance(test[name], str):
                raise ValueError(f"{where}[{i}].{name}: expected a string, got {type(test[name]).__name__}")
    return tests


def normalize_output(text: str) -> str:
    """Output as compared: LF line ends, no trailing spaces per line, no blank lines at the ends."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


class CodeVerifier:
    """Runs each test of a completion's program in `sandbox` (see module doc)."""

    def __init__(self, sandbox: Sandbox | None = None, timeout_s: float = 10.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
        self._sandbox = sandbox
        self.timeout_s = timeout_s

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox if self._sandbox is not None else default_sandbox()

    def run_test(self, program: str, test: dict[str, str], timeout_s: float) -> TestOutcome:
        """One sandboxed run of `program` against one validated test."""
        if "assert" in test:
            token = secrets.token_hex(16)
            files = {_SOLUTION: program, _HARNESS: _HARNESS_SOURCE, _CHECK: test["assert"]}
            result = self.sandbox.run_python(files, _HARNESS, stdin=token + "\n", wall_s=timeout_s)
            stdout = result.stdout.decode(errors="replace").rstrip("\n")
            return self._judge(result, stdout.rsplit("\n", 1)[-1] == token)
        result = self.sandbox.run_python({_SOLUTION: program}, _SOLUTION, stdin=test.get("stdin", ""),
                                         wall_s=timeout_s)
        got = normalize_output(result.stdout.decode(errors="replace"))
        return self._judge(result, got == normalize_output(test["stdout"]))

    @staticmethod
    def _judge(result: SandboxResult, output_matches: bool) -> TestOutcome:
        if not result.ok:
            return TestOutcome(False, result.reason, result.cgroup)
        return TestOutcome(output_matches, "ok" if output_matches else "wrong_answer", result.cgroup)

    def check(self, completion: str, tests: list[dict[str, str]],
              timeout_s: float | None = None) -> CodeResult:
        """Run every test; ValueError for a malformed test list, otherwise never raises."""
        validate_tests(tests)
        program = extract_code(completion)
        if program is None:
            return CodeResult(0, len(tests), "no_answer", "no fenced code block after the thinking")
        outcomes = []
        for test in tests:
            try:
                outcomes.append(self.run_test(program, test, timeout_s or self.timeout_s))
            except Exception as exc:  # the sandbox itself is broken: not the program's fault
                return CodeResult(0, len(tests), "error", f"sandbox: {type(exc).__name__}: {exc}")
        if any(o.reason == "sandbox_error" for o in outcomes):
            return CodeResult(0, len(tests), "error", "sandbox failed on some tests", tuple(outcomes))
        passed = sum(o.passed for o in outcomes)
        reasons = Counter(o.reason for o in outcomes if not o.passed)
        detail = f"{passed}/{len(tests)} passed" + "".join(f"; {n} {r}" for r, n in sorted(reasons.items()))
        unbounded = sum(not o.tree_bounded for o in outcomes)
        if unbounded:
            detail += f"; {unbounded} run(s) without a tree-wide memory/task bound (no cgroup)"
        return CodeResult(passed, len(tests), "ok", detail, tuple(outcomes))


def code_reward(completion: str, tests: list[dict[str, str]], timeout_s: float = 10.0) -> float:
    """Fraction of `tests` the last code block after `</think>` passes (0.0 without one).

    `timeout_s` bounds each test's run (wall clock and CPU). Programs run in the process-wide
    sandbox (`sandbox.configure_sandbox` sets its limits and parallelism). Malformed `tests`
    raise ValueError naming the entry.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion: expected str, got {type(completion).__name__}")
    return CodeVerifier(timeout_s=timeout_s).check(completion, tests).fraction
