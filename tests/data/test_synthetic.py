from __future__ import annotations

import contextlib
import io
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scalerl.data import load_prompts, make_code_task, make_math_task, make_synthetic, write_synthetic_jsonl
from scalerl.data.synthetic import MATH_LEVELS, addition_trace
from scalerl.data.synthetic.arithmetic import level_size
from scalerl.data.synthetic.functions import CODE_LEVELS
from scalerl.models.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tiny_tokenizer()


def test_math_is_deterministic_prefix_stable_and_distinct() -> None:
    a = make_math_task(500, seed=4)
    assert a == make_math_task(500, seed=4)
    assert make_math_task(50, seed=4) == a[:50]
    assert [r.id for r in make_math_task(50, seed=5)] != [r.id for r in a[:50]]
    assert len({r.id for r in a}) == len({r.prompt for r in a}) == 500
    assert all(r.task == "math" and r.id == "math-" + r.prompt.removeprefix("Compute ") for r in a)


def test_math_answers_and_traces_are_right() -> None:
    for r in make_math_task(2000, seed=0):
        operands = [int(x) for x in r.prompt.removeprefix("Compute ").split("+")]
        assert r.answer == str(sum(operands)) == str(sum(r.metadata["operands"]))
        assert sorted(len(str(x)) for x in operands) == sorted(MATH_LEVELS[r.metadata["difficulty"] - 1])
        sol = r.metadata["solution"]
        m = re.fullmatch(r"<think>(.*)</think>\\boxed\{(\d+)\}", sol)
        assert m and m.group(2) == r.answer
        # Every step's arithmetic holds and its carry feeds the next step.
        carry = None
        for step in m.group(1).split(";"):
            lhs, rhs = step.split("=")
            total, partial = rhs.split(">")
            terms = [int(t) for t in lhs.split("+")]
            assert sum(terms) == int(total)
            if carry is not None:
                assert terms[-1] == carry
            carry = int(total) // 10
        assert partial == r.answer


def test_trace_example_and_padding() -> None:
    assert addition_trace([57, 68]) == "<think>7+8=15>5;5+6+1=12>125</think>\\boxed{125}"
    assert addition_trace([5, 37]) == "<think>5+7=12>2;0+3+1=4>42</think>\\boxed{42}"
    with pytest.raises(ValueError, match="operands"):
        addition_trace([5])


def test_math_difficulty_and_weights() -> None:
    only3 = make_math_task(300, seed=1, difficulty=3)
    assert {r.metadata["difficulty"] for r in only3} == {3}
    mixed = make_math_task(4000, seed=1, difficulty=(4, 6), weights=[1, 0, 3])
    counts = Counter(r.metadata["difficulty"] for r in mixed)
    assert set(counts) == {4, 6}
    assert 2.6 < counts[6] / counts[4] < 3.4
    # Level 1 has 100 problems: they are used up, then the draw moves to the open levels.
    small = make_math_task(300, seed=2, difficulty=(1, 2))
    assert Counter(r.metadata["difficulty"] for r in small)[1] == level_size(1) == 100
    with pytest.raises(ValueError, match="only 100 distinct"):
        make_math_task(101, seed=0, difficulty=1)
    with pytest.raises(ValueError, match="difficulty"):
        make_math_task(1, difficulty=(0, 3))
    with pytest.raises(ValueError, match="weights"):
        make_math_task(1, difficulty=(1, 3), weights=[1, 1])


def test_math_fits_the_tiny_model(tok: Any) -> None:
    for r in make_math_task(800, seed=3):
        assert len(r.prompt) <= 20
        assert len(tok.encode(r.metadata["solution"])) <= 58
        assert tok.decode(tok.encode(r.metadata["solution"])) == r.metadata["solution"]
        assert tok.unk_token_id not in tok.encode(r.prompt + r.metadata["solution"])


def _run_gold(solution: str, tests: list[dict[str, str]]) -> bool:
    """Trusted in-process check of generated gold programs (the sandboxed check is below)."""
    code = solution.removeprefix("```python\n").removesuffix("```")
    for test in tests:
        if "assert" in test:
            namespace: dict[str, Any] = {}
            exec(code, namespace)
            exec(test["assert"], namespace)
        else:
            out, line = io.StringIO(), test["stdin"].strip()
            with contextlib.redirect_stdout(out):
                exec(code, {"input": lambda line=line: line})
            if out.getvalue() != test["stdout"]:
                return False
    return True


