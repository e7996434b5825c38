"""`benchmarks/bench_scaleout.py --weight-sync-only` runs (a 1-rank FSDP2 trainer actor, two engine
actors, both transports) and prints a consistent row."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]


def test_weight_sync_table_runs() -> None:
    pytest.importorskip("ray")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_scaleout.py"), "--weight-sync-only", "--quick",
           "--weight-sync-sizes", "1M"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    number = r"(\d+\.\d+)"
    m = re.search(rf"^\s+1M\s+([\d,]+)\s+{number}\s+{number}\s+{number}\s+{number} x\s*{number}$",
                  proc.stdout, re.M)
    assert m is not None, proc.stdout
    params, mb = int(m[1].replace(",", "")), float(m[2])
    assert 700_000 < params < 900_000 and mb == pytest.approx(params * 4 / 2**20, abs=0.06)
    gather, store, gloo, ratio = (float(m[i]) for i in (3, 4, 5, 6))
    # The streamed collective sync gathers inside its own time: the ratio is (gather + store) / streamed.
    assert min(gather, store, gloo) > 0 and ratio == pytest.approx((gather + store) / gloo, rel=0.1, abs=0.02)
