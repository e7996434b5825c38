"""Advantage estimators: the component of a trainer step that turns rewards into advantages.

The trainer calls one estimator, whatever the algorithm, at two points of a step:

    advantages, metrics = estimator.estimate(batch, rewards, token_penalty)   # before the passes
    metrics = estimator.update(batch)                                        # after the policy update

`OutcomeAdvantages` (baselines `group_mean`, `leave_one_out`, `none`) is a pure function of the
rewards and has nothing to update. `scalerl.training.critic.Critic` (baseline `critic`) runs its
value model in `estimate` and takes its own optimizer step in `update`. Both save and restore
their state with the trainer's checkpoints (`state_dict`, `save` / `load` of a directory).

`token_penalty` (`[N, T]`, or None) is `beta * KL_t` per response token when the KL goes into the
reward per token (REINFORCE++): the advantages then vary along a response (`[N, T]`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from scalerl.algorithms.advantages import compute_advantages, masked_whiten
from scalerl.algorithms.returns import discounted_returns, token_rewards
from scalerl.config import AlgorithmConfig
from scalerl.training.batch import TrainBatch

ADV_EPS = 1e-6


class AdvantageEstimator(Protocol):
    """What the trainer needs of an advantage estimator (module docstring)."""

    def estimate(
        self, batch: TrainBatch, rewards: Tensor, token_penalty: Tensor | None
    ) -> tuple[Tensor, dict[str, float]]:
        """Advantages `[N]` or `[N, T]` for the batch's rows, and metrics for the step's row."""
        ...

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """Learn from the batch just estimated (after the policy's update); the metrics."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def save(self, directory: Path) -> None:
        """Write this estimator's files into a checkpoint directory (nothing when it has none)."""
        ...

    def load(self, directory: Path) -> None: ...


def outcome_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    *,
    baseline: str,
    adv_norm: str,
    token_penalty: Tensor | None = None,
    eps: float = ADV_EPS,
) -> Tensor:
    """Advantages from outcome rewards, with an optional per-token penalty in the reward.

    Without a penalty: `compute_advantages(rewards, group_ids, adv_norm, eps, baseline=...)`, `[N]`.
    With one (REINFORCE++, Hu 2025, arXiv 2501.03262, §3): the baselined reward `c_i` goes on the
    response's last token, the penalty on every token, and each token's advantage is the return
    still to come, `c_i - sum_{s >= t} p_{i,s}` (`[N, T]`); `adv_norm="batch"` then whitens over
    the batch's response tokens (`masked_whiten`, the paper's global normalisation), `"group"`
    scales `c_i` by the group std before the penalty is added, `"none"` leaves it.
    """
    if token_penalty is None:
        return compute_advantages(rewards, group_ids, adv_norm, eps, baseline=baseline)
    per_sample_norm = "none" if adv_norm == "batch" else adv_norm
    base = compute_advantages(rewards, group_ids, per_sample_norm, eps, baseline=baseline)
    returns = discounted_returns(token_rewards(base, mask, token_penalty), mask, gamma=1.0)
    return masked_whiten(returns, mask, eps) if adv_norm == "batch" else returns


class OutcomeAdvantages:
    """Baselines `group_mean`, `leave_one_out` and `none` (see `outcome_advantages`)."""

    def __init__(self, algorithm: AlgorithmConfig) -> None:
        self.baseline = algorithm.baseline
        self.adv_norm = algorithm.adv_norm

    def estimate(
        self, batch: TrainBatch, rewards: Tensor, token_penalty: Tensor | None
    ) -> tuple[Tensor, dict[str, float]]:
        adv = outcome_advantages(
            rewards, batch.group_ids, batch.response_mask, baseline=self.baseline, adv_norm=self.adv_norm,
            token_penalty=token_penalty,
        )
        return adv, {}

    def update(self, batch: TrainBatch) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore: the estimate depends on the batch only."""

    def save(self, directory: Path) -> None:
        """No files."""

    def load(self, directory: Path) -> None:
        """No files."""
