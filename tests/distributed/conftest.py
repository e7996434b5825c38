"""One Ray instance per test module (`ray_cluster` fixture); every test module here is marked
`distributed`.

Ray is an optional dependency (the `distributed` extra): without it these modules are skipped, so
`make test` stays lean; `make test-distributed` installs it and runs them. Workers get the repo root
on PYTHONPATH so they can unpickle test-only engine factories defined under `tests/`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[object]:
    ray = pytest.importorskip("ray")
    path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {"PYTHONPATH": path,
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()
