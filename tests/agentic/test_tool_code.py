"""The built-in agentic code task: every level's interpreter trace is what the sandboxed interpreter
prints for the gold program, the gold program passes the code verifier, and an episode that runs
its candidate and then answers is scored on its answer turn."""

from __future__ import annotations

import pytest

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.environment import ToolEnvironment
from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.agentic.scoring import TrajectoryScorer
from scalerl.agentic.sft import agentic_examples
from scalerl.agentic.toolcalls import ToolCall, format_tool_call
from scalerl.agentic.tools import PythonInterpreter, ToolBox
from scalerl.config import AgenticConfig, RunConfig
from scalerl.data.synthetic import make_synthetic
from scalerl.rewards import RewardConfig, RewardRouter
from tests.agentic.fakes import ScriptedEngine
from tests.agentic.test_rollout import TOK, decode, run


@pytest.fixture(scope="module")
def router() -> RewardRouter:
    r = RewardRouter(RewardConfig(max_workers=1))
    yield r
    r.close()


RECORDS = list({r.metadata["difficulty"]: r for r in make_synthetic("tool_code", 20, seed=3)}.values())


def test_every_level_has_a_trace_the_interpreter_reproduces(router: RewardRouter) -> None:
    assert {r.metadata["difficulty"] for r in RECORDS} == {1, 2, 3, 4, 5}
    for record in RECORDS:
        trace = record.metadata["tool_trace"]
        assert trace["name"] == "python"
        py = PythonInterpreter(router.sandbox, wall_s=5.0)
        try:
            assert py.call(trace["arguments"]) == trace["result"], record.id
        finally:
            py.close()
        assert router.score(record, record.metadata["solution"]).correct, record.id


def test_an_episode_that_runs_its_candidate_then_answers_is_scored_on_the_answer(
        router: RewardRouter) -> None:
    record = next(r for r in RECORDS if r.metadata["difficulty"] == 2)
    trace = record.metadata["tool_trace"]
    wrong = str(record.metadata["solution"]).replace("return", "return 1+")

    def policy(answer: str):
        def turn(context: str) -> str:
            if "<tool_response>" not in context:
                return format_tool_call(ToolCall("python", trace["arguments"]))
            return answer
        return turn

    box = ToolBox({"python": lambda: PythonInterpreter(router.sandbox, wall_s=5.0)})
    scorer = TrajectoryScorer(router)
    for answer, correct in ((str(record.metadata["solution"]), True), (wrong, False)):
        engine = TrajectoryEngine(ScriptedEngine(TOK, policy(answer)), lambda: ToolEnvironment(box),
                                  ChatFormat(TOK), decode, AgenticConfig(max_turns=3, max_total_tokens=600))
        (c,) = run(engine, record=record)
        info = c.metadata["agentic"]
        assert info["end"] == "answer" and info["tool_calls"] == 1 and info["tool_errors"] == {}
        assert f"<tool_response>{trace['result']}</tool_response>" in TOK.decode(c.token_ids)
        assert scorer.score_completion(record, c, decode).correct is correct


def test_the_warm_start_mixes_interpreter_traces_with_direct_ones() -> None:
    cfg = RunConfig.model_validate({"agentic": {"environment": "tools", "tools": ["python"],
                                                "sft_tool_fraction": 1.0}})
    chat = ChatFormat(TOK)
    (ex,) = agentic_examples(cfg.agentic, cfg.seed, TOK, RECORDS[:1], max_length=512)
    mask = ex.response_mask
    assert mask is not None and not all(mask) and mask[0] and mask[-1]
    text = TOK.decode(list(ex.response_ids))
    assert text.startswith("<tool_call>") and str(RECORDS[0].metadata["solution"]) in text
    masked = TOK.decode([t for t, m in zip(ex.response_ids, mask, strict=True) if not m])
    result = RECORDS[0].metadata["tool_trace"]["result"]
    assert masked == TOK.decode(chat.segment_ids([{"role": "tool", "content": result}]))
