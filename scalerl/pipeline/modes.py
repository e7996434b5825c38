"""The three off-policy schedules, as sources of training batches.

* `sync` (`RoundBatches` with k = 1): generate B groups with the current weights, one update.
* `ppo_offpolicy` k (`RoundBatches`): generate k x B groups with one policy, then k updates on
  mini-batches of B groups in completion order, then load the new weights (Qwen3 / ProRL style).
  The engine is idle while the trainer works; weights are loaded between rounds. A colocated
  engine (`SleepingChannel`) sleeps from the end of a round's generation to the next round (and
  around each evaluation), so the trainer has the device memory meanwhile.
* `pipeline` k (PipelineRL): the generator streams rollouts without pause; after every optimizer
  step the new weights go to the engine in flight; groups reach the trainer as they finish;
  admission control keeps every group within k versions of its start. Two schedules:
  `PipelineBatches` (`threaded`) runs the generator on its own thread, so which weights sampled
  which token depends on thread timing; `InterleavedBatches` (`interleaved`) runs both on the
  driver's thread in a fixed order, so a seed reproduces the run.

The driver is mode-blind: `start()`, then per step `next_batch()` -> train -> `after_step()`;
`generate_for_eval()` runs evaluation requests at the trainer's current version. `should_stop`
(set by the driver: a signal, the wall-clock limit) is polled inside `next_batch()`'s waits, which
then raise `Interrupted` at a point whose state a checkpoint can hold (`preemption.py`).
`state_dict()` / `load_state_dict()` carry the schedule's own clock for an exact resume
(`snapshot.py`); a restored source does not push weights at `start()`, since the engine's
snapshot already holds the weights it was generating with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from scalerl.pipeline.generator import Generator
from scalerl.pipeline.interfaces import (
    GroupQueue,
    ReadyGroup,
    Selector,
    SleepingChannel,
    Trainer,
    WeightChannel,
)
from scalerl.pipeline.preemption import Interrupted
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest

# How often the trainer thread looks for groups to re-admit while it waits (`admission: partial`).
_PARTIAL_POLL_S = 0.002


class BatchSource(Protocol):
    def start(self) -> None: ...

    def next_batch(self) -> list[ReadyGroup] | None:
        """The next B groups, or None when the prompts ran out before B could be assembled."""
        ...

    def after_step(self) -> None: ...

    def generate_for_eval(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    def close(self) -> None: ...

    should_stop: Callable[[], bool]
    deadline_wait: bool

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def _push_weights(engine: Engine, channel: WeightChannel, trainer: Trainer) -> None:
    if isinstance(channel, SleepingChannel):
        # Colocated: the engine may sleep; it wakes holding the trainer's version (loading the
        # weights only when its own are stale or were discarded).
        channel.prepare(trainer.weights_for_engine, trainer.version)
    elif engine.version != trainer.version:
        channel.publish(trainer.weights_for_engine(), trainer.version)


def _release_engine(channel: WeightChannel) -> None:
    """The engine has nothing to generate until the next round: a colocated one frees its device
    memory for the trainer (`SleepingChannel.release`); any other keeps going."""
    if isinstance(channel, SleepingChannel):
        channel.release()


def _refuse_sleeping(channel: WeightChannel, schedule: str) -> None:
    if isinstance(channel, SleepingChannel):
        raise ValueError(f"the {schedule} schedule generates while the trainer steps: a colocated engine "
                         "(generation.vllm.colocate) needs pipeline.off_policy=sync or ppo_offpolicy")


class _Batches:
    """What every schedule drives: the generator, the queue of scored groups, the weight channel
    and the trainer whose versions it publishes, B groups per optimizer step."""

    def __init__(
        self,
        generator: Generator,
        queue: GroupQueue,
        channel: WeightChannel,
        trainer: Trainer,
        batch_size: int,
    ) -> None:
        self.generator = generator
        self.queue = queue
        self.channel = channel
        self.trainer = trainer
        self.batch_size = batch_size
        self._published = trainer.version
        self.should_stop: Callable[[], bool] = lambda: False
        self._restored = False
        # Which queued groups make the next batch: FIFO under the bounded rule; under the deadline
        # rule the oldest, once they include every group the step needs (`staleness.py`).
        controller = generator.controller
        self.select: Selector | None = None
        if controller.deadline_rule:
            self.select = lambda items: controller.select_batch([it.admit_version for it in items])
        # Whether the last `next_batch()` found B groups queued but no valid batch among them, i.e.
        # the trainer waited for a group at its deadline (the deadline rule's cost, a step row field).
        self.deadline_wait = False

    def _check_stop(self, where: str) -> None:
        if self.should_stop():
            raise Interrupted(where)

    def state_dict(self) -> dict[str, Any]:
        return {"published": self._published}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._published = int(state["published"])
        self._restored = True


class RoundBatches(_Batches):
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
        super().__init__(generator, queue, channel, trainer, batch_size)
        self.updates_per_round = updates_per_round
        self.rounds = 0
        self._filling = False  # a round's fill was interrupted (a stop) and is not finished

    def start(self) -> None:
        if not self._restored:
            _push_weights(self.generator.engine, self.channel, self.trainer)

    def next_batch(self) -> list[ReadyGroup] | None:
        if self._filling or len(self.queue) < self.batch_size:
            if not self._filling:
                # A new round: the previous one is fully consumed, so no rollout of it can see the
                # weights loaded here.
                _push_weights(self.generator.engine, self.channel, self.trainer)
                self.rounds += 1
                self._filling = True
            # An interrupted fill resumes here, with the round's weights and target unchanged.
            self.generator.fill(self.updates_per_round * self.batch_size, self.should_stop)
            self._filling = False
            # The round's rollouts are all finished: the trainer's k steps come next.
            _release_engine(self.channel)
        return self.queue.get_batch(self.batch_size, timeout=0)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounds": self.rounds, "filling": self._filling}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds = int(state["rounds"])
        self._filling = bool(state["filling"])

    def after_step(self) -> None:
        """Weights wait for the next round (the round's remaining mini-batches share one policy)."""

    def generate_for_eval(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        # The engine is idle between steps; loading the newest weights mid-round is harmless because
        # the round's rollouts are all finished (their behaviour log-probs are already recorded).
        engine = self.generator.engine
        if engine.num_unfinished():
            raise RuntimeError("evaluation in a round mode needs an idle engine")
        _push_weights(engine, self.channel, self.trainer)
        try:
            return engine.generate(requests)
        finally:
            _release_engine(self.channel)

    def close(self) -> None:
        """Nothing runs in the background."""


class PipelineBatches(_Batches):
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
        _refuse_sleeping(channel, "pipeline")
        super().__init__(generator, queue, channel, trainer, batch_size)
        self.poll_s = poll_s

    def start(self) -> None:
        _push_weights(self.generator.engine, self.channel, self.trainer)
        self._published = self.trainer.version
        self.generator.start()

    def next_batch(self) -> list[ReadyGroup] | None:
        self.deadline_wait = False
        # Partial rollouts re-admit blocking groups from this thread (the generator's lock comes
        # before the queue's), so it looks again soon rather than at the next queued group.
        partial = self.generator.controller.partial_rollouts
        poll_s = min(self.poll_s, _PARTIAL_POLL_S) if partial else self.poll_s
        while True:
            self.generator.check()
            self._check_stop("waiting for a batch")
            self.generator.renew_blocking()
            items = self.queue.get_batch(self.batch_size, timeout=poll_s, select=self.select)
            if items is not None:
                return items
            self.deadline_wait |= len(self.queue) >= self.batch_size
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


class InterleavedBatches(_Batches):
    """`pipeline`, deterministic: generator and trainer take turns on the driver's thread.

    Time is counted in generator ticks (one engine step, or one idle pass when the engine has
    nothing to run). The rule: whenever the trainer is free and B groups are queued, it takes them;
    otherwise the generator ticks. An optimizer step occupies the trainer for `train_ticks` ticks,
    during which the generator keeps decoding with the weights it has; at the end of them the new
    weights go to the engine in flight (sequences mid-generation keep their KV cache, their next
    tokens carry the new version), and only then can the trainer take the next batch. Which
    weights sample which token is thus a function of the token stream and `train_ticks`.

    `train_ticks = 0` is a trainer infinitely fast next to generation: the generation-bound regime
    (the trainer waits for data; lag comes only from groups that finish while others generate). A
    positive value also models the trainer-bound regime, where groups queue up while the trainer
    works and admission control throttles the generator (ticks it idles are `idle_ticks`).
    Verification finishes within the tick that completed a group (`Generator.tick`).
    """

    def __init__(
        self,
        generator: Generator,
        queue: GroupQueue,
        channel: WeightChannel,
        trainer: Trainer,
        batch_size: int,
        train_ticks: int = 0,
    ) -> None:
        if train_ticks < 0:
            raise ValueError(f"train_ticks: must be >= 0, got {train_ticks}")
        _refuse_sleeping(channel, "interleaved pipeline")
        super().__init__(generator, queue, channel, trainer, batch_size)
        self.train_ticks = train_ticks
        self.ticks = 0
        self._trainer_free_at = 0  # tick at which the step in progress ends and its weights land
        self._idle_free_ticks = 0

    def start(self) -> None:
        if self._restored:
            return
        _push_weights(self.generator.engine, self.channel, self.trainer)
        self._published = self.trainer.version

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "ticks": self.ticks, "trainer_free_at": self._trainer_free_at,
                "idle_free_ticks": self._idle_free_ticks}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.ticks = int(state["ticks"])
        self._trainer_free_at = int(state["trainer_free_at"])
        self._idle_free_ticks = int(state["idle_free_ticks"])

    @property
    def trainer_busy(self) -> bool:
        return self.ticks < self._trainer_free_at

    def _publish_if_done(self) -> None:
        # A step that did not update publishes nothing, as in the threaded schedule.
        if not self.trainer_busy and self.trainer.version != self._published:
            self.channel.publish(self.trainer.weights_for_engine(), self.trainer.version)
            self._published = self.trainer.version

    def _tick(self, waiting_for: str) -> None:
        was_busy = self.trainer_busy
        stepped = self.generator.tick()
        self.ticks += 1
        self._publish_if_done()
        if stepped or was_busy:
            self._idle_free_ticks = 0
            return
        # The trainer was free and the engine had nothing to run. The only thing such a tick can
        # change is to find the prompts exhausted (the caller then sees `starved`), so a second one
        # in a row would repeat forever: admission control cannot get here (staleness.py), a bug can.
        self._idle_free_ticks += 1
        if self._idle_free_ticks > 1:
            raise RuntimeError(
                f"interleaved schedule stalled waiting for {waiting_for}: the engine is idle and "
                f"admission is blocked (engine version {self.generator.engine.version}, next train "
                f"version {self.generator.controller.next_train_version}, {len(self.queue)} groups queued)"
            )

    def next_batch(self) -> list[ReadyGroup] | None:
        self.deadline_wait = False
        while True:
            if not self.trainer_busy:
                if len(self.queue) >= self.batch_size:
                    self.generator.renew_blocking()
                    items = self.queue.get_batch(self.batch_size, timeout=0, select=self.select)
                    if items is not None:
                        return items
                    self.deadline_wait = True
                if self.generator.starved(self.batch_size):
                    return None
            self._check_stop("between two ticks")
            self._tick("a batch")

    def after_step(self) -> None:
        self._trainer_free_at = self.ticks + self.train_ticks
        self._publish_if_done()

    def generate_for_eval(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        # The requests wait for the weights of the step just taken (they land once its simulated
        # time is over) and then ride along with the training rollouts; the trainer takes no batch
        # until they are done, as in the threaded schedule.
        future = self.generator.submit_side(requests, min_version=self.trainer.version)
        while not future.done():
            self._tick("an evaluation")
        return future.result()

    def close(self) -> None:
        """Nothing runs in the background."""
