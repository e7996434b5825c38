"""The training driver: wires curriculum, engine, scorer, trainer, evaluator, metrics and checkpoints.

`Driver(settings, components).run()` trains until `max_steps` optimizer steps (counted as training
steps, including steps the trainer skipped for lack of signal), `max_time_s`, or the prompts run
out. Per step it takes B groups from the mode's batch source (`modes.py`), checks their staleness,
trains, hands the weights back (`pipeline`: in flight, every step; round modes: at the next round),
logs one `step` row, evaluates every `eval.every` steps (and at the start and the end), and calls
the checkpoint hook every `checkpoint.every` steps (and at the end). `pipeline.schedule`
`interleaved` runs the pipeline on this thread in a fixed order (`modes.InterleavedBatches`): two
runs with the same seed then log the same rows, wall-clock fields aside.

Checkpoint / resume: `state_dict()` is taken at a step boundary and holds the curriculum state,
the counters and the prompts that were admitted but not yet trained (in flight, being scored or
queued; in threaded `pipeline` mode the generator keeps running, and its bookkeeping is read under
its lock). Resuming (`resume_state=`, with the trainer restored from the same checkpoint) re-issues
those prompts first, so no prompt is consumed twice or skipped; their rollouts are regenerated
under the checkpoint's weights. Where the schedule is single-threaded and the engine can snapshot
itself, `snapshot()` also saves everything in flight (`snapshot.py`), and a resume from it
(`resume_snapshot=`) continues exactly as the uninterrupted run would have.

After each scheduled evaluation `Components.stop_after_eval(step)` may end the run there with
its reason (`forecast_known`: the live forecast pinned A; `pruned`: a study stopped the variant),
and after every other step `Components.stop_after_step(step)` (`pruned` only); the run then
evaluates if it has not just done so, writes its last checkpoint and records the reason.

Rollback on collapse: with `Components.collapse` (a `collapse.CollapseDetector`) each step row and
evaluation is shown to the detector, each checkpoint marked stable or not in its state, and every
step row stamped with the rollback history (`rollbacks`, `rollback_trigger`,
`rollback_steps_lost`). When it fires the run stops at once with `stop_reason` "rollback" and the
trigger in `RunResult.rollback`, with no final evaluation and no checkpoint of the diverged
weights; the composition root restores the last stable checkpoint (`assembly/rollback.py`).

Stopping from outside (`stop=`, a `preemption.StopRequest` set by SIGTERM / SIGINT) and the
wall-clock limit are checked between steps and inside the batch source's waits; either way the run
checkpoints where it stands. A stop by signal skips the final evaluation (the grace period is
short; the resumed run evaluates on schedule) and is recorded in the checkpoint (`stopped_by`).
Each step row lists the prompts it trained on (`prompt_ids`), so the metrics log itself shows that
no prompt was trained twice across resumes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from scalerl.config import EvalConfig, GenerationConfig, PipelineConfig, RewardConfig
from scalerl.data.records import PromptRecord
from scalerl.pipeline.collapse import CollapseDetector, Trigger
from scalerl.pipeline.dynamic_sampling import DynamicSampling
from scalerl.pipeline.faults import RunLength
from scalerl.pipeline.generator import Generator
from scalerl.pipeline.interfaces import GroupQueue, PromptSource, Trainer, WeightChannel
from scalerl.pipeline.local import EngineWeightChannel, LocalGroupQueue
from scalerl.pipeline.modes import BatchSource, InterleavedBatches, PipelineBatches, RoundBatches
from scalerl.pipeline.preemption import Interrupted, StopRequest
from scalerl.pipeline.shaping import LengthShaping
from scalerl.pipeline.staleness import StalenessController
from scalerl.pipeline.stats import IntervalMeter, batch_metrics, sample_rows
from scalerl.rewards.groups import GroupScorer, Scorer
from scalerl.rollout.fingerprint import channel_state, restore_channel_state
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest, SamplingParams
from scalerl.telemetry.compute import ComputeMeter

log = logging.getLogger(__name__)
STATE_VERSION = 1
GenerateFn = Callable[[Sequence[GenerationRequest]], list[Completion]]


class EvaluatorLike(Protocol):
    """`scalerl.evaluation.Evaluator`: runs its sets through `generate`, returns `val_*` metrics."""

    def run(self, generate: GenerateFn) -> dict[str, float]: ...


class MetricsSink(Protocol):
    """Where rows go (e.g. `scalerl.telemetry.RunTelemetry`)."""

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> Any: ...

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> Any: ...

    def log_samples(self, step: int, rows: list[Mapping[str, Any]]) -> None: ...


@dataclass
class Components:
    """Everything the driver does not build itself.

    `encode` maps a record to prompt token ids (chat template), `decode` completion ids to text
    for the verifier. `params` are the training sampling parameters (`n` = `generation.n`).
    `checkpoint(step, state)` persists the trainer with `state` as its extra state; when the
    pipeline can be snapshot exactly it is called as `checkpoint(step, state, snapshot=...)` (a
    mapping of tensors and plain values to store beside it, `snapshot.SNAPSHOT_FILE`).
    """

    engine: Engine
    trainer: Trainer
    source: PromptSource
    scorer: Scorer
    encode: Callable[[PromptRecord], list[int]]
    decode: Callable[[list[int]], str]
    params: SamplingParams
    evaluator: EvaluatorLike | None = None
    metrics: MetricsSink | None = None
    checkpoint: Callable[[int, dict[str, Any]], None] | None = None
    meter: ComputeMeter | None = None
    channel: WeightChannel | None = None
    queue: GroupQueue | None = None
    # Asked after each scheduled evaluation (its step): a reason to stop there ("forecast_known",
    # "pruned"), or None to go on. The composition root wires it (the live forecast, a study's
    # stop request); the driver only honours it: the run stops with that reason and checkpoints.
    stop_after_eval: Callable[[int], str | None] | None = None
    # Asked after every other step (no evaluation scheduled there): a reason to stop now, or None.
    # The root wires a study's stop request here, so a pruned run stops at its next step instead of
    # training on to its next evaluation; the run then evaluates once more and checkpoints.
    stop_after_step: Callable[[int], str | None] | None = None
    # The collapse detector (`collapse.py`), built by the root when `rollback.enabled`.
    collapse: CollapseDetector | None = None


@dataclass
class RunResult:
    steps: int
    # "max_steps", "max_time_s", "prompts_exhausted", "signal", or a reason `stop_after_eval` gave
    stop_reason: str
    signal: str | None = None  # "SIGTERM" / "SIGINT" when stop_reason is "signal"
    last_step: dict[str, float] = field(default_factory=dict)
    last_eval: dict[str, float] = field(default_factory=dict)
    max_version_lag: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    rollback: Trigger | None = None  # what fired when stop_reason is "rollback"
    stable_steps: list[int] = field(default_factory=list)  # checkpoints the detector judged stable


@dataclass(frozen=True)
class DriverSettings:
    """What the driver reads of a run's config: its own sections and the few scalars it enforces.

    Built by the composition root (`scalerl.assembly.sections.driver_settings`); the driver never
    sees the whole `RunConfig`. `generation` supplies `n`, `seed` and the length shaping
    (`length_control`, `max_new_tokens`); `rewards` the scorer's workers, failure reward and limits.
    """

    pipeline: PipelineConfig
    generation: GenerationConfig
    rewards: RewardConfig
    eval: EvalConfig
    max_steps: int
    max_time_s: float | None = None
    checkpoint_every: int = 0
    dynamic_sampling: bool = False
    max_consecutive_dropped_groups: int | None = 1000
    max_consecutive_noop_steps: int | None = None
    samples_every: int = 0  # logging.samples_every: every this many steps, a few samples as text
    samples_per_step: int = 4


def success_threshold(rewards: RewardConfig) -> float:
    """Reward above which a sample counts as a success for the curriculum: midway between the
    configured incorrect and correct rewards (0.5 for 0/1, 0 for -1/+1)."""
    return 0.5 * (rewards.correct_reward + rewards.incorrect_reward)


class Driver:
    def __init__(
        self,
        settings: DriverSettings,
        components: Components,
        *,
        start_step: int = 0,
        resume_state: Mapping[str, Any] | None = None,
        resume_snapshot: Mapping[str, Any] | None = None,
        stop: StopRequest | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        c = components
        pipe = settings.pipeline
        gen = settings.generation
        if c.params.n != gen.n:
            raise ValueError(f"params.n={c.params.n} but generation.n={gen.n}")
        if settings.dynamic_sampling and gen.n < 2:
            raise ValueError("algorithm.dynamic_sampling needs generation.n >= 2 (one sample: no variance)")
        self.settings = settings
        self.c = components
        self.clock = clock
        self.stop = stop if stop is not None else StopRequest()
        self._deadline: float | None = None
        self._stopped_by: str | None = None
        self._interval: IntervalMeter | None = None
        self._resume_interval: dict[str, int] | None = None
        self.step = int(start_step)
        self.evaluated_at: int | None = None
        # The largest version lag of the run's earlier sessions (restored on resume).
        self.prior_max_lag = 0
        self.batch_size = pipe.prompts_per_step
        self.queue = c.queue if c.queue is not None else LocalGroupQueue()
        self.channel = c.channel if c.channel is not None else EngineWeightChannel(c.engine)
        max_lag = pipe.k if pipe.off_policy == "pipeline" else self._updates_per_round() - 1
        self.controller = StalenessController(max_lag, self.batch_size, train_version=c.trainer.version,
                                              admission=pipe.admission,
                                              max_outstanding=pipe.max_outstanding_groups)
        threshold = success_threshold(settings.rewards)
        shaping = LengthShaping.from_generation(gen, threshold, version=lambda: c.trainer.version)
        self.group_scorer = GroupScorer(
            c.scorer,
            c.decode,
            max_workers=settings.rewards.max_workers,
            success_threshold=threshold,
            failure_reward=settings.rewards.failure_reward,
        )
        self.generator = Generator(
            c.engine,
            c.source,
            c.encode,
            c.params,
            self.group_scorer,
            self.controller,
            self.queue,
            dynamic_sampling=DynamicSampling(settings.dynamic_sampling),
            shaping=shaping.shape if shaping.active else None,
            seed=gen.seed,
            success_threshold=threshold,
            busy=(lambda: meter.busy("generator")) if (meter := c.meter) is not None else None,
            max_consecutive_failures=settings.rewards.max_consecutive_failures,
            max_consecutive_drops=settings.max_consecutive_dropped_groups,
        )
        self.noop_run = RunLength(settings.max_consecutive_noop_steps,
                                  "steps with every group filtered (no learning signal)",
                                  "optim.max_consecutive_noop_steps")
        if resume_state is not None:
            self.load_state_dict(resume_state)
        self.batches: BatchSource
        source_args = (self.generator, self.queue, self.channel, c.trainer, self.batch_size)
        # Round modes run on this thread already; only `pipeline` has a choice of schedule.
        self.interleaved = pipe.off_policy == "pipeline" and pipe.schedule == "interleaved"
        if self.interleaved:
            self.batches = InterleavedBatches(*source_args, pipe.decode_steps_per_train_step)
        elif pipe.off_policy == "pipeline":
            self.batches = PipelineBatches(*source_args)
        else:
            self.batches = RoundBatches(*source_args, self._updates_per_round())
        self.batches.should_stop = lambda: self._stop_reason() is not None
        self.resumed_exactly = False
        if resume_snapshot is not None:
            self.resumed_exactly = self._restore_snapshot(resume_snapshot)

    def _updates_per_round(self) -> int:
        pipe = self.settings.pipeline
        return 1 if pipe.off_policy == "sync" else pipe.k

    # ------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-able pipeline state at a step boundary (see module docstring)."""
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "mode": self.settings.pipeline.off_policy,
            "generator": self.generator.state_dict(),
            "meter": self.c.meter.state_dict() if self.c.meter is not None else None,
            # The metrics log kept this step's eval row (if any): a resume must not log it twice.
            "evaluated_at": self.evaluated_at,
            "max_version_lag": max(self.prior_max_lag, self.controller.max_observed_lag),
            # The generator counters at the last step row: the next row's deltas start there.
            "interval_counters": self._interval.counters() if self._interval is not None else None,
            "stopped_by": self._stopped_by,
            "noop_run": self.noop_run.count,
            # The weight channel's syncs and their checks so far (`fingerprint.channel_state`).
            "channel": channel_state(self.channel) if hasattr(self.channel, "verification") else None,
            "collapse": self.c.collapse.state_dict() if self.c.collapse is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"pipeline state: expected version {STATE_VERSION}, got {state.get('version')}")
        self.step = int(state["step"])
        self.evaluated_at = state.get("evaluated_at")
        self.prior_max_lag = int(state.get("max_version_lag", 0))
        self.generator.load_state_dict(dict(state["generator"]))
        if self.c.meter is not None and state.get("meter") is not None:
            self.c.meter.load_state_dict(state["meter"])
        self.noop_run.count = int(state.get("noop_run", 0))
        if state.get("channel") is not None and hasattr(self.channel, "verification"):
            restore_channel_state(self.channel, state["channel"])
        if self.c.collapse is not None and state.get("collapse") is not None:
            self.c.collapse.load_state_dict(state["collapse"])
        if state.get("interval_counters") is not None:
            self._resume_interval = {k: int(v) for k, v in state["interval_counters"].items()}

    def snapshot(self) -> dict[str, Any] | None:
        """The pipeline in flight, for an exact resume (`snapshot.py`), or None where the schedule
        or the engine does not allow one (the JSON state's re-issue list then serves)."""
        from scalerl.pipeline.snapshot import SNAPSHOT_VERSION, SnapshotEngine, engine_state_to_plain

        engine = self.c.engine
        if not isinstance(engine, SnapshotEngine) or self.generator.running:
            return None
        generator = self.generator.snapshot()
        if generator is None:
            return None
        return {
            "version": SNAPSHOT_VERSION,
            "step": self.step,
            "generator": generator,
            "controller": self.controller.state_dict(),
            "batches": self.batches.state_dict(),
            "engine": engine_state_to_plain(
                engine.snapshot(include_weights=engine.version != self.c.trainer.version)),
        }

    def _restore_snapshot(self, snap: Mapping[str, Any]) -> bool:
        from scalerl.pipeline.snapshot import SNAPSHOT_VERSION, SnapshotEngine, engine_state_from_plain

        engine = self.c.engine
        why = None
        if snap.get("version") != SNAPSHOT_VERSION:
            why = f"snapshot version {snap.get('version')!r}, expected {SNAPSHOT_VERSION}"
        elif int(snap.get("step", -1)) != self.step:
            why = f"snapshot of step {snap.get('step')}, checkpoint of step {self.step}"
        elif not isinstance(engine, SnapshotEngine):
            why = f"the engine ({type(engine).__name__}) cannot restore one"
        if why is None:
            try:
                engine.restore(engine_state_from_plain(snap["engine"]))
            except ValueError as err:
                why = str(err)
        if why is not None:
            log.warning("pipeline snapshot not used (%s): the outstanding prompts are re-issued instead", why)
            return False
        self.generator.restore_snapshot(dict(snap["generator"]))
        self.controller.load_state_dict(snap["controller"])
        self.batches.load_state_dict(snap["batches"])
        return True

    def _save(self) -> None:
        if self.c.collapse is not None:
            self.c.collapse.mark_checkpoint(self.step)
        state = self.state_dict()
        snap = self.snapshot()
        if self.c.checkpoint is None:
            return
        if snap is None:
            self.c.checkpoint(self.step, state)
        else:
            self.c.checkpoint(self.step, state, snapshot=snap)

    def _stop_reason(self) -> str | None:
        """Why the run must stop now ("signal", "max_time_s"), or None."""
        if self.stop.requested:
            return "signal"
        if self._deadline is not None and self.clock() >= self._deadline:
            return "max_time_s"
        return None

    # ------------------------------------------------------------------------------ evaluation
    def _evaluate(self) -> dict[str, float]:
        if self.c.evaluator is None:
            return {}
        metrics = self.c.evaluator.run(self.batches.generate_for_eval)
        metrics["version"] = float(self.c.trainer.version)
        if self.c.metrics is not None:
            self.c.metrics.log_eval(self.step, metrics)
        return metrics

    # ------------------------------------------------------------------------------ the loop
    def _train_step(self, items: list[Any], interval: IntervalMeter) -> dict[str, float]:
        trainer = self.c.trainer
        train_version = trainer.version
        self.generator.consume(items, train_version)
        metrics = batch_metrics(items, train_version)
        metrics.update(interval.lap())
        trained = trainer.step([it.group for it in items])
        self.controller.settle(trainer.version)
        self.batches.after_step()
        if self.c.meter is not None:
            self.c.meter.add_generation(
                int(metrics["gen_tokens"]), int(metrics["gen_samples"]), int(metrics["gen_prompt_tokens"])
            )
        # The trainer's own `version_lag_*` is per token; the pipeline's keys (staleness from each
        # sample's start, the quantity max_lag bounds, except under `admission: partial`, which bounds
        # the lag from a group's last re-admission) take precedence, per-token lag is `token_lag_*`.
        row = {**trained, **metrics}
        row["prompt_ids"] = [it.group.record.id for it in items]
        row["train_version"] = float(train_version)
        row["queue_groups"] = float(len(self.queue))
        row["outstanding_groups"] = float(self.controller.outstanding)
        # 1 when the trainer had B groups queued but waited for a group at its deadline
        # (`pipeline.admission: deadline`; always 0 under the bounded rule).
        row["deadline_wait"] = float(self.batches.deadline_wait)
        # Groups re-admitted so far instead of waited for (`pipeline.admission: partial`).
        row["groups_renewed_total"] = float(self.generator.counters.groups_renewed)
        return row

    def run(self) -> RunResult:
        cfg = self.settings
        self._deadline = None if cfg.max_time_s is None else self.clock() + cfg.max_time_s
        result = RunResult(steps=self.step, stop_reason="max_steps")
        # A resumed run's starting step is already checkpointed: saving it again would rewrite it.
        saved_at: int | None = self.step if self.step > 0 else None
        # The meter starts before the generator so that every generated token lands in some step's
        # row (and in the compute totals), including those generated during the first evaluation.
        interval = self._interval = IntervalMeter(self.generator, tick_idle=self.interleaved,
                                                  counters=self._resume_interval)
        try:
            self.batches.start()
            at_start = cfg.eval.at_start and self.step == 0 and self.evaluated_at != 0
            if at_start and self.c.evaluator is not None and self._stop_reason() is None:
                result.last_eval, self.evaluated_at = self._evaluate(), 0
            while self.step < cfg.max_steps:
                reason = self._stop_reason()
                if reason is not None:
                    result.stop_reason = reason
                    break
                # Evaluation and checkpoints stay outside the meter: they are not training compute
                # (the x axis of the scaling fits).
                with self.c.meter.running() if self.c.meter is not None else contextlib.nullcontext():
                    try:
                        items = self.batches.next_batch()
                    except Interrupted:
                        items = None
                    if items is None:
                        result.stop_reason = self._stop_reason() or "prompts_exhausted"
                        break
                    row = self._train_step(items, interval)
                self.step += 1
                if self.c.collapse is not None:
                    row.update(self.c.collapse.history.row_fields())
                if self.c.metrics is not None:
                    self.c.metrics.log_step(self.step, row)
                    if cfg.samples_every and self.step % cfg.samples_every == 0:
                        self.c.metrics.log_samples(self.step, sample_rows(
                            items, int(row["train_version"]), self.group_scorer.decode, cfg.samples_per_step))
                result.last_step = row
                self.noop_run.add(bool(row.get("skipped_no_signal")))
                self.noop_run.check(f"step {self.step}")
                if self.c.collapse is not None:
                    result.rollback = self.c.collapse.observe_step(self.step, row)
                scheduled = self.c.evaluator is not None and self.step % cfg.eval.every == 0
                if result.rollback is None and scheduled:
                    result.last_eval, self.evaluated_at = self._evaluate(), self.step
                    if self.c.collapse is not None:
                        result.rollback = self.c.collapse.observe_eval(self.step, result.last_eval)
                if result.rollback is not None:
                    # Diverged: nothing more of this trajectory is evaluated or saved.
                    result.stop_reason = "rollback"
                    break
                if self.c.evaluator is not None and self.step % cfg.eval.every == 0:
                    hook = self.c.stop_after_eval
                else:  # the last step ends the run anyway (with its own stop reason)
                    hook = self.c.stop_after_step if self.step < cfg.max_steps else None
                if hook is not None:
                    asked = hook(self.step)
                    if asked is not None:
                        result.stop_reason = self._stopped_by = asked
                        break
                every = cfg.checkpoint_every
                # The last step's checkpoint waits for the final evaluation below: a checkpoint at
                # max_steps is what `--resume` takes for a finished run, so one saved before that
                # evaluation and followed by a kill would leave the curve without its last point.
                last = self.step >= cfg.max_steps
                if self.c.checkpoint is not None and every and self.step % every == 0 and not last:
                    self._save()
                    saved_at = self.step
            if result.stop_reason == "signal":
                result.signal = self._stopped_by = self.stop.reason
            # The run's last point on the curve and its last checkpoint, whatever stopped it (a
            # signal's grace period is short: its resumed run evaluates on schedule instead).
            final_eval = result.stop_reason not in ("signal", "rollback") and self.evaluated_at != self.step
            if self.c.evaluator is not None and final_eval:
                result.last_eval, self.evaluated_at = self._evaluate(), self.step
                if self.c.collapse is not None and result.stop_reason != "signal":
                    result.rollback = self.c.collapse.observe_eval(self.step, result.last_eval)
                    if result.rollback is not None:
                        result.stop_reason = "rollback"
            if self.c.checkpoint is not None and self.step > 0 and result.stop_reason != "rollback" and (
                saved_at != self.step or self._stopped_by is not None
            ):
                self._save()
        finally:
            self.batches.close()
            self.group_scorer.close()
        result.steps = self.step
        result.max_version_lag = max(self.prior_max_lag, self.controller.max_observed_lag)
        result.counters = self.generator.counters.as_dict()
        if self.c.collapse is not None:
            result.stable_steps = list(self.c.collapse.stable_steps)
        return result


def run_training(settings: DriverSettings, components: Components, **kwargs: Any) -> RunResult:
    """Build a `Driver` and run it."""
    return Driver(settings, components, **kwargs).run()
