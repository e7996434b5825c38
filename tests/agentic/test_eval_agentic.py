"""`scalerl eval` on an agentic run: the run's checkpoint is evaluated on trajectories (the same
environment, tools and limits as in training), so it reproduces the run's last logged evaluation,
agentic figures included (a single-turn evaluation has none)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scalerl.assembly.run import train_run
from scalerl.assembly.warm_start import warm_start_default
from scalerl.cli import eval as eval_cli
from scalerl.config import load_config
from scalerl.training.sft import SFTConfig

AGENTIC = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.max_position_embeddings=512",
    "data.synthetic.task=tool_math", "data.synthetic.num_prompts=40", "data.heldout_size=4",
    "generation.n=2", "generation.max_new_tokens=40", "generation.max_batch_size=8",
    "generation.length_control.kind=none", "pipeline.prompts_per_step=2", "pipeline.off_policy=sync",
    "eval.every=1", "eval.k=2", "logging.progress=false", "rewards.max_workers=1", "max_steps=1", "seed=3",
    "agentic.environment=tools", "agentic.max_turns=2", "agentic.max_total_tokens=80",
    "agentic.sft_tool_fraction=1.0",
]


def test_eval_of_an_agentic_run_reproduces_its_last_evaluation(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(overrides=AGENTIC)
    model = warm_start_default(cfg, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path / "sft")
    out = tmp_path / "run"
    cfg = load_config(overrides=[*AGENTIC, f"model.name_or_path={model}", f"output_dir={out}"])
    assert train_run(cfg, out, device="cpu") == 0
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in logged if r["kind"] == "eval"][-1]

    parser = argparse.ArgumentParser(prog="scalerl")
    eval_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", str(out), "--json", "--device", "cpu"])
    assert args.func(args) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    assert m["agentic_turns_mean"] == pytest.approx(last["val_agentic_turns_mean"])
    assert m["agentic_tool_calls_mean"] == pytest.approx(last["val_agentic_tool_calls_mean"])
    assert m["agentic_env_time_s"] >= 0 and "agentic_end_answer" in m
    for key in ("pass_rate", "reward_mean", "response_length"):
        assert m[key] == pytest.approx(last[f"val_{key}"]), key