def test_code_task_shape_and_gold_programs(tok: Any) -> None:
    recs = make_code_task(600, seed=0)
    assert recs == make_code_task(600, seed=0) and make_code_task(10, seed=0) == recs[:10]
    assert len({r.id for r in recs}) == len({r.prompt for r in recs}) == 600
    assert {r.metadata["difficulty"] for r in recs} == set(range(1, CODE_LEVELS + 1))
    for r in recs:
        assert r.task == "code" and r.answer is None and len(r.tests) == 4
        assert len(r.prompt) < 40 and len(tok.encode(r.metadata["solution"])) <= 45
        assert len({tuple(t.items()) for t in r.tests}) == 4
        assert _run_gold(r.metadata["solution"], r.tests), r.prompt
    stdio = [r for r in recs if r.metadata["difficulty"] == 4]
    assert stdio and all(set(t) == {"stdin", "stdout"} for r in stdio for t in r.tests)


def test_gold_solutions_score_one_with_the_verifiers() -> None:
    from scalerl import rewards
    for level in range(1, len(MATH_LEVELS) + 1):
        r = make_math_task(1, seed=level, difficulty=level)[0]
        assert rewards.math_reward(r.metadata["solution"], r.answer) == 1.0
        wrong = r.metadata["solution"].replace("\\boxed{" + r.answer, "\\boxed{" + str(int(r.answer) + 1))
        assert rewards.math_reward(wrong, r.answer) == 0.0
    # Each sandboxed test run costs ~0.3 s on a loaded CPU: two per program shape here, while
    # test_code_task_shape_and_gold_programs runs every test of 600 programs in-process.
    for level in range(1, CODE_LEVELS + 1):
        r = make_code_task(1, seed=level, difficulty=level)[0]
        assert rewards.code_reward(r.metadata["solution"], r.tests[:2]) == 1.0, r.prompt
    r = make_code_task(1, seed=0, difficulty=4)[0]
    wrong = re.sub(r"([+-])(\d+)\)", lambda m: f"{m.group(1)}{int(m.group(2)) + 1})", r.metadata["solution"])
    assert wrong != r.metadata["solution"]
    assert rewards.code_reward(wrong, r.tests[:1]) == 0.0


def test_make_synthetic_and_jsonl_round_trip(tmp_path: Path) -> None:
    assert make_synthetic("math", 20, seed=3) == make_math_task(20, seed=3)
    assert make_synthetic("code", 5, seed=3, difficulty=2) == make_code_task(5, seed=3, difficulty=2)
    mixed = make_synthetic("math+code", 200, seed=3, difficulty=(1, 4))
    assert mixed[:50] == make_synthetic("math+code", 50, seed=3, difficulty=(1, 4))
    kinds = Counter(r.task for r in mixed)
    assert 70 < kinds["math"] < 130 and kinds["math"] + kinds["code"] == 200
    assert {r.metadata["difficulty"] for r in mixed} == {1, 2, 3, 4}
    assert max(r.metadata["difficulty"] for r in make_synthetic("math+code", 300, 0) if r.task == "code") == 5
    with pytest.raises(ValueError, match="code levels"):
        make_synthetic("math+code", 5, difficulty=(6, 8))
    with pytest.raises(ValueError, match="not enough distinct math problems"):
        make_synthetic("math+code", 400, difficulty=1)
    with pytest.raises(ValueError, match="unknown synthetic task 'poetry'"):
        make_synthetic("poetry", 1)
    for task in ("math", "code"):
        path = write_synthetic_jsonl(tmp_path / f"{task}.jsonl", task, 40, seed=9)
        loaded = load_prompts(path).records
        for got, want in zip(loaded, make_synthetic(task, 40, seed=9), strict=True):
            got.source = ""
            assert got == want


def test_seeds_give_independent_streams() -> None:
    a = {r.id for r in make_math_task(1000, seed=0, difficulty=5)}
    b = {r.id for r in make_math_task(1000, seed=1, difficulty=5)}
    assert len(a & b) < 10  # 810,000 problems: overlap is chance only
    rng_free = np.asarray([r.metadata["operands"][0] for r in make_math_task(1000, seed=0, difficulty=5)])
    assert rng_free.min() >= 100 and rng_free.max() <= 999 and rng_free.std() > 200
