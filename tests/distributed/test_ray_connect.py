"""`scalerl train distributed.backend=ray` with `distributed.address` unset joins the cluster that
is already running, as `ray job submit` users expect: the head started by `ray start --head` on this
machine, or the one `RAY_ADDRESS` names. Ray refuses resource arguments when it attaches ("num_cpus
and num_gpus must not be provided"), so starting a local instance there would fail."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline.test_kill_resume import tiny_run_config

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig, config_to_yaml
from scalerl.telemetry import read_rows
from scalerl.training.sft import SFTConfig

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head() -> Iterator[tuple[str, Path]]:
    """A head started the way users start one (`ray start --head`), stopped afterwards."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=4", "--num-gpus=0",
                    "--include-dashboard=false", "--disable-usage-stats"],
                   check=True, timeout=180, env=env, capture_output=True)
    session = Path("/tmp/ray/session_latest").resolve()
    try:
        from ray._private.services import canonicalize_bootstrap_address

        address = canonicalize_bootstrap_address(None)
        assert address and address.endswith(f":{port}"), address
        yield address, session / "logs"
    finally:
        _stop_head(session, port)


def _stop_head(session: Path, port: int) -> None:
    """Stop this head's processes only (`ray stop` would stop every Ray instance on the machine)
    and forget it as the machine's current cluster."""
    import signal

    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(session) in cmdline or ("--gcs-address=" in cmdline and f":{port}" in cmdline):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
    current = Path("/tmp/ray/ray_current_cluster")
    with contextlib.suppress(OSError):
        if current.read_text().strip().endswith(f":{port}"):
            current.unlink()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = RunConfig.model_validate({"model": {"tiny": TINY}, "data": {"synthetic": {"num_prompts": 60}}})
    cache = tmp_path_factory.mktemp("c")
    return str(warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=cache))


def _train(model: str, run_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cfg = tiny_run_config(model, run_dir).model_dump(mode="json")
    cfg["max_steps"] = 2
    cfg["distributed"] = {"backend": "ray", "num_engines": 1, "trainer_world_size": 1,  # no address
                          "engine_num_cpus": 0.5, "trainer_num_cpus": 0.5, "startup_timeout_s": 240}
    config = run_dir.parent / f"{run_dir.name}.yaml"
    config.write_text(config_to_yaml(RunConfig.model_validate(cfg)))
    cmd = [sys.executable, "-m", "scalerl.cli", "train", "--recipe", "base", "-c", str(config)]
    return subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("how", ["ray start --head", "RAY_ADDRESS"])
def test_train_joins_the_running_cluster(how: str, ray_head: tuple[str, Path], model_path: str,
                                        tmp_path: Path) -> None:
    address, logs = ray_head
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if how == "RAY_ADDRESS":
        # A driver handed the address joins a token-authenticated cluster (Ray 2.60's default for
        # `ray start --head`) with RAY_AUTH_MODE=token, as any Ray driver must.
        env.update(RAY_ADDRESS=address, RAY_AUTH_MODE="token")
    run_dir = tmp_path / "run"
    drivers = _driver_logs(logs)
    done = _train(model_path, run_dir, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_rows(run_dir / "metrics.jsonl", "step")] == [1, 2]
    # It ran on that cluster: the head's session logged one more driver (a local instance of its
    # own would have written its logs into a session of its own).
    assert len(_driver_logs(logs)) > len(drivers)


def _driver_logs(logs: Path) -> list[Path]:
    """The driver logs in the head's session folder."""
    return sorted(logs.glob("python-core-driver-*"))
