"""The math-verify judgement, and a worker process that serves it over a pipe.

math-verify bounds its own time with `signal.alarm`, which only works in the main thread, and a
pathological answer (`9^{9^{9^9}}`) can spend minutes inside one C call holding the GIL, so no
thread can interrupt it. The trainer therefore judges in separate processes it can kill; this
module is the body of such a process. Run as a script (`python math_worker.py`, with a clean
environment: sympy's expression parser evaluates text, so the worker holds no secrets), it reads
one JSON request per line on stdin (`{"gold": str, "pred": str}`) and answers one JSON line per
request on the stdout it started with (`{"ok": bool, "correct": bool, "detail": str}`); anything
the libraries print goes to stderr. It imports only math-verify, never the rest of scalerl.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import resource
import sys
from typing import Any


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its alarm timeout is off; the caller bounds time itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def wrap_gold(gold: str) -> str:
    """Gold answers are plain strings ("42", "\\frac{1}{2}"): math-verify needs LaTeX delimiters."""
    if "$" in gold or "\\boxed" in gold or "\\(" in gold or "\\[" in gold:
        return gold
    return f"${gold}$"


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    from math_verify import parse

    return tuple(parse(wrap_gold(gold), parsing_timeout=None))


def judge(gold: str, pred: str) -> tuple[bool, str]:
    """Whether `pred` (the content of the model's last box) equals `gold` per math-verify.

    Both are parsed with timeouts disabled (`parsing_timeout=None`, `timeout_seconds=None`) so the
    call works from any thread; the caller must bound its time. The prediction is parsed as LaTeX
    only: math-verify's plain-expression path goes through sympy's `parse_expr`, which `eval`s its
    input (`\\boxed{(lambda: 1)()}` would "equal" 1). Returns (correct, detail). Raises
    ValueError when the gold answer itself does not parse (a data error, not a wrong answer).
    """
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r} does not parse with math-verify")
    pred_parsed = parse(f"\\boxed{{{pred}}}", extraction_config=[LatexExtractionConfig()],
                        parsing_timeout=None)
    if not pred_parsed:
        return False, "prediction does not parse"
    correct = bool(verify(list(gold_parsed), pred_parsed, timeout_seconds=None))
    return correct, "equivalent" if correct else "not equivalent"


def _serve(requests: Any, replies: Any) -> None:
    for line in requests:
        try:
            req = json.loads(line)
            correct, detail = judge(str(req["gold"]), str(req["pred"]))
            reply: dict[str, Any] = {"ok": True, "correct": correct, "detail": detail}
        except Exception as exc:  # any failure is reported per request, the worker lives on
            reply = {"ok": False, "correct": False, "detail": f"{type(exc).__name__}: {exc}"[:500]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memory-mb", type=int, default=0, help="address-space limit (0: none)")
    args = parser.parse_args(argv)
    if args.memory_mb > 0:
        limit = args.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import math_verify  # noqa: F401  (import before announcing readiness: it takes a second)

    _parse_gold("1")
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    _serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
