"""TrajectoryEngine: episodes over a scripted engine, segments, limits, errors, context rules."""

from __future__ import annotations

import re
import time
from typing import ClassVar

import pytest

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.environment import StepResult, ToolEnvironment
from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.agentic.toolcalls import ToolCall, format_tool_call
from scalerl.agentic.tools import Calculator, ToolBox
from scalerl.config import AgenticConfig
from scalerl.data.records import PromptRecord
from scalerl.models.tiny import build_tiny_tokenizer
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams
from tests.agentic.fakes import ScriptedEngine

TOK = build_tiny_tokenizer()
RECORD = PromptRecord(id="math-123+456", task="math", prompt="Compute 123+456", answer="579")


def decode(ids: list[int]) -> str:
    return str(TOK.decode(ids, skip_special_tokens=True))


def calc_call(expr: str) -> str:
    return format_tool_call(ToolCall("calculator", {"expression": expr}))


def solver(context: str) -> str:
    """Calls the calculator once, then boxes what it returned."""
    results = re.findall(r"<tool_response>(.*?)</tool_response>", context)
    if not results:
        return calc_call(re.search(r"Compute ([0-9+]+)", context).group(1))
    return f"<think>the tool says {results[-1]}</think>\\boxed{{{results[-1]}}}"


class SlowTool:
    name, description, parameters = "slow", "sleeps", {"type": "object", "properties": {}}

    def call(self, arguments):
        time.sleep(1.0)
        return "late"

    def close(self) -> None:
        pass


class BrokenTool:
    name, description, parameters = "broken", "raises", {"type": "object", "properties": {}}

    def call(self, arguments):
        raise RuntimeError("boom")

    def close(self) -> None:
        pass


# Wider limits than the config's defaults (256 / 64): these episodes' tool outputs are long.
ROLLOUT_LIMITS = {"max_total_tokens": 512, "max_observation_tokens": 256}


def make_engine(policy, *, continuable: bool = True, tools=None, timeout_s: float = 5.0, **settings):
    inner = ScriptedEngine(TOK, policy, continuable=continuable)
    box = ToolBox(tools or {"calculator": Calculator})
    engine = TrajectoryEngine(inner, lambda: ToolEnvironment(box, timeout_s=timeout_s), ChatFormat(TOK),
                              decode, AgenticConfig(**{**ROLLOUT_LIMITS, **settings}))
    return engine, inner


def run(engine: TrajectoryEngine, n: int = 1, record: PromptRecord = RECORD, **params) -> list[Completion]:
    p = SamplingParams(n=n, max_new_tokens=params.pop("max_new_tokens", 200), seed=1, **params)
    return engine.generate([GenerationRequest("r0", [0], p, {"record": record})])


@pytest.mark.parametrize("continuable", [True, False])
def test_a_tool_call_episode_is_model_env_model_segments(continuable: bool) -> None:
    engine, inner = make_engine(solver, continuable=continuable)
    (c,) = run(engine)
    chat = ChatFormat(TOK)
    info = c.metadata["agentic"]
    assert info["end"] == "answer" and info["turns"] == 2 and info["tool_calls"] == 1
    assert info["tool_errors"] == {} and c.finish_reason == "stop"
    kinds = [k for k, _, _ in info["segments"]]
    assert kinds == ["model", "env", "model"]
    (_, m0, m1), (_, e0, e1), (_, a0, a1) = info["segments"]
    env_ids = chat.segment_ids([{"role": "tool", "content": "579"}])
    assert c.token_ids[e0:e1] == env_ids
    assert decode(c.token_ids[m0:m1]) == calc_call("123+456")
    assert c.loss_mask == [True] * (m1 - m0) + [False] * (e1 - e0) + [True] * (a1 - a0)
    assert c.logprobs[e0:e1] == [0.0] * (e1 - e0)
    assert all(lp == -0.5 for lp, m in zip(c.logprobs, c.loss_mask, strict=True) if m)
    assert c.prompt_ids == chat.render_ids(RECORD.chat())
    assert info["answer_text"] == "<think>the tool says 579</think>\\boxed{579}"
    assert "record" not in c.metadata
    if continuable:
        assert inner.extends == 1 and inner.held == 0 and len(inner.prompts_seen) == 1
    else:  # the whole context is the next turn's prompt
        assert inner.prompts_seen[1] == c.prompt_ids + c.token_ids[:e1]
    assert engine.num_unfinished() == 0


@pytest.mark.parametrize("continuable", [True, False])
def test_recorded_sampling_sets_follow_the_tokens_of_every_turn(continuable: bool) -> None:
    """Keep-sampling-mask across turns: model tokens keep the ids the engine recorded for them
    (the fake records {t, t + 1} for token t), environment tokens are forced (no id)."""
    engine, _ = make_engine(solver, continuable=continuable)
    (c,) = run(engine, top_k=2, return_support=True)
    (_, m0, m1), (_, e0, e1), (_, a0, a1) = c.metadata["agentic"]["segments"]
    assert c.support == [2] * (m1 - m0) + [0] * (e1 - e0) + [2] * (a1 - a0)
    assert c.support_ids is not None and len(c.support_ids) == c.num_tokens
    for t, tok in enumerate(c.token_ids):
        assert c.support_ids.token(t) == ([] if e0 <= t < e1 else [tok, tok + 1])


def test_continuation_and_resubmission_build_the_same_trajectory() -> None:
    a = run(make_engine(solver, continuable=True)[0], n=3)
    b = run(make_engine(solver, continuable=False)[0], n=3)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.loss_mask for c in a] == [c.loss_mask for c in b]


