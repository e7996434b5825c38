"""`benchmarks/bench_engine.py` with its vLLM column, for both models, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

ROOT = Path(__file__).resolve().parents[2]
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def test_bench_engine_has_a_vllm_column_for_both_models(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "SCALERL_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_engine.py"), "--quick",
                           "--models", "tiny,20m"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    blocks = re.split(r"^model: ", proc.stdout, flags=re.MULTILINE)[1:]
    assert [b.split()[0] for b in blocks] == ["tiny", "20m"]
    assert "18.9M parameters" in blocks[1]
    for block in blocks:
        tps = {name: float(m[1]) for name in ("HF generate\\(\\)", "EmbeddedEngine", "VLLMEngine")
               if (m := re.search(rf"^{name}:\s+\d+ tokens\s+{NUM} s\s+({NUM}) tok/s", block, re.MULTILINE))}
        assert len(tps) == 3 and all(v > 0 for v in tps.values())
        vllm_ratio = float(re.search(rf"^throughput ratio \(vllm / generate\): ({NUM})x", block, re.M)[1])
        vs_engine = float(re.search(rf"^throughput ratio \(vllm / engine\): ({NUM})x", block, re.M)[1])
        assert vllm_ratio == pytest.approx(tps["VLLMEngine"] / tps["HF generate\\(\\)"], rel=0.02, abs=0.01)
        assert vs_engine == pytest.approx(tps["VLLMEngine"] / tps["EmbeddedEngine"], rel=0.02, abs=0.01)


def test_bench_prefix_cache_quick(tmp_path: Path) -> None:
    """The prefix-cache benchmark as a user runs it: both sides build the same tokens, only the
    cached side reads prompt tokens from the cache, and the printed ratio is the seconds' ratio."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_prefix_cache.py"), "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {m[1]: (int(m[2]), int(m[3]), float(m[4])) for m in re.finditer(
        rf"^(no prefix cache|prefix cache)\s+(\d+)\s+(\d+)\s+({NUM})$", proc.stdout, re.MULTILINE)}
    assert set(rows) == {"no prefix cache", "prefix cache"}
    plain_prompt, plain_hit, plain_s = rows["no prefix cache"]
    prompt, hit, cached_s = rows["prefix cache"]
    assert plain_prompt == prompt and plain_hit == 0 and 0.3 * prompt < hit < prompt
    m = re.search(rf"speed-up \(no cache / cache\): x({NUM}); prefill tokens saved (\d+)%; same tokens: True",
                  proc.stdout)
    assert m is not None
    # the speed-up agrees with the printed seconds within their rounding (0.005 s each, 0.005 on it)
    assert (plain_s - 0.005) / (cached_s + 0.005) - 0.005 <= float(m[1]) \
        <= (plain_s + 0.005) / max(cached_s - 0.005, 1e-9) + 0.005
    assert int(m[2]) == round(100 * hit / prompt)
