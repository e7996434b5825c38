"""Shared by the reliability tests: a tiny warm-started model, run configs, `scalerl train` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scalerl.config import RunConfig, config_to_yaml
from scalerl.telemetry import read_rows

HERE = Path(__file__).resolve().parent
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 256}
# Wall-clock figures differ between two runs of the same seed; everything else in a row must not.
CLOCK_KEYS = ("_s", "_s_total", "_per_s", "device_hours", "wall_hours", "busy_frac", "idle_frac")


def run_config(model: str, out: Path, mode: str, schedule: str = "threaded", **extra: Any) -> RunConfig:
    """A run of tiny steps: 2 prompts x 2 samples of 24 tokens, 4 held-out prompts, the parity verifier."""
    tree: dict[str, Any] = {
        "max_steps": 24,
        "output_dir": str(out),
        "model": {"name_or_path": model},
        "data": {"synthetic": {"num_prompts": 80, "difficulty": [1, 3]}, "heldout_size": 4},
        "generation": {"n": 2, "max_new_tokens": 24, "max_batch_size": 8, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": mode, "k": 2, "prompts_per_step": 2, "schedule": schedule},
        "eval": {"every": 4, "k": 1},
        "checkpoint": {"every": 3, "keep": 3},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1, "verifiers": {"math": "parity_verifier:parity"}},
    }
    for key, value in extra.items():
        node = tree
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return RunConfig.model_validate(tree)


def write_config(cfg: RunConfig, path: Path) -> Path:
    path.write_text(config_to_yaml(cfg))
    return path


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE), "WANDB_MODE": "offline",
            "WANDB_SILENT": "true"}


def launch(config: Path, *extra: str, stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "scalerl.cli", "train", "--recipe", "base", "-c", str(config), *extra]
    return subprocess.Popen(cmd, env=env(), stdout=stdout, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[bytes], timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")


def last_step(run_dir: Path) -> int:
    rows = read_rows(run_dir / "metrics.jsonl", "step")
    return rows[-1]["step"] if rows else 0


def wait_for_step(proc: subprocess.Popen[bytes], run_dir: Path, step: int, timeout: float = 240) -> None:
    """Until this session (not a killed one before it) has logged step `step`."""
    metrics = run_dir / "metrics.jsonl"
    before = metrics.stat().st_ino if metrics.exists() else None
    deadline = time.monotonic() + timeout
    # The session rewrites the log at start (cut back to its checkpoint): a new inode.
    while not (metrics.exists() and metrics.stat().st_ino != before and last_step(run_dir) >= step):
        if proc.poll() is not None:
            raise AssertionError(f"train exited ({proc.returncode}) before step {step}: "
                                 + proc.stderr.read().decode(errors="replace")[-3000:])
        if time.monotonic() > deadline:
            raise AssertionError(f"no step {step} within {timeout} s")
        time.sleep(0.01)


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    return read_rows(run_dir / "metrics.jsonl", "step")


def eval_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_rows(run_dir / "metrics.jsonl", "eval")]


def deterministic(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.endswith(CLOCK_KEYS)}


def sessions(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "sessions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def final_weights(run_dir: Path, step: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model.safetensors"))
