"""A TRL-style reward function trains a short `scalerl train` run: its per-step mean is in every
step row as `reward_fn/<name>`; a bad `fn` path is exit 2 naming `rewards.functions.0.fn`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scalerl.cli import main
from tests.pipeline.test_kill_resume import tiny_run_config
from tests.tiny_runs import warm_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_tiny_model(tmp_path_factory)


def _config(tiny_model: Path, tmp_path: Path, functions: list[dict]) -> Path:
    cfg = tiny_run_config(str(tiny_model), tmp_path / "run")
    cfg.max_steps = 3
    raw = cfg.model_dump(mode="json")
    raw["rewards"]["functions"] = functions
    raw["checkpoint"] = {"every": 0}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_trl_style_function_trains_a_short_run(tiny_model: Path, tmp_path: Path) -> None:
    fn_file = tmp_path / "my_rewards.py"
    # Reward by length (a TRL-style function: prompts, completions, **columns -> list[float]).
    fn_file.write_text("def length_reward(prompts, completions, answer, **kwargs):\n"
                       "    assert len(answer) == len(completions)\n"
                       "    return [min(len(c), 40) / 40 for c in completions]\n")
    config = _config(tiny_model, tmp_path, [{"fn": f"{fn_file}:length_reward", "weight": 2.0}])
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_fn/length_reward" in r]
    assert len(steps) == 3
    for row in steps:
        mean = row["reward_fn/length_reward"]
        assert 0.0 <= mean <= 1.0 and row["reward_fn/length_reward/math"] == mean
        assert row["reward_fn_errors_total/length_reward"] == 0
        # Every training sample is scored by the one function: reward = 2.0 * its score (the
        # held-out samples scored at steps 0 and 3 are not in the function's step mean).
        assert row["reward_mean"] == pytest.approx(2.0 * mean)


def test_samples_show_each_functions_score(tiny_model: Path, tmp_path: Path) -> None:
    """`logging.samples_every` rows carry `reward_fn`: each function's unweighted score of that
    sample's own text, which the row's reward is the weighted sum of (checked by recomputing both
    functions here on the logged response)."""
    fn_file = tmp_path / "two_rewards.py"
    fn_file.write_text("def length_reward(prompts, completions, **kwargs):\n"
                       "    return [min(len(c), 40) / 40 for c in completions]\n"
                       "def has_digit(prompts, completions, **kwargs):\n"
                       "    return [float(any(ch.isdigit() for ch in c)) for c in completions]\n")
    config = _config(tiny_model, tmp_path, [{"fn": f"{fn_file}:length_reward", "weight": 2.0},
                                            {"fn": f"{fn_file}:has_digit", "weight": 0.5}])
    raw = yaml.safe_load(config.read_text())
    raw["logging"].update(samples_every=1, samples_per_step=4)
    config.write_text(yaml.safe_dump(raw))
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 0
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 4
    for row in samples:
        text = row["response"]
        length, digit = min(len(text), 40) / 40, float(any(ch.isdigit() for ch in text))
        assert row["reward_fn"] == pytest.approx({"length_reward": length, "has_digit": digit})
        assert row["reward"] == pytest.approx(2.0 * length + 0.5 * digit)


def test_bad_fn_path_exits_2_naming_the_key(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tiny_model, tmp_path, [{"fn": "no_such_pkg.rewards:f"}])
    assert main(["train", "--recipe", "base", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert "rewards.functions.0.fn" in err and "no_such_pkg" in err
    assert not (tmp_path / "run").exists()
