"""Wiring an agentic run from its `agentic` section: environment factory, engine wrapper, scorer.

`build_agentic(agentic, tokenizer, engine, router, decode)` returns what `scalerl train` and
`scalerl eval` swap in when `agentic.environment` is set: the `TrajectoryEngine` around the run's
engine, `encode(record)` (the environment's initial context, rendered as the rollout renders it)
and the `TrajectoryScorer`. `agentic.environment`:

* `"tools"`: `ToolEnvironment` over the `agentic.tools` (built-in names or dotted paths);
* `"skyrl:pkg.module:EnvClass"`: a skyrl-gym `BaseTextEnv` subclass through `scalerl.agentic.skyrl`;
* `"pkg.module:factory"`: called with the `ToolBox`, returns an `Environment` (one per episode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.environment import Environment, ToolEnvironment
from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.agentic.scoring import TrajectoryScorer
from scalerl.agentic.toolcalls import turn_stop_text
from scalerl.agentic.tools import ToolBox, ToolSettings, tool_factories
from scalerl.config import AgenticConfig, ConfigError
from scalerl.data.records import PromptRecord
from scalerl.rewards.registry import import_object
from scalerl.rewards.router import RewardRouter
from scalerl.rollout.protocol import Engine


@dataclass
class Agentic:
    engine: TrajectoryEngine
    encode: Callable[[PromptRecord], list[int]]
    scorer: TrajectoryScorer
    make_env: Callable[[], Environment]

    def close(self) -> None:
        self.engine.close()


def environment_factory(
    a: AgenticConfig, router: RewardRouter | None
) -> tuple[Callable[[], Environment], ToolBox]:
    """The per-episode environment factory `agentic.environment` names; a `ConfigError` naming the
    key (`agentic.environment`, `agentic.tools[i]`, `agentic.corpus_path`) for what the config gets
    wrong, so that `scalerl.assembly.inputs.check_verifiers` can run it before any work."""
    spec = a.environment
    if spec is None:
        raise ConfigError("agentic.environment: not set (agentic rollouts are off)")
    sandbox = router.sandbox if router is not None else None
    box = ToolBox(tool_factories(a.tools, ToolSettings(sandbox=sandbox, timeout_s=a.tool_timeout_s,
                                                       corpus_path=a.corpus_path)))
    if spec == "tools":
        return (lambda: ToolEnvironment(box, timeout_s=a.tool_timeout_s, parser=a.tool_parser)), box
    if spec.startswith("skyrl:"):
        from scalerl.agentic.skyrl import SkyRLEnvironment, load_skyrl_env

        cls = load_skyrl_env(spec[len("skyrl:"):])
        return (lambda: SkyRLEnvironment(cls, max_turns=a.max_turns)), box
    try:
        factory: Any = import_object(spec, "agentic.environment")
    except ValueError as err:  # the user's path: bad input
        raise ConfigError(str(err)) from None  # it names agentic.environment and the path
    if not callable(factory):
        raise ConfigError(f"agentic.environment: {spec!r} is not callable")
    return (lambda: factory(box)), box


def context_trigger(budget: int | None, fraction: float | None, window: int | None) -> int | None:
    """Context tokens at which `agentic.context_strategy` acts: `floor(fraction * window)` (the
    model's context window; DeepSeek-V3.2 acts past 80% of it, arXiv 2512.02556 §3.2 "context
    management"), the smaller of that and `budget` when both are set, `budget` alone without a
    fraction. A `ConfigError` naming `agentic.context_fraction` when the window is unknown or the
    fraction leaves no token."""
    if fraction is None:
        return budget
    if window is None:
        raise ConfigError("agentic.context_fraction: the model's context window is unknown (no "
                          "max_position_embeddings); set agentic.context_budget in tokens")
    at = int(fraction * window)
    if at < 1:
        raise ConfigError(f"agentic.context_fraction: {fraction} of a {window}-token window is no token")
    return at if budget is None else min(budget, at)


def with_context_window(a: AgenticConfig, window: int | None) -> AgenticConfig:
    """`a` with `context_budget` resolved by `context_trigger` for a model of `window` tokens."""
    if a.context_fraction is None:
        return a
    return a.model_copy(update={"context_budget": context_trigger(a.context_budget, a.context_fraction,
                                                                  window)})


def build_agentic(
    a: AgenticConfig, tokenizer: Any, engine: Engine, router: RewardRouter | None,
    decode: Callable[[list[int]], str],
) -> Agentic:
    make_env, _ = environment_factory(a, router)
    probe = make_env()
    chat = ChatFormat(tokenizer, tools=list(probe.tool_schemas) or None,
                      stop_text=turn_stop_text(a.tool_parser))
    probe.close()
    wrapped = TrajectoryEngine(engine, make_env, chat, decode, a)
    cache: dict[str, list[int]] = {}

    def encode(record: PromptRecord) -> list[int]:
        ids = cache.get(record.id)
        if ids is None:
            env = make_env()
            try:
                ids = cache[record.id] = chat.render_ids(env.reset(record))
            finally:
                env.close()
        return ids

    scorer = TrajectoryScorer(router) if router is not None else None
    return Agentic(engine=wrapped, encode=encode, scorer=scorer, make_env=make_env)  # type: ignore[arg-type]
