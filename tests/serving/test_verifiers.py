"""verifiers (v1) environments through the endpoint: single-turn, multi-turn and tool-using
environments written against the library; rewards are the library's own scores of exactly what the
endpoint recorded.
Marker envs (`make test-envs`): each episode runs verifiers' harness program as a uv script."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.envs
vf = pytest.importorskip("verifiers.v1")
pytest.importorskip("openai")

from scalerl.config import AgenticConfig, ConfigError, RunConfig  # noqa: E402
from scalerl.models.tiny import build_tiny_tokenizer  # noqa: E402
from scalerl.rollout.protocol import GenerationRequest, SamplingParams  # noqa: E402
from scalerl.serving.agent import AgentEngine  # noqa: E402
from scalerl.serving.verifiers_env import VerifiersEpisodes, load_verifiers_env, taskset_records  # noqa: E402
from scalerl.telemetry import read_rows  # noqa: E402
from tests.agentic.fakes import ScriptedEngine  # noqa: E402

ENVS = Path(__file__).parent / "vf_envs"  # verifiers imports a taskset id as a top-level module


@pytest.fixture(autouse=True)
def _taskset_path(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ENVS))
    # verifiers starts a task's tool server as `python -m <module>` in a process of its own.
    path = os.pathsep.join(filter(None, [str(ENVS), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def doubling(context: str) -> str:
    """Right on even operands, wrong on odd ones: both rewards occur."""
    a = int(re.findall(r"What is (\d+)\+", context)[-1])
    return f"It is {2 * a if a % 2 == 0 else 2 * a + 1}"


def run(tok, taskset: str, policy, args=None, n: int = 1, max_new_tokens: int = 32):
    spec = load_verifiers_env(taskset, args or {})
    episodes = VerifiersEpisodes(spec)
    inner = ScriptedEngine(tok, policy, continuable=False)
    engine = AgentEngine(inner, tok, None, AgenticConfig(max_total_tokens=200), run_episode=episodes.run,
                         aclose=episodes.aclose)
    records = taskset_records(spec, "math")
    params = SamplingParams(n=n, max_new_tokens=max_new_tokens)
    requests = [GenerationRequest(f"r{i}", [1], params, {"record": r}) for i, r in enumerate(records)]
    try:
        out = engine.generate(requests)
        recent = dict(episodes.recent)
    finally:
        engine.close()
    return spec, records, out, recent


def test_a_single_turn_environment_scores_what_the_endpoint_recorded(tok) -> None:
    _spec, records, out, recent = run(tok, "vftest_single", doubling, {"num_tasks": 3})
    assert [r.prompt for r in records] == ["What is 0+0?", "What is 1+1?", "What is 2+2?"]
    assert len(out) == 3 and len(recent) == 3
    for c, record in zip(out, records, strict=True):
        info = c.metadata["agentic"]
        assert info["end"] == "answer", info
        reply = tok.decode([t for t, m in zip(c.token_ids, c.loss_mask, strict=True) if m],
                           skip_special_tokens=True)
        expected = 1.0 if reply.endswith(record.answer) else 0.0  # the task's reward, by hand
        assert info["env_score"] == expected
        assert info["turns"] == 1 and reply == info["answer_text"]
    # The library judged exactly the text the endpoint returned.
    for episode in recent.values():
        trace = episode.traces[0]
        assert trace.reward == sum(r.value for r in trace.rewards.values())
    assert sorted(c.metadata["agentic"]["env_score"] for c in out) == [0.0, 1.0, 1.0]


def test_a_multi_turn_environment_is_one_trajectory(tok) -> None:
    def policy(context: str) -> str:
        return "Yes, 3" if "Are you sure" in context else "3"

    _, _, out, _recent = run(tok, "vftest_multi", policy)
    scores = [c.metadata["agentic"]["env_score"] for c in out]
    assert scores == [0.5, 1.0]  # task 0 asks 0*3: "Yes, 3" is confirmed, not correct; task 1 both
    for c in out:
        info = c.metadata["agentic"]
        assert info["turns"] == 2 and info["windows"] == 1
        assert [k for k, _, _ in info["segments"]] == ["model", "env", "model"]


def test_a_tool_environment_runs_the_tool_between_two_model_turns(tok) -> None:
    def policy(context: str) -> str:
        if "42" in context.split("17+25")[-1]:  # the tool's result is in the context
            return "The answer is 42"
        return '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'

    _, _, out, recent = run(tok, "vftest_tool", policy, max_new_tokens=96)
    info = out[0].metadata["agentic"]
    assert info["end"] == "answer" and info["env_score"] == 1.0, info
    assert info["turns"] == 2 and info["tool_calls"] == 1 and info["windows"] == 1
    (_, a, b), (_, _, d), (_, _, f) = info["segments"]
    # The tiny template writes a tool message as an assistant turn: the tool's result, masked.
    assert tok.decode(out[0].token_ids[b:d]) == "<|assistant|>42<|end|><|assistant|>"
    assert not any(out[0].loss_mask[b:d]) and all(out[0].loss_mask[a:b]) and all(out[0].loss_mask[d:f])
    trace = next(iter(recent.values())).traces[0]
    assert [m.role for m in trace.messages] == ["user", "assistant", "tool", "assistant"]
    assert trace.tool_messages[0].content == "42"  # verifiers ran its own tool server


def test_bad_verifiers_ids_and_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="verifiers:no_such_taskset"):
        load_verifiers_env("no_such_taskset", {})
    with pytest.raises(ConfigError, match="environment_args"):
        load_verifiers_env("vftest_single", {"num_tasks": "many"})


def test_scalerl_train_runs_a_verifiers_environment(tmp_path: Path) -> None:
    from scalerl.assembly.build import build_training

    cfg = RunConfig.model_validate({
        "max_steps": 1,
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1,
                           "intermediate_size": 64, "max_position_embeddings": 512}},
        "data": {"heldout_size": 1},
        "generation": {"n": 2, "max_new_tokens": 8, "max_batch_size": 8, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": "sync", "prompts_per_step": 1},
        "algorithm": {"zero_variance_filter": False},
        "eval": {"every": 100, "at_start": False},
        "logging": {"progress": False},
        "rewards": {"max_workers": 1},
        "agentic": {"environment": "verifiers:vftest_single", "environment_args": {"num_tasks": 4},
                    "max_total_tokens": 64},
    })
    with build_training(cfg, tmp_path, device="cpu") as run_:
        assert isinstance(run_.engine, AgentEngine)
        assert run_.driver.run().steps == 1
    steps = [r for r in read_rows(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert len(steps) == 1 and steps[0]["agentic_turns_mean"] == 1
