"""An adapter for skyrl-gym environments (SkyRL's Gymnasium-style text environments).

skyrl-gym (`pip install skyrl-gym`, the `agentic` extra) defines `BaseTextEnv`: constructed as
`Env(env_config, extras)`, `init(prompt_messages) -> (messages, metadata)` and
`step(action_text) -> {"observations": [messages], "reward": float, "done": bool, "metadata": ...}`.
The environment parses the model's turn itself (its own tool syntax, e.g. `<search>`), so every
skyrl-gym environment runs unchanged; scalerl's rollout still owns the turn limit, the token budget
and context management.

Construction from a task record follows SkyRL's dataset convention: `extras` holds
`reward_spec = {"method": "rule", "ground_truth": record.answer}`, `extra_info = record.metadata`
and `max_turns`. The episode's score is the reward of its last step (SkyRL's outcome reward),
which must lie in [0, 1] (the router maps it to `rewards.correct_reward` / `incorrect_reward`);
a value outside it is a counted verifier failure. An observation with another role than
user/tool/assistant/system is passed as a user message.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scalerl.agentic.environment import StepResult
from scalerl.agentic.messages import Message
from scalerl.config import ConfigError
from scalerl.data.records import PromptRecord
from scalerl.rewards.registry import import_object

_ROLES = ("system", "user", "assistant", "tool")


def load_skyrl_env(path: str) -> type:
    """The `BaseTextEnv` subclass at `pkg.module:Class`; errors name the key and the install."""
    try:
        from skyrl_gym.envs.base_text_env import BaseTextEnv
    except ImportError as err:
        raise ConfigError("agentic.environment: 'skyrl:...' needs skyrl-gym: "
                         "pip install 'scalerl[agentic]'") from err
    try:
        cls = import_object(path, "agentic.environment")
    except ValueError as err:
        raise ConfigError(str(err)) from None  # it names agentic.environment and the path
    if not (isinstance(cls, type) and issubclass(cls, BaseTextEnv)):
        raise ConfigError(f"agentic.environment: {path!r} is not a skyrl_gym BaseTextEnv subclass")
    return cls


class SkyRLEnvironment:
    """A scalerl `Environment` around one skyrl-gym `BaseTextEnv` per episode."""

    tool_schemas: list[dict[str, Any]] = []  # noqa: RUF012 - skyrl envs describe their tools in the prompt

    def __init__(self, env_class: type, *, max_turns: int, env_config: dict[str, Any] | None = None) -> None:
        self.env_class = env_class
        self.max_turns = max_turns
        self.env_config = dict(env_config or {})
        self._env: Any = None
        self._last_reward: float | None = None
        self.metrics: dict[str, Any] = {}

    def reset(self, task: PromptRecord) -> list[Message]:
        self.close()
        extras = {"reward_spec": {"method": "rule", "ground_truth": task.answer},
                  "extra_info": dict(task.metadata), "max_turns": self.max_turns}
        self._env = self.env_class(env_config=self.env_config, extras=extras)
        self._last_reward = None
        messages, _ = self._env.init(task.chat())
        return [dict(m) for m in messages]

    def step(self, action: str) -> StepResult:
        out = self._env.step(action)
        self._last_reward = float(out["reward"]) if out.get("reward") is not None else None
        observations = []
        for m in out.get("observations") or []:
            role = m.get("role") if m.get("role") in _ROLES else "user"
            observations.append({"role": role, "content": str(m.get("content", ""))})
        errors: Counter[str] = Counter()
        return StepResult(observations, done=bool(out["done"]), errors=errors)

    def score(self) -> float | None:
        if self._env is not None:
            self.metrics = dict(self._env.get_metrics())
        return self._last_reward

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
