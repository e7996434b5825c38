"""The Makefile lets a user choose where torch comes from (TORCH_INDEX_URL); the default is unchanged."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _torch_line(tmp_path: Path, *assignments: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # -n: print the commands only; -B: as if .venv were out of date; VENV: a path that does not exist.
    proc = subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}", *assignments], cwd=ROOT,
                          capture_output=True, text=True, check=True, timeout=60)
    return next(line for line in proc.stdout.splitlines() if "pip install" in line and "torch==" in line)


def test_default_torch_install_is_the_pinned_version_from_pips_configuration(tmp_path: Path) -> None:
    line = _torch_line(tmp_path)
    assert "torch==2.13.0" in line and "--index-url" not in line


def test_torch_index_url_chooses_the_wheel_index(tmp_path: Path) -> None:
    url = "https://download.pytorch.org/whl/cpu"
    line = _torch_line(tmp_path, f"TORCH_INDEX_URL={url}")
    assert line.rstrip().endswith(f"torch==2.13.0 --index-url {url}")


def test_the_variable_is_documented_in_the_readme() -> None:
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in (ROOT / "README.md").read_text()
