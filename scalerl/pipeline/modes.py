"""The three off-policy schedules, as sources of training batches.

* `sync` (`RoundBatches` with k = 1): generate B groups with the current weights, one update.
* `ppo_offpolicy` k (`RoundBatches`): generate k x B groups with one policy, then k updates on
  mini-batches of B groups in completion order, then load the new weights (Qwen3 / ProRL style).
  The engine is idle while the trainer works; weights are loaded between rounds.
* `pipeline` k (`PipelineBatches`, PipelineRL): the generator thread streams rollouts without
  pause; after every optimizer step the new weights go to the engine in flight; groups reach the
  trainer as they finish; admission control keeps every group within k versions of its start.

The driver is mode-blind: `start()`, then per step `next_batch()` -> train -> `after_step()`;
`generate_for_eval()` runs evaluation requests at the trainer's current version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scalerl.pipeline.generator import Generator
from scalerl.pipeline.interfaces import GroupQueue, ReadyGroup, Trainer, WeightChannel
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest


class BatchSource(Protocol):
    def start(self) -> None: ...

    def next_batch(self) -> list[ReadyGroup] | None:
        """The next B groups, or None when the prompts ran out before B could be assembled."""
        ...

    def after_step(self) -> None: ...

    def generate_for_eval(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    def close(self) -> None: ...


def _push_weights(engine: Engine, channel: WeightChannel, trainer: Trainer) -> None:
    if engine.version != trainer.version:
        channel.publish(trainer.weights_for_engine(), trainer.version)


class RoundBatches:
    """`sync` (k = 1) and `ppo_offpolicy` (k > 1): alternate generation rounds and k updates."""

    def __init__(
        self,
        generator: Generator,
        queue: GroupQueue,
        channel: WeightChannel,
        trainer: Trainer,
        batch_size: int,
        updates_per_round: int,
    ) -> None:
        if updates_per_round < 1:
            raise ValueError(f"updates_per_round: must be >= 1, got {updates_per_round}")
        self.generator = generator
        self.queue = queue
        self.channel = channel
        self.trainer = trainer
        self.batch_size = batch_size
        self.updates_per_round = updates_per_round
        self.rounds = 0

    def start(self) -> None:
        _push_weights(self.generator.engine, self.channel, self.trainer)

    def next_batch(self) -> list[ReadyGroup] | None:
        if len(self.queue) < self.batch_size:
            # A new round: the previous one is fully consumed, so no rollout of it can see the
            # weights loaded here.
            _push_weights(self.generator.engine, self.channel, self.trainer)
            self.generator.fill(self.updates_per_round * self.batch_size)
            self.rounds += 1
        return self.queue.get_batch(self.batch_size, timeout=0)

    def after_step(self) -> None:
        """Weights wait for the next round (the round's remaining mini-batches share one policy)."""

    def generate_for_eval(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        # The engine is idle between steps; loading the newest weights mid-round is harmless because
        # the round's rollouts are all finished (their behaviour log-probs are already recorded).
        engine = self.generator.engine
        if engine.num_unfinished():
            raise RuntimeError("evaluation in a round mode needs an idle engine")
        _push_weights(engine, self.channel, self.trainer)
        return engine.generate(requests)

    def close(self) -> None:
        """Nothing runs in the background."""


class PipelineBatches:
    """`pipeline`: a generator thread, in-flight weight updates, FIFO groups to the trainer."""

    def __init__(
        self,
        generator: Generator,
        queue: GroupQueue,
        channel: WeightChannel,
        trainer: Trainer,
        batch_size: int,
        poll_s: float = 0.05,
    ) -> None:
        self.generator = generator
        self.queue = queue
        self.channel = channel
        self.trainer = trainer
        self.batch_size = batch_size
        self.poll_s = poll_s
        self._published = trainer.version

    def start(self) -> None:
        _push_weights(self.generator.engine, self.channel, self.trainer)
        self._published = self.trainer.version
        self.generator.start()

    def next_batch(self) -> list[ReadyGroup] | None:
        while True:
            self.generator.check()
            items = self.queue.get_batch(self.batch_size, timeout=self.poll_s)
            if items is not None:
                return items
            if self.generator.starved(self.batch_size):
                return None

    def after_step(self) -> None:
        # Called on the trainer thread; the engine applies the update between two decode steps
        # while the generator thread keeps going. A step that did not update publishes nothing.
        if self.trainer.version != self._published:
            self.channel.publish(self.trainer.weights_for_engine(), self.trainer.version)
            self._published = self.trainer.version

    def generate_for_eval(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        # The trainer is blocked in this call, so the weights cannot change during the evaluation.
        return self.generator.generate_side(requests, min_version=self.trainer.version)

    def close(self) -> None:
        self.generator.stop(timeout=60.0)
