"""Kill a real `scalerl train` process at a random checkpoint, resume it, and check the run.

The metrics log must continue without a gap or a duplicate (every step row once, in order, and no
evaluation logged twice), and the resumed run must finish at `max_steps` with every prompt the
pool handed out accounted for exactly once (no prompt consumed twice or skipped).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerl.assembly.warm_start import warm_start_default
from scalerl.config import RunConfig, config_to_yaml
from scalerl.telemetry import read_rows
from scalerl.training.sft import SFTConfig

MAX_STEPS = 8


def tiny_run_config(model_path: str, out: Path) -> RunConfig:
    return RunConfig.model_validate(
        {
            "max_steps": MAX_STEPS,
            "output_dir": str(out),
            "model": {"name_or_path": model_path},
            "data": {"synthetic": {"num_prompts": 60, "difficulty": [1, 3]}, "heldout_size": 4},
            "generation": {"n": 2, "max_new_tokens": 24, "max_batch_size": 8,
                           "length_control": {"kind": "none"}},
            "pipeline": {"off_policy": "sync", "prompts_per_step": 2},
            "eval": {"every": 3, "k": 1},
            "checkpoint": {"every": 2, "keep": 10},
            "logging": {"progress": False},
            "rewards": {"max_workers": 1},
        }
    )


def _train(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "scalerl.cli", "train", "--recipe", "base", "-c", str(config), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
@pytest.mark.kill_cycles  # 80 s: in `make test-kill-cycles`, not `make test`
def test_kill_at_a_random_checkpoint_then_resume(tmp_path: Path) -> None:
    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
            "max_position_embeddings": 256}
    base = RunConfig.model_validate({"model": {"tiny": tiny}, "data": {"synthetic": {"num_prompts": 60}}})
    model = warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path / "cache")
    run_dir = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(config_to_yaml(tiny_run_config(str(model), run_dir)))

    kill_at = random.Random().choice([2, 4, 6])
    proc = _train(config)
    target = run_dir / "checkpoints" / f"step_{kill_at:06d}" / "state.json"
    deadline = time.monotonic() + 240
    while not target.exists():
        assert proc.poll() is None, "train exited before the checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    resumed = _train(config, "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()[-3000:]

    rows = read_rows(run_dir / "metrics.jsonl")
    steps = [r["step"] for r in rows if r["kind"] == "step"]
    assert steps == list(range(1, MAX_STEPS + 1)), f"killed after step {kill_at}: step rows {steps}"
    evals = [r["step"] for r in rows if r["kind"] == "eval"]
    assert evals == sorted(set(evals)) and evals[0] == 0 and evals[-1] == MAX_STEPS

    # Sync rounds of 2 prompts and no filters: the 8 steps consumed exactly the pool's first 16
    # prompts in its shuffled order, once each, whichever step the first process died after.
    def pool_state(step: int) -> dict:
        path = run_dir / "checkpoints" / f"step_{step:06d}" / "state.json"
        return json.loads(path.read_text())["extra"]["pipeline"]["generator"]

    final = pool_state(MAX_STEPS)
    assert final["outstanding"] == []
    assert final["source"]["epoch"] == 1 and final["source"]["position"] == 2 * MAX_STEPS  # first epoch
    consumed = final["source"]["order"][: 2 * MAX_STEPS]
    assert len(set(consumed)) == 2 * MAX_STEPS
    assert final["source"]["order"] == pool_state(kill_at)["source"]["order"]
