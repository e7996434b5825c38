"""Trajectories on the real vLLM engine: multi-token stop sequences (`</tool_call>` in a char-level
vocabulary) end a turn, and a `TrajectoryEngine` over vLLM (each turn re-submitted with the whole
context) builds the same trajectories as over the embedded engine (one held sequence continued
through its KV cache), greedy, same float32 weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

import torch
from transformers import AutoModelForCausalLM
from vllm_helpers import vllm_device

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.environment import StepResult
from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.config import AgenticConfig
from scalerl.data.records import PromptRecord
from scalerl.models.tiny import build_tiny_tokenizer
from scalerl.rollout import GenerationRequest, SamplingParams
from scalerl.rollout.embedded import EmbeddedEngine
from scalerl.rollout.vllm_engine import VLLMEngine

EOS = 1
TOK = build_tiny_tokenizer()


@pytest.fixture(scope="module")
def engine(tiny_dirs: tuple[Path, Path]) -> Iterator[VLLMEngine]:
    eng = VLLMEngine(str(tiny_dirs[0]), fp32_lm_head=True, seed=0, max_batch_size=8, max_model_len=512,
                     eos_token_ids=(EOS,))
    yield eng
    eng.close()


def test_a_stop_sequence_ends_a_sample_and_leaves_the_others_running(engine: VLLMEngine) -> None:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    (free,) = engine.generate([GenerationRequest("g", [10, 11, 12], greedy)])
    stop = tuple(free.token_ids[3:5])
    end = next(i + 2 for i in range(len(free.token_ids) - 1) if tuple(free.token_ids[i:i + 2]) == stop)
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_sequences=(stop,))
    c, other = engine.generate([GenerationRequest("s", [10, 11, 12], params),
                                GenerationRequest("o", [10, 11, 12], greedy)])
    assert c.finish_reason == "stop" and c.token_ids == free.token_ids[:end]
    assert other.token_ids == free.token_ids and other.finish_reason == "length"
    assert engine.num_unfinished() == 0


class Observer:
    """Answers every turn with an observation; the episode ends after three of them."""

    tool_schemas: list[dict[str, Any]] = []  # noqa: RUF012

    def reset(self, task: PromptRecord) -> list[dict[str, Any]]:
        self.turns = 0
        return task.chat()

    def step(self, action: str) -> StepResult:
        self.turns += 1
        return StepResult([{"role": "tool", "name": "t", "content": f"seen {len(action)}"}],
                          done=self.turns >= 3, tool_calls=1)

    def score(self) -> None:
        return None

    def close(self) -> None:
        pass


def trajectories(inner: Any) -> list[Any]:
    engine = TrajectoryEngine(inner, Observer, ChatFormat(TOK),
                              lambda ids: str(TOK.decode(ids, skip_special_tokens=True)),
                              AgenticConfig(max_turns=4, max_total_tokens=200, max_observation_tokens=16))
    # Turns end on any of a third of the vocabulary, so most episodes have several turns.
    params = SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=tuple(range(40, len(TOK), 3)))
    records = [PromptRecord(id=f"p{i}", task="math", prompt=f"Compute {i}{i}+{7 * i}", answer="0")
               for i in range(1, 5)]
    try:
        out = engine.generate([GenerationRequest(f"r{i}", [0], params, {"record": r})
                               for i, r in enumerate(records)])
    finally:
        engine.close()
    return sorted(out, key=lambda c: c.request_id)


def test_vllm_and_embedded_build_the_same_trajectories(engine: VLLMEngine,
                                                       tiny_dirs: tuple[Path, Path]) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[0], dtype=torch.float32).to(vllm_device()).eval()
    embedded = EmbeddedEngine(model, max_batch_size=8, fp32_lm_head=True, eos_token_ids=(EOS,))
    a, b = trajectories(engine), trajectories(embedded)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.loss_mask for c in a] == [c.loss_mask for c in b]
    assert [c.metadata["agentic"]["segments"] for c in a] == [c.metadata["agentic"]["segments"] for c in b]
    assert max(c.metadata["agentic"]["turns"] for c in a) >= 2  # continuation was exercised
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


@pytest.mark.parametrize("mode", ["sync", "pipeline"])
def test_scalerl_train_runs_trajectories_on_vllm(tmp_path: Path, mode: str) -> None:
    import json

    from vllm_helpers import save_tiny

    from scalerl.cli import main

    model = save_tiny(tmp_path / "model", seed=0, std=0.02)
    out = tmp_path / "run"
    assert main([
        "train", "--model", str(model), "--output-dir", str(out), "--max-steps", "2", "--off-policy", mode,
        "--max-lag", "1", "--device", vllm_device(), "generation.engine=vllm", "logging.progress=false",
        "generation.length_control.kind=none", "generation.n=2", "generation.max_new_tokens=24",
        "generation.max_batch_size=8", "pipeline.prompts_per_step=2", "data.heldout_size=2", "eval.k=2",
        "eval.every=2", "data.synthetic.task=tool_math", "data.synthetic.num_prompts=20",
        "agentic.environment=tools", "agentic.max_turns=2", "agentic.max_total_tokens=48",
        "generation.vllm.block_size=32",
    ]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["agentic_turns_mean"] >= 1 and r["agentic_gen_time_s"] > 0 for r in steps)
    # The engine's prefix-cache figures reach the step rows (cumulative, so they never fall).
    hits = [r["vllm_cached_prompt_tokens"] for r in steps]
    assert hits == sorted(hits) and steps[-1]["vllm_prompt_tokens"] > 0
    assert any("val_agentic_turns_mean" in r for r in rows if r["kind"] == "eval")
