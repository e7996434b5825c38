"""The skyrl-gym adapter: an environment written against skyrl-gym runs as a scalerl environment."""

from __future__ import annotations

import pytest

pytest.importorskip("skyrl_gym")

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.agentic.scoring import TrajectoryScorer
from scalerl.agentic.setup import environment_factory
from scalerl.config import AgenticConfig
from scalerl.rewards import RewardRouter
from tests.agentic.fakes import ScriptedEngine
from tests.agentic.test_rollout import RECORD, TOK, decode, run


def make(policy, max_turns: int = 3):
    cfg = AgenticConfig(environment="skyrl:tests.agentic.skyrl_env:GuessEnv", max_turns=max_turns)
    make_env, _ = environment_factory(cfg, None)
    engine = TrajectoryEngine(ScriptedEngine(TOK, policy), make_env, ChatFormat(TOK), decode,
                              AgenticConfig(max_turns=max_turns, thinking_retention="keep_all"))
    return engine


def test_a_skyrl_gym_environment_runs_through_the_adapter_and_scores_the_episode() -> None:
    def policy(context: str) -> str:
        return "\\boxed{579}" if "wrong, try again" in context else "\\boxed{578}"

    (c,) = run(make(policy))
    info = c.metadata["agentic"]
    assert info["end"] == "answer" and info["turns"] == 2 and info["env_score"] == 1.0
    assert "wrong, try again" in TOK.decode(c.token_ids)
    router = RewardRouter()
    try:
        outcome = TrajectoryScorer(router).score_completion(RECORD, c, decode)
    finally:
        router.close()
    assert outcome.correct and outcome.reward == 1.0


def test_a_skyrl_episode_that_never_gets_it_right_scores_zero() -> None:
    (c,) = run(make(lambda context: "\\boxed{1}", max_turns=2))
    info = c.metadata["agentic"]
    assert info["turns"] == 2 and info["env_score"] == 0.0 and info["end"] in ("answer", "turn_limit")


def test_bad_skyrl_paths_are_named() -> None:
    for spec, message in [("skyrl:tests.agentic.skyrl_env:Nope", "has no attribute"),
                          ("skyrl:tests.agentic.fakes:ScriptedEngine", "not a skyrl_gym BaseTextEnv")]:
        with pytest.raises(ValueError, match=message):
            environment_factory(AgenticConfig(environment=spec), None)
