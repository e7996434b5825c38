"""Wiring `agentic.environment` for the composition root, the endpoint-backed kinds included.

`build_environment(agentic, tokenizer, engine, router, decode)` is what `scalerl train` and
`scalerl eval` call when `agentic.environment` is set: `"agent:pkg.mod:fn"` builds an
`AgentEngine` (`scalerl.serving.agent`), `"verifiers:module"` the verifiers adapter
(`scalerl.serving.verifiers_env`), `"openenv:URL"` the OpenEnv one (`scalerl.serving.openenv_env`),
all through the endpoint; every other kind is `scalerl.agentic.setup.build_agentic`.
`check_environment(agentic, router)` is the input check run before any work: a `ConfigError` naming
`agentic.environment` for a path that does not load or a library that is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalerl.agentic.scoring import TrajectoryScorer
from scalerl.agentic.setup import build_agentic, environment_factory
from scalerl.config import AgenticConfig
from scalerl.data.records import PromptRecord
from scalerl.rewards.router import RewardRouter
from scalerl.rollout.protocol import Engine

SERVED_KINDS: tuple[str, ...] = ("agent:", "verifiers:", "openenv:")


def is_served(a: AgenticConfig) -> bool:
    return a.environment is not None and a.environment.startswith(SERVED_KINDS)


@dataclass
class ServedAgentic:
    engine: Any  # an AgentEngine
    encode: Callable[[PromptRecord], list[int]]
    scorer: TrajectoryScorer | None

    def close(self) -> None:
        self.engine.close()


def check_environment(a: AgenticConfig, router: RewardRouter | None) -> None:
    spec = a.environment
    if spec is None:
        return
    if spec.startswith("agent:"):
        from scalerl.serving.agent import check_openai, load_agent

        check_openai()
        load_agent(spec[len("agent:"):])
    elif spec.startswith("verifiers:"):
        from scalerl.serving.agent import check_openai
        from scalerl.serving.verifiers_env import load_verifiers_env

        check_openai()
        load_verifiers_env(spec[len("verifiers:"):], a.environment_args)
    elif spec.startswith("openenv:"):
        from scalerl.serving.agent import check_openai
        from scalerl.serving.openenv_env import check_openenv

        check_openai()
        check_openenv(spec[len("openenv:"):])
    else:
        environment_factory(a, router)


def build_environment(
    a: AgenticConfig, tokenizer: Any, engine: Engine, router: RewardRouter | None,
    decode: Callable[[list[int]], str],
) -> Any:
    spec = a.environment
    if spec is None or not spec.startswith(SERVED_KINDS):
        return build_agentic(a, tokenizer, engine, router, decode)
    from scalerl.serving.agent import AgentEngine, load_agent

    if spec.startswith("agent:"):
        wrapped = AgentEngine(engine, tokenizer, load_agent(spec[len("agent:"):]), a)
    elif spec.startswith("openenv:"):
        from scalerl.serving.openenv_env import OpenEnvEpisodes

        oe = OpenEnvEpisodes(spec[len("openenv:"):], max_turns=a.max_turns,
                             reset=a.environment_args.get("reset"))
        wrapped = AgentEngine(engine, tokenizer, None, a, run_episode=oe.run)
    else:
        from scalerl.serving.verifiers_env import VerifiersEpisodes, load_verifiers_env

        episodes = VerifiersEpisodes(load_verifiers_env(spec[len("verifiers:"):], a.environment_args))
        wrapped = AgentEngine(engine, tokenizer, None, a, run_episode=episodes.run, aclose=episodes.aclose)
    cache: dict[str, list[int]] = {}

    def encode(record: PromptRecord) -> list[int]:
        ids = cache.get(record.id)
        if ids is None:
            endpoint = wrapped.endpoint
            ids = cache[record.id] = endpoint.encode(endpoint.render_chat(record.chat(), None))
        return ids

    scorer = TrajectoryScorer(router) if router is not None else None
    return ServedAgentic(engine=wrapped, encode=encode, scorer=scorer)
