"""The prepared GPU scripts (benchmarks/gpu/*.sh) at least parse and call what exists: every
`vllm_gpu.py COMMAND` a phase runs is a command of the Python script (run without a GPU here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_script_parses(script: str) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    proc = subprocess.run([bash, "-n", str(GPU / script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_phase_command_exists() -> None:
    text = (GPU / "run_vllm_gpu.sh").read_text()
    called = set(re.findall(r"vllm_gpu\.py (\w+)", text))
    assert {"throughput", "mismatch", "colocate", "graphs"} <= called
    proc = subprocess.run([sys.executable, str(GPU / "vllm_gpu.py"), "--help"], capture_output=True,
                          text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    commands = [set(c.split(",")) for c in re.findall(r"\{([\w.,]+)\}", proc.stdout) if "throughput" in c]
    assert commands, proc.stdout
    assert called <= commands[0], (called, commands[0])
