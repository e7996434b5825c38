"""`build_training` with `agentic.environment` set: every pipeline mode runs trajectories, logs the
agentic figures per step and evaluation, and resumes from a checkpoint (outstanding re-issued)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.assembly.build import build_training
from scalerl.config import RunConfig
from scalerl.telemetry import read_rows


def agentic_config(steps: int, mode: str, schedule: str = "interleaved") -> RunConfig:
    return RunConfig.model_validate({
        "max_steps": steps,
        "model": {"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                           "intermediate_size": 64, "max_position_embeddings": 512}},
        "data": {"synthetic": {"task": "tool_math", "num_prompts": 40}, "heldout_size": 3},
        "generation": {"n": 2, "max_new_tokens": 24, "max_batch_size": 8, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": mode, "k": 2, "prompts_per_step": 2, "schedule": schedule},
        "algorithm": {"zero_variance_filter": False},
        "eval": {"every": 2, "k": 2},
        "checkpoint": {"every": 2},
        "logging": {"progress": False},
        "rewards": {"max_workers": 2},
        "agentic": {"environment": "tools", "tools": ["calculator"], "max_turns": 2, "max_total_tokens": 64},
    })


@pytest.mark.parametrize("mode", ["sync", "ppo_offpolicy", "pipeline"])
def test_every_mode_trains_on_trajectories(tmp_path: Path, mode: str) -> None:
    with build_training(agentic_config(2, mode), tmp_path, device="cpu") as run:
        assert isinstance(run.engine, TrajectoryEngine)
        result = run.driver.run()
        assert result.steps == 2
    rows = read_rows(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if r["kind"] == "step"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert steps and evals
    for r in steps:
        assert r["agentic_turns_mean"] >= 1 and "agentic_env_time_s" in r and "agentic_gen_time_s" in r
        assert sum(r[f"agentic_end_{e}"] for e in ("answer", "turn_limit", "token_budget", "length",
                                                  "context_limit", "env_error")) == pytest.approx(1.0)
    assert all("val_agentic_tool_calls_mean" in r for r in evals)


def test_resume_mid_trajectory_reissues_the_outstanding_prompts(tmp_path: Path) -> None:
    with build_training(agentic_config(2, "pipeline"), tmp_path, device="cpu") as run:
        run.driver.run()
    with build_training(agentic_config(3, "pipeline"), tmp_path, device="cpu",
                        resume=tmp_path / "checkpoints" / "step_000002") as run:
        result = run.driver.run()
        assert result.steps == 3 and result.counters["prompts_reissued"] > 0
