"""Answer extraction: thinking stripped, last balanced \\boxed{}, last code fence."""

from __future__ import annotations

import pytest

from scalerl.rewards.answer import extract_boxed, extract_code, extract_final_answer, strip_thinking


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>try 3</think>The answer is 4", "The answer is 4"),
        ("I reason without tags", "I reason without tags"),
        ("<think>still thinking \\boxed{3}", None),  # unclosed thinking: no answer at all
        ("reasoning</think>final", "final"),  # <think> was part of the prompt template
        ("<think>a</think>mid<think>b</think>end", "end"),
    ],
)
def test_strip_thinking(completion: str, expected: str | None) -> None:
    assert strip_thinking(completion) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}} done", "\\frac{\\sqrt{2}}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("spaced \\boxed {x+1}", "x+1"),
        ("\\fbox{7}", "7"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not group delimiters
        ("\\boxed{3} and a broken \\boxed{4", "3"),
        ("no box here", None),
        ("\\boxed{}", ""),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_final_answer_ignores_boxes_inside_thinking() -> None:
    assert extract_final_answer("<think>maybe \\boxed{1}</think>It is \\boxed{2}") == "2"
    assert extract_final_answer("<think>maybe \\boxed{1}</think>no box after") is None
    assert extract_final_answer("<think>\\boxed{1} never closed") is None


def test_extract_code_takes_last_fence_after_thinking() -> None:
    completion = (
        "<think>```python\nprint('draft')\n```</think>\n"
        "First:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\n"
    )
    assert extract_code(completion) == "print(2)\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```python\nprint(3)```") == "print(3)"  # closing fence glued to the code
    assert extract_code("<think>```python\nprint(1)\n```") is None
    assert extract_code("no code") is None
    assert extract_code("```python\n\n```") is None
