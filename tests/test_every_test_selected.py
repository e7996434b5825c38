"""No orphan tests: every collected test is selected by some make target that `.ci/run` calls.

The tests of `tests/` are collected once, with no marker filter, in a subprocess (collection only),
each with its markers. Each make target `.ci/run` invokes is read from the Makefile: the paths its
pytest command names (Makefile variables expanded; none = pyproject's `testpaths`) and its `-m`
expression (none = the one in pyproject's `addopts`, as pytest applies it). A test is selected when
one such command's paths contain it and its markers satisfy the expression, evaluated by pytest's own
marker-expression parser. A `gpu` test that skips on a machine without a GPU counts as selected:
its target runs it. Modules that cannot be imported here (vLLM's, outside `.venv-vllm`) are not
collected and so not checked.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]

COLLECT = r"""
import json, sys
import pytest

class Record:
    def __init__(self):
        self.items = []
    def pytest_collection_modifyitems(self, items):
        self.items = [[i.nodeid, sorted({m.name for m in i.iter_markers()})] for i in items]

record = Record()
code = pytest.main(["--collect-only", "-q", "-o", "addopts=", "-p", "no:cacheprovider", "tests"],
                   plugins=[record])
json.dump({"code": int(code), "items": record.items}, open(sys.argv[1], "w"))
"""


def ci_targets(ci_script: str) -> list[str]:
    """The make targets a CI script invokes (`make a b`, one command per line)."""
    targets: list[str] = []
    for line in ci_script.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["make"]:
            targets.extend(w for w in words[1:] if not w.startswith("-") and "=" not in w)
    return targets


def makefile_rules(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(variables, target -> recipe lines) of a Makefile; continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    variables: dict[str, str] = {}
    recipes: dict[str, list[str]] = {}
    current: str | None = None
    for line in joined.splitlines():
        if line.startswith("\t"):
            if current is not None:
                recipes[current].append(line.strip())
            continue
        current = None
        assign = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|=)\s*(.*)$", line)
        if assign:
            variables[assign.group(1)] = assign.group(3).strip()
            continue
        rule = re.match(r"^([A-Za-z0-9_.\-$() ]+):(?!=)", line)
        if rule and not line.startswith("."):
            for name in rule.group(1).split():
                recipes.setdefault(name, [])
            current = rule.group(1).split()[0]
    return variables, recipes


def expand(text: str, variables: dict[str, str]) -> str:
    for _ in range(5):
        text = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: variables.get(m.group(1), ""), text)
    return text


def pytest_selections(recipe: list[str], variables: dict[str, str], default_m: str,
                      testpaths: list[str]) -> list[tuple[list[str], str]]:
    """(paths, marker expression) of each pytest command of a target's recipe."""
    out = []
    for line in recipe:
        line = expand(line, variables).replace("$$", "$")
        if "pytest" not in line:
            continue
        words = shlex.split(line)
        args = words[words.index("pytest") + 1:] if "pytest" in words else []
        paths, expr, i = [], default_m, 0
        while i < len(args):
            if args[i] == "-m":
                expr, i = args[i + 1], i + 2
                continue
            if not args[i].startswith("-"):
                paths.append(args[i].rstrip("/"))
            i += 1
        out.append((paths or testpaths, expr))
    return out


def addopts_marker(addopts: str) -> str:
    words = shlex.split(addopts)
    return words[words.index("-m") + 1] if "-m" in words else ""


def selected(nodeid: str, markers: list[str], paths: list[str], expr: str) -> bool:
    path = nodeid.split("::")[0]
    if not any(path == p or path.startswith(p + "/") for p in paths):
        return False
    return not expr or Expression.compile(expr).evaluate(lambda name: name in markers)


def test_the_parsers_read_a_makefile_as_make_does() -> None:
    make = ("VLLM_TESTS := tests/a tests/b.py \\\n    tests/c.py\n.PHONY: x\n"
            "x: setup\n\tOMP=$${OMP:-1} $(PY) -m pytest -q -m distributed tests/d\n"
            "y: setup\n\t$(PY) -m pytest -q $(VLLM_TESTS)\nz:\n\techo hi\n")
    variables, recipes = makefile_rules(make)
    assert pytest_selections(recipes["x"], variables, "not slow", ["tests"]) == [(["tests/d"], "distributed")]
    assert pytest_selections(recipes["y"], variables, "not slow", ["tests"]) == [
        (["tests/a", "tests/b.py", "tests/c.py"], "not slow")]
    assert pytest_selections(recipes["z"], variables, "", ["tests"]) == []
    assert ci_targets("set -e\nmake test  # the suite\n# make ignored\nmake test-x\n") == ["test", "test-x"]
    assert selected("tests/d/t.py::f", ["distributed"], ["tests/d"], "distributed")
    assert not selected("tests/d/t.py::f", [], ["tests/d"], "distributed")
    assert not selected("tests/dd/t.py::f", ["distributed"], ["tests/d"], "distributed")


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, list[str]]]:
    out = tmp_path_factory.mktemp("collect") / "items.json"
    proc = subprocess.run([sys.executable, "-c", COLLECT, str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["code"] == 0, proc.stdout[-3000:]  # a collection error is an orphan too
    return [(nodeid, markers) for nodeid, markers in data["items"]]


def test_every_collected_test_is_run_by_a_ci_target(collected: list[tuple[str, list[str]]]) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    default_m = addopts_marker(pyproject.get("addopts", ""))
    testpaths = list(pyproject.get("testpaths", ["."]))
    variables, recipes = makefile_rules((ROOT / "Makefile").read_text())
    targets = ci_targets((ROOT / ".ci" / "run").read_text())
    assert "test" in targets
    selections = []
    for target in targets:
        assert target in recipes, f".ci/run calls `make {target}`, which the Makefile does not define"
        selections.extend(pytest_selections(recipes[target], variables, default_m, testpaths))
    assert len(collected) > 100
    orphans = [nodeid for nodeid, markers in collected
               if not any(selected(nodeid, markers, paths, expr) for paths, expr in selections)]
    assert not orphans, f"{len(orphans)} tests no CI target runs, e.g. {orphans[:10]}"
