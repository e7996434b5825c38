"""code_reward and CodeVerifier: stdin/stdout and assert tests, hostile programs score 0."""

from __future__ import annotations

import threading
import time

import pytest

from scalerl.rewards import CodeVerifier, Sandbox, SandboxConfig, code_reward, configure_sandbox
from scalerl.rewards.code_verifier import normalize_output, validate_tests


def fenced(program: str, before: str = "") -> str:
    return f"{before}Here is my solution:\n```python\n{program}\n```\n"


DOUBLE = "n = int(input())\nprint(n * 2)"
STDIO_TESTS = [{"stdin": "3\n", "stdout": "6\n"}, {"stdin": "10", "stdout": "20"},
               {"stdin": "0", "stdout": "0"}]
ADD = "def add(a, b):\n    return a + b"


@pytest.fixture(scope="module")
def verifier() -> CodeVerifier:
    return CodeVerifier(Sandbox(SandboxConfig(max_parallel=2, nproc=16, memory_mb=256)), timeout_s=5.0)


def test_stdio_program_passes_all() -> None:
    assert code_reward(fenced(DOUBLE, "<think>easy</think>"), STDIO_TESTS) == 1.0


def test_partial_pass_gives_the_fraction(verifier: CodeVerifier) -> None:
    wrong_for_zero = "n = int(input())\nprint(n * 2 if n else 1)"
    result = verifier.check(fenced(wrong_for_zero), STDIO_TESTS)
    assert (result.passed, result.total, result.status) == (2, 3, "ok")
    assert "1 wrong_answer" in result.detail
    assert code_reward(fenced(wrong_for_zero), STDIO_TESTS) == pytest.approx(2 / 3)


def test_assert_tests(verifier: CodeVerifier) -> None:
    tests = [{"assert": "assert add(1, 2) == 3"}, {"assert": "assert add(-1, 1) == 0"},
             {"assert": "assert add(2, 2) == 5"}]
    result = verifier.check(fenced(ADD), tests)
    assert result.passed == 2
    assert [t.reason for t in result.tests] == ["ok", "ok", "exit_code"]  # AssertionError: exit 1


def test_main_block_does_not_run_under_assert_tests(verifier: CodeVerifier) -> None:
    program = ADD + "\nif __name__ == '__main__':\n    print(add(int(input()), 1))"
    assert verifier.check(fenced(program), [{"assert": "assert add(2, 3) == 5"}]).passed == 1


@pytest.mark.parametrize(
    "cheat",
    [
        "import sys\nsys.exit(0)",  # exit before the assert runs
        "import os\nos._exit(0)",
        "print('OK')\nimport os\nos._exit(0)",
        "import sys\nsys.stdin.read()\nimport os\nos._exit(0)",  # swallow the harness's token
    ],
)
def test_exiting_early_does_not_fake_an_assert_pass(verifier: CodeVerifier, cheat: str) -> None:
    assert verifier.check(fenced(cheat), [{"assert": "assert add(1, 2) == 3"}]).passed == 0


def test_no_code_block_or_unclosed_thinking_is_no_answer(verifier: CodeVerifier) -> None:
    assert verifier.check("print(1)", STDIO_TESTS).status == "no_answer"
    assert verifier.check(fenced(DOUBLE, "<think>draft: "), STDIO_TESTS).status == "no_answer"
    assert code_reward("no code at all", STDIO_TESTS) == 0.0


def test_only_the_code_after_thinking_counts(verifier: CodeVerifier) -> None:
    completion = f"<think>{fenced(DOUBLE)}</think>{fenced('print(0)')}"
    assert verifier.check(completion, STDIO_TESTS).passed == 1  # print(0) is right for input 0 only


@pytest.mark.parametrize(
    ("program", "reason"),
    [
        ("while True:\n    pass", "timeout"),
        ("raise SystemExit(3)", "exit_code"),
        ("x = [0] * (10**10)", "exit_code"),  # MemoryError under the address-space limit
        ("import sys\nwhile True:\n    sys.stdout.write('y' * 100000)", "output_limit"),
    ],
)
def test_hostile_or_broken_programs_score_zero(program: str, reason: str) -> None:
    v = CodeVerifier(Sandbox(SandboxConfig(max_parallel=1, memory_mb=256, max_output_bytes=65536)),
                     timeout_s=1.0)
    result = v.check(fenced(program), [{"stdin": "", "stdout": "ok"}])
    assert result.fraction == 0.0 and result.status == "ok"
    assert result.tests[0].reason == reason


def test_output_normalization() -> None:
    assert normalize_output("1 2  \r\n3\n\n") == "1 2\n3"
    assert normalize_output("\n\nx\n") == "x"
    assert normalize_output(" x") == " x"  # leading spaces of a line still count


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ([], "non-empty list"),
        ("x", "non-empty list"),
        ([{"stdin": "1"}], r"tests\[0\]: needs an 'assert' or a 'stdout'"),
        ([{"stdout": "1"}, {"stdout": 1}], r"tests\[1\]\.stdout: expected a string"),
        ([{"assert": "assert 1", "stdout": "1"}], r"tests\[0\]: give either"),
        ([None], r"tests\[0\]: expected a dict"),
    ],
)
def test_malformed_tests_are_named(tests: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_tests(tests)
    with pytest.raises(ValueError, match=message):
        code_reward(fenced(DOUBLE), tests)  # type: ignore[arg-type]


def test_code_reward_respects_the_configured_parallelism() -> None:
    """8 completions from 8 threads, parallelism 2, each test sleeping 0.5 s: >= 4 rounds."""
    configure_sandbox(max_parallel=2)
    try:
        program = fenced("import time\ntime.sleep(0.5)\nprint('done')")
        rewards: list[float] = []
        start = time.monotonic()
        threads = [threading.Thread(target=lambda: rewards.append(code_reward(program, [{"stdout": "done"}])))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        assert rewards == [1.0] * 8
        assert elapsed >= 4 * 0.5  # never more than 2 at once
    finally:
        configure_sandbox()
