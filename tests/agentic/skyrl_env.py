"""A small environment written against skyrl-gym's `BaseTextEnv` (imported only when installed)."""

from __future__ import annotations

import re

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class GuessEnv(BaseTextEnv):
    """Answer in `\\boxed{}`; a wrong answer gets "wrong, try again" (a user message) until the
    turns run out. Reward 1 for the right answer, else 0 (SkyRL's rule-based reward_spec)."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        extras = extras or {}
        self.ground_truth = extras["reward_spec"]["ground_truth"]
        self.max_turns = int(extras.get("max_turns", 3))

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        found = re.findall(r"\\boxed\{([^}]*)\}", action)
        right = bool(found) and found[-1].strip() == self.ground_truth
        done = right or self.turns >= self.max_turns
        obs = [] if done else [{"role": "user", "content": "wrong, try again"}]
        return BaseTextEnvStepOutput(observations=obs, reward=1.0 if right else 0.0, done=done, metadata={})

    def get_metrics(self):
        return {"steps": self.turns}
