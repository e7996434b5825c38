"""The mutation gate itself (tests/mutation_gate/gate.py): its files stay valid against the tree, a
stale entry fails loudly, a caught mutation passes and a surviving one fails the gate."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.mutation_gate.gate import GATE_DIR, GateFileError, gate, load_mutations, main


def test_every_mutation_file_matches_the_tree():
    """Each `old` snippet occurs exactly once and each listed test exists (a refactor that moves a
    guarded line must update the gate, here in `make test`, not only in `make test-mutations`)."""
    files = sorted(GATE_DIR.glob("mutations_*.yaml"))
    assert files
    mutations = load_mutations(files)
    assert len({m.id for m in mutations}) == len(mutations)


def _fake_repo(root: Path) -> None:
    (root / "scalerl").mkdir()
    (root / "scalerl" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_add.py").write_text(
        "from scalerl import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n")


def _write(root: Path, text: str) -> Path:
    path = root / "mutations_x.yaml"
    path.write_text(text)
    return path


ENTRY = """
- id: {id}
  file: scalerl/__init__.py
  old: '{old}'
  new: '{new}'
  tests: [tests/test_add.py::test_add]
  why: a test of the gate
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (ENTRY.format(id="a", old="return a * b", new="return 0"), "occurs 0 times"),
        (ENTRY.format(id="a", old="a", new="b"), "occurs 3 times"),
        (ENTRY.format(id="a", old="a + b", new="a - b") * 2, "already used"),
        ("- id: a\n  file: scalerl/__init__.py\n", "missing keys"),
        ("- id: a\n  tests: [x[y]]\n", "cannot read"),
        (ENTRY.format(id="a", old="a + b", new="a - b").replace("::test_add", "::test_gone"),
         "no test test_gone"),
    ],
)
def test_a_stale_or_malformed_entry_fails_loudly(tmp_path, text, message):
    _fake_repo(tmp_path)
    with pytest.raises(GateFileError, match=message):
        load_mutations([_write(tmp_path, text)], root=tmp_path)


def test_the_gate_passes_a_caught_mutation_and_fails_a_survivor_and_a_collection_error(tmp_path):
    _fake_repo(tmp_path)
    text = ENTRY.format(id="caught", old="return a + b", new="return a - b") + ENTRY.format(
        id="survives", old="return a + b", new="return b + a"
    )
    text += ENTRY.format(id="breaks-import", old="return a + b", new="return a +")
    text += ENTRY.format(id="breaks-collection", old="import add", new="import gone").replace(
        "file: scalerl/__init__.py", "file: tests/test_add.py")
    mutations = load_mutations([_write(tmp_path, text)], root=tmp_path)
    results = {r.mutation.id: r for r in gate(mutations, budget_s=120, root=tmp_path, log=lambda _: None)}
    # a mutation that stops the tests from being collected is an error of the entry, not a catch
    assert results["breaks-import"].status == "ERROR"
    assert results["breaks-collection"].status == "ERROR"
    assert "ERROR collecting" in results["breaks-collection"].detail
    assert results["caught"].status == "CAUGHT"
    assert results["caught"].caught_by == "tests/test_add.py::test_add"
    assert results["survives"].status == "SURVIVED"
    # the working tree is never written to
    assert (tmp_path / "scalerl" / "__init__.py").read_text() == "def add(a, b):\n    return a + b\n"


def test_a_hanging_mutation_times_out_within_the_budget(tmp_path):
    _fake_repo(tmp_path)
    text = ENTRY.format(id="hangs", old="return a + b", new='return __import__("time").sleep(60) or a + b')
    mutations = load_mutations([_write(tmp_path, text)], root=tmp_path)
    start = time.monotonic()
    (result,) = gate(mutations, budget_s=8, root=tmp_path, log=lambda _: None)
    assert result.status == "TIMEOUT"
    assert time.monotonic() - start < 30


def test_a_malformed_file_exits_2(tmp_path, capsys):
    path = _write(tmp_path, "- id: a\n")
    assert main([str(path)]) == 2
    assert "missing keys" in capsys.readouterr().err
