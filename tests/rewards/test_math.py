"""math_reward and MathVerifier: equivalences, wrong/missing answers, threads, hard time bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from scalerl.rewards import MathVerifier, math_reward


@pytest.fixture(scope="module")
def verifier() -> Iterator[MathVerifier]:
    v = MathVerifier(timeout_s=10.0, workers=2)
    yield v
    v.close()


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        ("<think>1/2?</think>The answer is \\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("So \\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("\\boxed{42}", "42"),
        ("\\boxed {1+x^2}", "x^2+1"),
        ("\\fbox{\\{2,1\\}}", "\\{1,2\\}"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ],
)
def test_equivalent_forms_are_correct(completion: str, gold: str) -> None:
    assert math_reward(completion, gold) == 1.0


@pytest.mark.parametrize(
    ("completion", "gold", "status"),
    [
        ("\\boxed{41}", "42", "ok"),
        ("\\boxed{\\sqrt{2}}", "2", "ok"),
        ("The answer is 42.", "42", "no_answer"),  # no box
        ("<think>\\boxed{42} and then I ran out of tokens", "42", "no_answer"),
        ("<think>it is 42</think>", "42", "no_answer"),
        ("<think>\\boxed{42}</think> final: \\boxed{41}", "42", "ok"),  # the thinking never counts
    ],
)
def test_wrong_or_missing_answers(verifier: MathVerifier, completion: str, gold: str, status: str) -> None:
    result = verifier.check(completion, gold)
    assert (result.correct, result.status) == (False, status)
    assert math_reward(completion, gold) == 0.0


def test_answer_after_closing_tag_only_is_read() -> None:
    assert math_reward("so it is 7</think>\\boxed{7}", "7") == 1.0


def test_unparseable_gold_is_an_error_not_a_wrong_answer(verifier: MathVerifier) -> None:
    result = verifier.check("\\boxed{1}", "$ $")  # math-verify extracts nothing from it
    assert result.status == "error" and "does not parse" in result.detail
    assert verifier.check("\\boxed{1}", "").status == "error"


def test_bad_argument_types_raise() -> None:
    with pytest.raises(TypeError, match="answer"):
        math_reward("\\boxed{42}", 42)  # type: ignore[arg-type]


def test_works_from_worker_threads(verifier: MathVerifier) -> None:
    results: dict[int, bool] = {}

    def judge(i: int) -> None:
        results[i] = verifier.check(f"\\boxed{{{i}/2}}", f"\\frac{{{i}}}{{2}}").correct

    threads = [threading.Thread(target=judge, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == dict.fromkeys(range(6), True)


def test_pathological_answer_is_killed_at_the_timeout() -> None:
    # 9^(9^(9^9)) makes sympy compute for minutes while holding the GIL; only a process kill stops it.
    v = MathVerifier(timeout_s=1.0, workers=1)
    try:
        start = time.monotonic()
        result = v.check("\\boxed{9^{9^{9^{9}}}}", "42")
        assert result.status == "timeout"
        assert time.monotonic() - start < 30  # worker start-up (~1 s) plus the 1 s bound
        assert v.restarts == 1
        assert v.check("\\boxed{42}", "42").correct  # a fresh worker took over
    finally:
        v.close()


def test_inline_mode_judges_without_processes() -> None:
    v = MathVerifier(timeout_s=None)
    assert v.check("\\boxed{0.5}", "\\frac{1}{2}").correct
    assert v.check("\\boxed{3}", "\\frac{1}{2}").status == "ok"


@pytest.mark.parametrize(
    "payload",
    ["(lambda: 1)()", "$(lambda: 1)()$", "[1].__len__()", "().__class__.__base__.__subclasses__().__len__()"],
)
def test_model_text_is_never_evaluated_as_python(verifier: MathVerifier, payload: str) -> None:
    # math-verify's plain-expression parser (sympy parse_expr) evals; predictions are LaTeX-only.
    result = verifier.check(f"\\boxed{{{payload}}}", "1")
    assert not result.correct


def test_worker_environment_holds_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    from scalerl.rewards.math_verifier import _worker_env

    monkeypatch.setenv("SCALERL_TEST_SECRET", "sk-123")
    assert "sk-123" not in _worker_env().values()
