"""The recipes of the GRPO family's other members train through `scalerl train --recipe` on a tiny
warm-started model; the critic (ppo_orz) works in every pipeline mode and resumes from a checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from scalerl.assembly.warm_start import warm_start_default
from scalerl.cli import main
from scalerl.telemetry import read_rows
from scalerl.training.sft import SFTConfig

from .test_kill_resume import tiny_run_config

NEW_RECIPES = ["rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo_orz", "kimi_k15", "deepseek_v32"]


def digit_share(completion: str, record: object) -> float:
    """A dense reward the barely trained tiny model can climb in a few steps: the share of digits
    among the completion's characters (its char tokenizer has ~10 digits among ~108 tokens)."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


# Imported by the verifier registry under the name pytest gives this module (tests/ on sys.path).
DENSE = [f"rewards.verifiers.math={__name__}:digit_share", "rewards.partial_credit=true",
         "rewards.incorrect_reward=0.0"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scalerl.config import RunConfig

    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
            "max_position_embeddings": 256}
    base = RunConfig.model_validate({"model": {"tiny": tiny}, "data": {"synthetic": {"num_prompts": 60}}})
    return warm_start_default(base, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path_factory.mktemp("c"))


def _config(tiny_model: Path, run_dir: Path, steps: int) -> Path:
    """A tiny run that leaves the algorithm, the pipeline mode and the length control to the recipe."""
    data = tiny_run_config(str(tiny_model), run_dir).model_dump(mode="json", exclude_defaults=True)
    data["max_steps"] = steps
    data.pop("name", None)
    data["pipeline"] = {"prompts_per_step": 2}
    data["generation"].pop("length_control")
    data["eval"] = {"every": 100, "k": 1, "at_start": False}
    # A barely trained model solves nothing: a negative reward for a wrong answer gives the critic
    # returns to learn (0 everywhere would leave its values, and its loss, at exactly 0).
    data["rewards"] = {**data.get("rewards", {}), "incorrect_reward": -0.5}
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in read_rows(run_dir / "metrics.jsonl") if r["kind"] == "step"]


@pytest.mark.parametrize("recipe", NEW_RECIPES)
def test_each_new_recipe_trains(recipe: str, tiny_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / recipe
    assert main(["train", "--recipe", recipe, "-c", str(_config(tiny_model, run_dir, 3)),
                 "pipeline.k=2"]) == 0
    rows = _steps(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert any(r["version"] > 0 for r in rows), "no optimizer step was taken"
    assert all(math.isfinite(r["loss"]) or r["skipped_no_signal"] for r in rows)
    if recipe == "ppo_orz":
        assert all(math.isfinite(r["value_loss"]) and "value_explained_variance" in r for r in rows)


@pytest.mark.parametrize("recipe", NEW_RECIPES)
def test_each_new_recipe_learns(recipe: str, tiny_model: Path, tmp_path: Path) -> None:
    """Each recipe, as written (its loss, baseline, pipeline mode, sampling; two-step rounds for the
    off-policy ones), raises a dense reward: the last three steps' mean reward clears the first
    three's by a margin the step-to-step noise of an untrained policy does not reach."""
    run_dir = tmp_path / recipe
    assert main(["train", "--recipe", recipe, "-c", str(_config(tiny_model, run_dir, 16)), "pipeline.k=2",
                 "pipeline.prompts_per_step=4", "generation.n=8", "generation.max_new_tokens=16",
                 "optim.lr=1e-2", "optim.warmup_steps=0", *DENSE]) == 0
    rewards = [r["reward_mean"] for r in _steps(run_dir)]
    assert len(rewards) == 16
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1 and last > 1.5 * first, [round(x, 3) for x in rewards]


@pytest.mark.parametrize(
    "mode", [["pipeline.off_policy=ppo_offpolicy", "pipeline.k=2"],
             ["pipeline.off_policy=pipeline", "pipeline.k=2", "pipeline.schedule=interleaved"],
             ["pipeline.off_policy=pipeline", "pipeline.k=2", "pipeline.schedule=threaded"]],
    ids=["ppo_offpolicy", "pipeline-interleaved", "pipeline-threaded"],
)
def test_the_critic_works_in_every_pipeline_mode(mode: list[str], tiny_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "orz"
    assert main(["train", "--recipe", "ppo_orz", "-c", str(_config(tiny_model, run_dir, 3)), *mode]) == 0
    rows = _steps(run_dir)
    assert len(rows) == 3 and all(math.isfinite(r["value_loss"]) for r in rows)
    assert rows[0]["value_loss"] > 0 and rows[-1]["value_mean"] != 0.0
    assert rows[-1]["critic_bad_steps_total"] == 0.0


def test_a_critic_run_resumes_where_it_stopped(tiny_model: Path, tmp_path: Path) -> None:
    """Sync rounds, a checkpoint at step 2, then `--resume` to step 4: the resumed half matches an
    uninterrupted run row for row (the critic's weights, optimizer and schedule are restored)."""
    whole = tmp_path / "whole"
    assert main(["train", "--recipe", "ppo_orz", "-c", str(_config(tiny_model, whole, 4)),
                 "checkpoint.every=2"]) == 0
    halves = tmp_path / "halves"
    config = _config(tiny_model, halves, 2)
    assert main(["train", "--recipe", "ppo_orz", "-c", str(config), "checkpoint.every=2"]) == 0
    assert main(["train", "-c", str(config), "max_steps=4", "--resume"]) == 0
    keys = ("loss", "value_loss", "value_mean", "critic_lr", "reward_mean", "grad_norm")
    a, b = _steps(whole), _steps(halves)
    assert a[2]["value_mean"] != 0.0  # the critic has learned something a fresh one would not know
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        for key in keys:
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-8), (ra["step"], key)
    state = json.loads((halves / "checkpoints" / "step_000004" / "state.json").read_text())
    assert state["trainer"]["advantages"]["steps"] == 4
    assert (halves / "checkpoints" / "step_000004" / "critic" / "model.safetensors").is_file()
