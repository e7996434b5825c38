"""The layer contract (pyproject.toml, docs/architecture.md) covers the whole package and bites.

`make test` runs `lint-imports` on the tree. These tests check the contract itself: every top-level
package and module of `scalerl` sits in a layer (a new package cannot dodge it), and an upward
import added to a copy of the package makes `lint-imports` fail, naming the import.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [m.strip() for layer in contract["layers"] for m in layer.split("|")]


def test_every_top_level_package_and_module_has_a_layer() -> None:
    tops = {p.stem if p.is_file() else p.name for p in (ROOT / "scalerl").iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    named = {m.removeprefix("scalerl.") for m in layers()}
    assert tops - named == set(), f"top-level parts of scalerl in no layer: {sorted(tops - named)}"
    assert named - tops == set(), f"layers naming no part of scalerl: {sorted(named - tops)}"


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache", "--config", str(tree / "pyproject.toml")], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e '.[dev]')")
def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "scalerl", tree / "scalerl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    clean = _lint(tree)
    assert clean.returncode == 0, clean.stdout[-2000:] + clean.stderr[-2000:]
    # One import inside a function, from the pure math up to the composition root.
    kl = tree / "scalerl" / "algorithms" / "kl.py"
    kl.write_text(kl.read_text() + "\n\ndef _upward() -> None:\n    import scalerl.assembly.build  # noqa\n")
    broken = _lint(tree)
    assert broken.returncode != 0
    assert "scalerl.algorithms is not allowed to import scalerl.assembly" in broken.stdout
    assert "scalerl.algorithms.kl -> scalerl.assembly.build" in broken.stdout
