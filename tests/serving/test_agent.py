"""The `agent:` environment kind: an async program's calls through the endpoint become the trajectory."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from scalerl.config import AgenticConfig, ConfigError, RunConfig
from scalerl.data.records import PromptRecord
from scalerl.models.tiny import build_tiny_tokenizer
from scalerl.rollout.protocol import GenerationRequest, SamplingParams
from scalerl.serving.agent import AgentEngine, load_agent
from scalerl.telemetry import read_rows
from tests.agentic.fakes import ScriptedEngine

AGENTS = "tests.serving.agents"


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def run_agent(tok, name: str, replies=lambda ctx: "7", n: int = 2, **settings):
    inner = ScriptedEngine(tok, replies, continuable=False)
    engine = AgentEngine(inner, tok, load_agent(f"{AGENTS}:{name}"), AgenticConfig(**settings))
    record = PromptRecord(id="p0", task="math", prompt="3+4?", answer="7")
    try:
        out = engine.generate([GenerationRequest("r0", [1, 2], SamplingParams(n=n, max_new_tokens=16, seed=1),
                                                 {"record": record})])
    finally:
        engine.close()
    return out, inner


def test_a_two_turn_program_is_one_trajectory_with_its_reward(tok) -> None:
    out, inner = run_agent(tok, "ask_twice")
    assert [c.sample_index for c in out] == [0, 1]
    for c in out:
        info = c.metadata["agentic"]
        assert info["end"] == "answer" and info["env_score"] == 1.0 and info["turns"] == 2
        assert info["windows"] == 1 and info["untrained_tokens"] == 0
        assert [k for k, _, _ in info["segments"]] == ["model", "env", "model"]
        reply = [*tok.encode("7", add_special_tokens=False), tok.eos_token_id]
        (_, a, b), (_, _, d), (_, e, f) = info["segments"]
        assert c.token_ids[a:b] == reply and c.token_ids[e:f] == reply
        assert c.loss_mask == [True] * (b - a) + [False] * (d - b) + [True] * (f - e)
        assert c.prompt_ids == tok.encode(tok.apply_chat_template(
            [{"role": "user", "content": "3+4?"}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False)
        assert info["env_tokens"] == d - b and c.metadata.get("record") is None
    assert len(inner.prompts_seen) == 4  # 2 episodes x 2 calls, each with its whole context


@pytest.mark.parametrize(("name", "kind", "end"), [
    ("raises", "agent_RuntimeError", "env_error"),
    ("not_a_reward", "agent_bad_reward", "env_error"),
    ("no_call", "agent_no_calls", "env_error"),
    ("until_refused", "agent_BadRequestError", "token_budget"),
])
def test_an_agent_that_fails_ends_its_episode_counted(tok, name: str, kind: str, end: str) -> None:
    out, _ = run_agent(tok, name, n=1, max_total_tokens=12)
    info = out[0].metadata["agentic"]
    assert info["end"] == end and info["tool_errors"] == {kind: 1} and info["env_score"] is None
    if name == "no_call":
        assert out[0].token_ids == [tok.eos_token_id] and out[0].loss_mask == [False]
    if name == "until_refused":
        assert len(out[0].token_ids) <= 12 + 4  # the last call's reply may use what was left


def test_an_agent_that_returns_none_leaves_the_reward_to_the_tasks_verifier(tok) -> None:
    out, _ = run_agent(tok, "verifier_decides", replies=lambda ctx: "\\boxed{7}", n=1)
    info = out[0].metadata["agentic"]
    assert info["env_score"] is None and info["answer_text"] == "\\boxed{7}" and info["end"] == "answer"


def test_bad_agent_paths_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"agentic\.environment"):
        load_agent(f"{AGENTS}:missing")
    with pytest.raises(ConfigError, match="not an async function"):
        load_agent(f"{AGENTS}:not_async")


def test_scalerl_train_runs_an_agent_environment(tmp_path: Path) -> None:
    from scalerl.assembly.build import build_training

    cfg = RunConfig.model_validate({
        "max_steps": 2,
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1,
                           "intermediate_size": 64, "max_position_embeddings": 512}},
        "data": {"synthetic": {"num_prompts": 20}, "heldout_size": 2},
        "generation": {"n": 2, "max_new_tokens": 8, "max_batch_size": 8, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": "pipeline", "k": 2, "prompts_per_step": 2},
        "algorithm": {"zero_variance_filter": False},
        "eval": {"every": 2, "k": 1},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1},
        "agentic": {"environment": f"agent:{AGENTS}:ask_twice", "max_total_tokens": 64},
    })
    with build_training(cfg, tmp_path, device="cpu") as run:
        assert isinstance(run.engine, AgentEngine)
        assert run.driver.run().steps == 2
    rows = read_rows(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(steps) == 2 and all(r["agentic_turns_mean"] == 2 for r in steps)
    assert all(r["agentic_end_answer"] == 1.0 for r in steps)
