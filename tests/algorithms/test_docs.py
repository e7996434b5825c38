"""The examples in docs/algorithms.md run and print exactly the output shown there."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
# A ```python block followed by "Output:" and a ```text block.
EXAMPLE = re.compile(r"```python\n(.*?)```\s*\nOutput:\s*\n```text\n(.*?)```", re.DOTALL)


def _examples() -> list[tuple[str, str]]:
    return EXAMPLE.findall(DOC.read_text()) if DOC.exists() else []


def test_the_doc_has_examples() -> None:
    assert len(_examples()) >= 2


@pytest.mark.parametrize(("code", "output"), _examples())
def test_doc_example_output(code: str, output: str) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, str(DOC), "exec"), {"__name__": "__doc_example__"})
    assert buf.getvalue() == output