def test_tool_errors_are_observations_counted_by_kind_and_the_episode_goes_on() -> None:
    script = [
        "<tool_call>{not json}</tool_call>",
        format_tool_call(ToolCall("weather", {})),
        calc_call("1/0"),
        format_tool_call(ToolCall("calculator", {"expression": "__import__('os')"})),
        format_tool_call(ToolCall("broken", {})),
        format_tool_call(ToolCall("slow", {})),
        "\\boxed{579}",
    ]

    def policy(context: str) -> str:
        return script[context.count("<tool_response>")]

    engine, _ = make_engine(policy, tools={"calculator": Calculator, "broken": BrokenTool, "slow": SlowTool},
                            timeout_s=0.2, max_turns=10, max_total_tokens=3000)
    (c,) = run(engine)
    info = c.metadata["agentic"]
    assert info["end"] == "answer" and info["turns"] == 7 and info["tool_calls"] == 6
    assert info["tool_errors"] == {"malformed": 1, "unknown_tool": 1, "tool_error": 2, "bad_arguments": 1,
                                   "timeout": 1}
    text = TOK.decode(c.token_ids)
    assert "error (unknown_tool): no tool 'weather' (tools: calculator, broken, slow)" in text
    assert "error (tool_error): broken raised RuntimeError: boom" in text


def test_turn_limit_and_token_budget_end_an_episode_as_truncated() -> None:
    always = lambda context: calc_call("1+1")  # noqa: E731
    (c,) = run(make_engine(always, max_turns=3)[0])
    assert c.metadata["agentic"]["end"] == "turn_limit" and c.finish_reason == "length"
    assert c.metadata["agentic"]["turns"] == 3 and c.metadata["agentic"]["tool_calls"] == 3
    (c,) = run(make_engine(always, max_turns=50, max_total_tokens=150)[0])
    assert c.metadata["agentic"]["end"] == "token_budget" and c.num_tokens <= 150


def test_versions_and_start_version_across_an_in_flight_update() -> None:
    engine, inner = make_engine(solver)
    engine.submit([GenerationRequest("r0", [0], SamplingParams(max_new_tokens=200), {"record": RECORD})])
    out = engine.step()  # the first turn finishes and its tool runs
    assert out == []
    engine.update_weights({}, version=4)
    out = []
    while engine.num_unfinished():
        out += engine.step()
    (c,) = out
    (_, m0, m1), _, (_, a0, a1) = c.metadata["agentic"]["segments"]
    assert set(c.versions[m0:m1]) == {0} and set(c.versions[a0:a1]) == {4}
    assert c.start_version == 0 and engine.version == 4 and inner.weights_loaded == 1


def looping(context: str) -> str:
    n = context.count("<tool_response>")
    return "\\boxed{2}" if n >= 5 else f"<think>step {n}</think>" + calc_call(f"{n}+1")


@pytest.mark.parametrize("strategy", ["discard_75", "discard_all", "summary"])
def test_context_strategies_rewrite_the_history_and_are_counted(strategy: str) -> None:
    def policy(context: str) -> str:
        if "Summarize the work so far" in context:
            return "I added numbers with the calculator."
        return looping(context)

    engine, _ = make_engine(policy, context_strategy=strategy, context_budget=330, max_turns=20,
                            max_total_tokens=2000)
    (c,) = run(engine)
    info = c.metadata["agentic"]
    assert info["context_events"][strategy] >= 1 and info["windows"] >= 2
    assert info["untrained_tokens"] > 0
    prompt = TOK.decode(c.prompt_ids)
    assert prompt.startswith("<|user|>Compute 123+456")
    assert len(c.prompt_ids) + c.num_tokens <= 330 + 200
    if strategy == "discard_all":
        assert "<tool_response>" not in prompt
    elif strategy == "discard_75":
        assert "<tool_response>" in prompt  # a quarter of the rounds survive
    else:
        assert "Summary of your work so far: I added numbers with the calculator." in prompt


def test_without_a_strategy_a_full_context_ends_the_episode() -> None:
    (c,) = run(make_engine(looping, context_budget=330, max_turns=20, max_total_tokens=2000)[0])
    assert c.metadata["agentic"]["end"] == "context_limit"


class UserTurnEnv:
    """Answers every turn with a new *user* message (how some agent frameworks relay tool output)."""

    tool_schemas: ClassVar[list] = []

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, task):
        return task.chat()

    def step(self, action: str) -> StepResult:
        self.turns += 1
        done = self.turns >= 3
        return StepResult([] if done else [{"role": "user", "content": f"again {self.turns}"}], done)

    def score(self):
        return 1.0

    def close(self) -> None:
        pass


@pytest.mark.parametrize("rule", ["deepseek_v32", "keep_all"])
def test_thinking_retention_drops_reasoning_when_a_user_message_arrives(rule: str) -> None:
    def policy(context: str) -> str:
        return f"<think>plan {context.count('again')}</think>ok"

    inner = ScriptedEngine(TOK, policy)
    engine = TrajectoryEngine(inner, UserTurnEnv, ChatFormat(TOK), decode,
                              AgenticConfig(thinking_retention=rule, max_turns=5))
    (c,) = run(engine)
    info = c.metadata["agentic"]
    context = TOK.decode(c.prompt_ids + c.token_ids)
    assert info["env_score"] == 1.0 and info["turns"] == 3
    if rule == "deepseek_v32":
        assert info["context_events"] == {"thinking_dropped": 2} and info["windows"] == 3
        assert "plan 0" not in context and "plan 1" not in context and "<think>plan 2</think>" in context
        assert context.count("ok") == 3  # the answers (content) are kept
    else:
        assert info["context_events"] == {} and info["windows"] == 1
        assert "<think>plan 0</think>" in context
