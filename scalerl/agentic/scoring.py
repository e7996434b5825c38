"""Rewards of trajectories: the environment's own verdict, or the task's verifier on the answer turn.

`TrajectoryScorer(router)` is the pipeline's `Scorer` for agentic runs. For a trajectory
(`metadata["agentic"]`): an environment that scored the episode itself (`Environment.score()` not
None, e.g. a skyrl-gym environment's reward) gets that verdict through the router's reward scale;
otherwise the task's verifier (`rewards`: math, code, custom by dotted path) judges the text of the
answer turn only, so a tool result can never earn the reward by itself; an episode that ended
without an answer (turn limit, token budget, full context) scores as "no_answer" (incorrect).
Plain completions are scored as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scalerl.data.records import PromptRecord
from scalerl.rewards.router import RewardOutcome, RewardRouter
from scalerl.rollout.protocol import Completion


class TrajectoryScorer:
    def __init__(self, router: RewardRouter) -> None:
        self.router = router

    def score(self, record: PromptRecord, completion_text: str) -> RewardOutcome:
        return self.router.score(record, completion_text)

    def score_completion(
        self, record: PromptRecord, completion: Completion, decode: Callable[[list[int]], str]
    ) -> RewardOutcome:
        info: dict[str, Any] | None = completion.metadata.get("agentic")
        if info is None:
            return self.router.score(record, decode(completion.token_ids))
        if info.get("env_score") is not None:
            return self.router.outcome(info["env_score"], record.task)
        if info["end"] != "answer":
            cfg = self.router.config
            return RewardOutcome(cfg.incorrect_reward, False, "no_answer", f"episode ended: {info['end']}",
                                 record.task)
        return self.router.score(record, info["answer_text"])
