"""Benchmark sets read in their published layouts (scalerl/data/benchmarks.py).

The fixture rows are real rows of each set (GSM8K test 0, MATH-500 test 0, AIME 2024 I #2,
HumanEval/0, MBPP 11), written with the published column names in JSONL or Parquet. The gold
answers are then scored by our verifiers against the sets' own reference solutions: the loaded
record is what a run trains or evaluates on, so the reference must earn reward 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalerl.data import DataError, load_prompts
from scalerl.data.benchmarks import integer_answer, last_boxed

GSM8K = {
    "question": "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
                "muffins for her friends every day with four. She sells the remainder at the farmers' "
                "market daily for $2 per fresh duck egg. How much in dollars does she make every day at "
                "the farmers' market?",
    "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 "
              "every day at the farmer’s market.\n#### 18",
}
MATH500 = {
    "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your "
               "answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
    "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ... Therefore, the polar coordinates are "
                "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
    "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
    "subject": "Precalculus",
    "level": 2,
    "unique_id": "test/precalculus/807.json",
}
MATH = {  # hendrycks MATH: no answer column, the box in the solution is the answer
    "problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?",
    "level": "Level 1",
    "type": "Prealgebra",
    "solution": "The sum is $\\frac{3}{6}+\\frac{2}{6}=\\boxed{\\frac{5}{6}}$.",
}
AIME = {"ID": "2024-I-2", "Problem": "There exist real numbers $x$ and $y$, both greater than 1, such "
        "that $\\log_x\\left(y^x\\right)=\\log_y\\left(x^{4y}\\right)=10$. Find $xy$.",
        "Solution": "... so $xy = \\boxed{025}$.", "Answer": 25}
AMC = {"id": 0, "problem": "What is the value of $9901 \\cdot 101 - 99 \\cdot 10101$?", "answer": 2.0,
       "url": "https://artofproblemsolving.com/wiki/index.php/2022_AMC_10A_Problems/Problem_1"}
HUMANEVAL = {
    "task_id": "HumanEval/0",
    "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float)"
              " -> bool:\n    \"\"\" Check if in given list of numbers, are any two numbers closer to each "
              "other than\n    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    "
              "False\n    \"\"\"\n",
    "canonical_solution": "    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in "
                          "enumerate(numbers):\n            if idx != idx2:\n                distance = "
                          "abs(elem - elem2)\n                if distance < threshold:\n                    "
                          "return True\n\n    return False\n",
    "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n"
            "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
            "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
            "    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n",
    "entry_point": "has_close_elements",
}
MBPP = {
    "task_id": 11,
    "text": "Write a python function to remove first and last occurrence of a given character from the "
            "string.",
    "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n"
            "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n"
            "    for i in range(len(s) - 1,-1,-1):  \r\n        if (s[i] == ch): \r\n"
            "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n"
            "    return s ",
    "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\"",
                  "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"",
                  "assert remove_Occ(\"PHP\",\"P\") == \"H\""],
    "test_setup_code": "",
    "challenge_test_list": [],
}


def _jsonl(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_gsm8k_answer_after_hashes(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "test.jsonl", GSM8K, {**GSM8K, "answer": "2 * 500 = 1,000\n#### 1,000"})
    a, b = load_prompts(path, format="gsm8k").records
    assert (a.task, a.prompt, a.answer) == ("math", GSM8K["question"], "18")
    assert b.answer == "1000"  # commas dropped, as grade-school-math's extract_answer does
    assert a.metadata == {"benchmark": "gsm8k", "solution": GSM8K["answer"]}
    assert a.id == "test:1" and a.source == f"{path}:1"


def test_math500_parquet_and_math_boxed_solution(tmp_path: Path) -> None:
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist([MATH500]), path)
    (rec,) = load_prompts(path, format="math").records
    assert rec.answer == MATH500["answer"] and rec.id == "test/precalculus/807.json"
    assert rec.metadata["subject"] == "Precalculus" and rec.metadata["solution"] == MATH500["solution"]
    (hendrycks,) = load_prompts(_jsonl(tmp_path / "m.jsonl", MATH), format="math").records
    assert hendrycks.answer == "\\frac{5}{6}" and hendrycks.metadata["type"] == "Prealgebra"


def test_aime_and_amc_integer_answers(tmp_path: Path) -> None:
    (aime,) = load_prompts(_jsonl(tmp_path / "aime.jsonl", AIME), format="aime").records
    assert (aime.id, aime.answer, aime.task) == ("2024-I-2", "25", "math")
    (amc,) = load_prompts(_jsonl(tmp_path / "amc.jsonl", AMC), format="amc").records
    assert amc.answer == "2" and amc.metadata["url"].startswith("https://")
    assert [integer_answer(v) for v in ("033", 33.0, "\\boxed{7}", 2.5, "1/2", True)] == [33, 33, 7, None,
                                                                                         None, None]


def test_humaneval_and_mbpp_tests(tmp_path: Path) -> None:
    (he,) = load_prompts(_jsonl(tmp_path / "he.jsonl", HUMANEVAL), format="humaneval").records
    assert he.task == "code" and he.id == "HumanEval/0"
    assert HUMANEVAL["prompt"].rstrip() in he.prompt and "```python" in he.prompt
    assert he.tests == [{"assert": HUMANEVAL["test"] + "\n\ncheck(has_close_elements)\n"}]
    (mb,) = load_prompts(_jsonl(tmp_path / "mbpp.jsonl", MBPP), format="mbpp").records
    assert mb.id == "mbpp/11" and mb.prompt.endswith(MBPP["test_list"][-1])
    assert "Your code should pass these tests:" in mb.prompt
    assert mb.tests == [{"assert": t} for t in MBPP["test_list"]]
    sanitized = {"task_id": 2, "prompt": "Write a function.", "test_imports": ["import math"],
                 "test_list": ["assert math.isclose(f(), 1.0)"]}
    (sn,) = load_prompts(_jsonl(tmp_path / "s.jsonl", sanitized), format="mbpp").records
    assert sn.tests == [{"assert": "import math\nassert math.isclose(f(), 1.0)"}]


def test_reference_solutions_pass_their_tests(tmp_path: Path) -> None:
    from scalerl.rewards.code_verifier import code_reward

    (he,) = load_prompts(_jsonl(tmp_path / "he.jsonl", HUMANEVAL), format="humaneval").records
    solution = HUMANEVAL["prompt"] + HUMANEVAL["canonical_solution"]
    assert code_reward(f"```python\n{solution}```", he.tests) == 1.0
    assert code_reward("```python\ndef has_close_elements(n, t):\n    return False\n```", he.tests) == 0.0
    (mb,) = load_prompts(_jsonl(tmp_path / "mbpp.jsonl", MBPP), format="mbpp").records
    assert code_reward(f"```python\n{MBPP['code']}\n```", mb.tests) == 1.0


def test_reference_answers_score_one(tmp_path: Path) -> None:
    from scalerl.rewards.math_verifier import math_reward

    (gsm,) = load_prompts(_jsonl(tmp_path / "g.jsonl", GSM8K), format="gsm8k").records
    (m5,) = load_prompts(_jsonl(tmp_path / "m.jsonl", MATH500), format="math").records
    assert math_reward("\\boxed{18}", gsm.answer) == 1.0
    assert math_reward(f"so \\boxed{{{last_boxed(MATH500['solution'])}}}", m5.answer) == 1.0


def test_bad_fields_name_file_line_and_field(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", GSM8K, {"question": "q", "answer": "no hashes"},
                  {"answer": "#### 1"})
    with pytest.raises(DataError) as err:
        load_prompts(path, format="gsm8k")
    msg = str(err.value)
    assert f"{path}:2: field 'answer': no '#### <answer>' line" in msg
    assert f"{path}:3: format gsm8k: no 'question' field" in msg
    with pytest.raises(DataError, match=r"aime\.jsonl:1: field 'Answer': AIME answers are 0\.\.999"):
        load_prompts(_jsonl(tmp_path / "aime.jsonl", {**AIME, "Answer": 1234}), format="aime")
    with pytest.raises(DataError, match=r"field 'answer': amc answers are integers, got 2\.5"):
        load_prompts(_jsonl(tmp_path / "amc.jsonl", {**AMC, "answer": 2.5}), format="amc")
    with pytest.raises(DataError, match=r"he\.jsonl:1: format humaneval: no 'entry_point' field"):
        no_entry = {k: v for k, v in HUMANEVAL.items() if k != "entry_point"}
        load_prompts(_jsonl(tmp_path / "he.jsonl", no_entry), format="humaneval")
    with pytest.raises(DataError, match=r"field 'test_list': expected a non-empty list of strings"):
        load_prompts(_jsonl(tmp_path / "mb.jsonl", {**MBPP, "test_list": []}), format="mbpp")
    with pytest.raises(DataError, match=r"no \\boxed\{\.\.\.\} answer and no 'answer' field"):
        load_prompts(_jsonl(tmp_path / "m.jsonl", {**MATH, "solution": "no box"}), format="math")
    with pytest.raises(DataError, match="field_map: format 'gsm8k' reads the benchmark's own columns"):
        load_prompts(path, format="gsm8k", field_map={"prompt": "question"})
    # Skipping drops and counts the bad rows instead.
    res = load_prompts(path, format="gsm8k", on_error="skip")
    assert len(res.records) == 1 and res.rejects.total == 2
