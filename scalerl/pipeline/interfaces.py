"""What the pipeline drives, as protocols, and the two transports a distributed backend replaces.

The pipeline needs an `Engine` (`scalerl.rollout.protocol`), a `Trainer`, a `PromptSource` (the
curriculum, e.g. `scalerl.data.pool.PromptPool`) and a `Scorer` (the rewards router;
`scalerl.rewards.groups`). Between the
generator side and the trainer side only two things travel, so those are the seams a multi-process
or multi-node backend implements: a `GroupQueue` (finished, scored groups -> trainer) and a
`WeightChannel` (trainer weights -> generator). `scalerl.pipeline.local` has the in-process ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from scalerl.data.records import PromptRecord
from scalerl.training.batch import ScoredGroup


@runtime_checkable
class Trainer(Protocol):
    """One optimizer step per call; `version` counts optimizer steps (+1 per successful step)."""

    @property
    def version(self) -> int: ...

    def step(self, groups: Sequence[ScoredGroup]) -> dict[str, float]: ...

    def weights_for_engine(self) -> Mapping[str, torch.Tensor]: ...


@runtime_checkable
class PromptSource(Protocol):
    """The training curriculum. `next_prompts` may raise `scalerl.data.pool.PoolExhaustedError` or
    return fewer than `k` records when it runs out; `report` returns whether the group is
    informative (its rewards are not all equal)."""

    def next_prompts(self, k: int, *, refill: bool = False) -> list[PromptRecord]: ...

    def report(self, prompt_id: str, rewards: Sequence[float], success_threshold: float = 0.0) -> bool: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class ReadyGroup:
    """A scored group on its way to the trainer.

    `ticket` numbers admissions (unique, increasing); `admit_version` is the engine version when the
    prompt was admitted (a lower bound of every sample's `start_version`), which the staleness
    controller accounts by.
    """

    ticket: int
    admit_version: int
    group: ScoredGroup


# Picks a batch among the queued groups (oldest first): indices, or None while none is valid
# (`StalenessController.select_batch` under the deadline rule).
Selector = Callable[[Sequence[ReadyGroup]], "list[int] | None"]


@runtime_checkable
class GroupQueue(Protocol):
    """Scored groups from the generator side to the trainer side (FIFO)."""

    def put(self, item: ReadyGroup) -> None: ...

    def get_batch(
        self, n: int, timeout: float | None = None, select: Selector | None = None
    ) -> list[ReadyGroup] | None:
        """Exactly `n` items, or None if they did not all arrive within `timeout` (nothing taken).
        FIFO, or with `select` the `n` items it picks (indices into the queued items, oldest first;
        None while no valid batch is queued: the call keeps waiting)."""
        ...

    def __len__(self) -> int: ...

    def snapshot(self) -> list[ReadyGroup]:
        """The queued items, oldest first, without removing them (for checkpoints)."""
        ...


@runtime_checkable
class WeightChannel(Protocol):
    """Trainer weights to the generator. `publish` returns once the generator side has them."""

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None: ...


@runtime_checkable
class SleepingChannel(WeightChannel, Protocol):
    """A weight channel whose engine shares its devices with the trainer (the colocated layout,
    `scalerl.pipeline.local.ColocatedWeightChannel`). The round schedules call `prepare` before the
    engine generates (it wakes holding `version`, loading `weights()` when it must) and `release`
    when it has nothing to generate until the next round (it frees its device memory for the
    trainer). The in-flight `pipeline` schedule cannot use one: its engine never idles."""

    def prepare(self, weights: Callable[[], Mapping[str, torch.Tensor]], version: int) -> None: ...

    def release(self) -> None: ...
