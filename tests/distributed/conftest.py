"""One Ray instance per test module (`ray_cluster` fixture); every test module here is marked
`distributed`.

Ray is an optional dependency (the `distributed` extra): without it these modules are skipped, so
`make test` stays lean; `make test-distributed` installs it and runs them. Workers get tests/ and
tests/distributed on PYTHONPATH so they can unpickle test-only engine factories defined there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# The Ray tests reuse other suites' helpers (`pipeline.fakes`, `training.conftest`, ...).
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[object]:
    ray = pytest.importorskip("ray")
    path = os.pathsep.join([str(ROOT / "tests"), str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path.rstrip(os.pathsep), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()
