"""`ray.init` in a driver replaces Python's C-level SIGTERM handler with Ray's fatal-signal handler
(which aborts: exit -6 and a stack dump), so the handler `scalerl train` installs to stop at the
next step with a checkpoint (exit 143) was never reached on the Ray backend. `cluster.connect`
puts the process's Python handlers back after `ray.init`. Each case runs in a fresh process: Ray
is initialised once per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed (the distributed extra)")
pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
if sys.argv[1] == "connect":
    from scalerl.config import DistributedConfig
    from scalerl.distributed.cluster import connect
    connect(DistributedConfig(backend="ray", num_cpus=1))
else:
    import ray
    ray.init(num_cpus=1, include_dashboard=False)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("handled", got, flush=True)
import ray
ray.shutdown()
"""


def run(mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True,
                          timeout=180)


@pytest.mark.timeout(400)
def test_connect_keeps_the_python_sigterm_handler_that_ray_init_replaces() -> None:
    kept = run("connect")
    assert kept.returncode == 0 and "handled [15]" in kept.stdout, kept.stderr[-2000:]
    bare = run("bare")  # the cause: Ray's handler took SIGTERM, Python's never ran
    assert "handled [15]" not in bare.stdout and "SIGTERM received" in bare.stderr, bare.stderr[-2000:]
