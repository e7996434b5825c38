"""openenv-core environments through the endpoint: an OpenEnv server written in the test, served in
process on localhost (no container); the reward is the sum of the environment's own step rewards."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.envs
pytest.importorskip("openenv")
pytest.importorskip("openai")

from scalerl.config import AgenticConfig, ConfigError  # noqa: E402
from scalerl.data.records import PromptRecord  # noqa: E402
from scalerl.models.tiny import build_tiny_tokenizer  # noqa: E402
from scalerl.rollout.protocol import GenerationRequest, SamplingParams  # noqa: E402
from scalerl.serving.agent import AgentEngine  # noqa: E402
from scalerl.serving.http import serve_app  # noqa: E402
from scalerl.serving.openenv_env import ActionError, OpenEnvEpisodes, check_openenv, parse_action  # noqa: E402
from tests.agentic.fakes import ScriptedEngine  # noqa: E402
from tests.serving.openenv_guess import GuessEnvironment, make_app  # noqa: E402


@pytest.fixture(scope="module")
def server():
    handle = serve_app(make_app())
    yield handle.url[: -len("/v1")]
    handle.close()


def bisect(context: str) -> str:
    """Guesses 4, then one higher per "higher" hint so far: 4, 5, 6 (the secret)."""
    hints = re.findall(r'"message": "(\w+)"', context)
    return json.dumps({"guess": 4 + hints.count("higher")})


def episode(server: str, policy, max_turns: int = 4):
    tok = build_tiny_tokenizer()
    oe = OpenEnvEpisodes(server, max_turns=max_turns)
    engine = AgentEngine(ScriptedEngine(tok, policy, continuable=False), tok, None,
                         AgenticConfig(max_total_tokens=4000, max_turns=max_turns), run_episode=oe.run)
    record = PromptRecord(id="g", task="math", prompt="guess")
    try:
        request = GenerationRequest("r", [1], SamplingParams(max_new_tokens=32), {"record": record})
        return engine.generate([request])[0]
    finally:
        engine.close()


def test_an_openenv_episode_is_one_trajectory_with_the_environments_reward(server: str) -> None:
    c = episode(server, bisect)
    info = c.metadata["agentic"]
    assert GuessEnvironment.SECRET == 6
    assert info["end"] == "answer" and info["env_score"] == 1.0 and info["turns"] == 3
    assert [k for k, _, _ in info["segments"]] == ["model", "env", "model", "env", "model"]


def test_an_episode_that_never_finds_it_scores_zero_and_one_that_cannot_act_is_counted(server: str) -> None:
    c = episode(server, lambda ctx: '{"guess": 1}', max_turns=2)
    assert c.metadata["agentic"]["env_score"] == 0.0 and c.metadata["agentic"]["turns"] == 2
    c = episode(server, lambda ctx: "no idea")  # GuessAction has one required field: "no idea" is not an int
    info = c.metadata["agentic"]
    assert info["end"] == "env_error" and info["turns"] == 1


def test_parse_action_rules() -> None:
    schema = {"required": ["guess"]}
    assert parse_action('{"guess": 3}', schema) == {"guess": 3}
    assert parse_action('```json\n{"guess": 3}\n```', schema) == {"guess": 3}
    assert parse_action("3", schema) == {"guess": 3}
    with pytest.raises(ActionError):
        parse_action("3", {"required": ["a", "b"]})
    with pytest.raises(ConfigError, match="openenv:"):
        check_openenv("localhost:8000")
