"""Discrete-event simulation of the RL pipeline at scale: the real admission rule, modelled devices.

What is real: `StalenessController` (`staleness.py`, the pipeline's class with the admission rule
and cap of `SimConfig.admission` / `max_outstanding_groups`, as `pipeline.admission` /
`pipeline.max_outstanding_groups` configure a run) decides every admission, picks every batch and
checks it, with the calls the `Generator`, the batch sources and the `Driver` make (`capacity` at
the engines' version, `admit`, `select_batch` on the queued groups, `consume` at the start of a
step, `settle` after it); groups go whole to
the least-loaded engine (or, `placement="sample"`, each sample does) and the engines' version is
their minimum, as in `engine_pool.py`; the
three schedules follow `modes.py`:

* `sync` / `ppo_offpolicy` k: a round loads the trainer's weights into every engine, admits what
  the controller allows (k x B groups, max_lag k - 1), generates until all k x B are done, then the
  trainer takes k steps on mini-batches of B in completion order while the engines idle.
* `pipeline` k: engines never wait for the trainer; the trainer takes the B finished groups
  `select_batch` picks (the first B under the bounded rule, the oldest valid B under the deadline
  rule) whenever it is free; after every step the new weights go to every engine in flight (they arrive
  after `weight_transfer_s`, each engine applies them at its next decode-step boundary, pausing
  `weight_update_s`; sequences continue, their later tokens carry the new version); admission
  control (max_lag k) throttles the engines.

What is modelled (no sleeping: a virtual clock jumps from event to event):

* An engine decodes one token for each of its (at most `slots`) sequences per step, and a step
  lasts `slowdown * (decode_step_s + decode_token_s * in_flight)` (a memory-bound decode: weights
  are read once per step, every sequence adds its KV reads). Prefill and verification are not
  modelled (prompts are short next to thousands of generated tokens).
* Completion lengths: `scalerl.rollout.emulated.LengthModel` (lognormal, a factor shared by the n
  samples of a prompt), seeded per group, capped at `max_new_tokens` (truncation).
* A training step lasts `train_step_s + train_token_s * tokens` (tokens of its B x n samples).

Between two events an engine's batch is constant, so its state advances in closed form: the next
event is the earliest of its next completion and the first step boundary after new work or new
weights arrived. Reported (`SimResult`): generator idle fraction (time with nothing to run over
engine time), weight-update fraction, trainer idle fraction, trained samples/s and tokens/s, and
the version lag of every trained sample (trainer version minus its `start_version`, the quantity
max_lag bounds) and token (minus the version that generated it).
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from scalerl.pipeline.staleness import (
    ADMISSIONS,
    Admission,
    StalenessController,
    StalenessError,
    renew_blocking,
)
from scalerl.rollout.emulated import LengthModel

Mode = Literal["sync", "ppo_offpolicy", "pipeline"]
MODES: tuple[Mode, ...] = ("sync", "ppo_offpolicy", "pipeline")
_SEED_STRIDE = 1 << 32


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Defaults: the ScaleRL setting (arXiv 2510.13786: 64 generator GPUs, 48
    prompts x 16 generations per step, PipelineRL-8), with device times that are assumptions (see
    docs/scaleout_sim.md), not measurements."""

    mode: Mode = "pipeline"
    k: int = 8
    steps: int = 64
    prompts_per_step: int = 48
    n: int = 16
    num_engines: int = 64
    slots: int = 64
    max_new_tokens: int = 12288
    length: LengthModel = field(default_factory=lambda: LengthModel(3000.0, 0.5, 0.6))
    decode_step_s: float = 0.010
    decode_token_s: float = 0.0002
    train_step_s: float = 1.0
    train_token_s: float = 3.5e-6
    weight_transfer_s: float = 1.0
    weight_update_s: float = 0.5
    slowdowns: tuple[float, ...] = ()  # per engine (default 1.0 each)
    # "group": a group's n samples go to one engine (`ThreadedEnginePool`, one request of n);
    # "sample": each sample to the least-loaded engine (finer, what per-sample requests allow).
    placement: Literal["group", "sample"] = "group"
    # `pipeline` only: the controller's admission rule (`staleness.py`): "bounded" (worst-case
    # completion order), "deadline" (per-group deadlines; the trainer waits for needed groups) or
    # "partial" (deadlines; groups that would make the trainer wait are re-admitted instead).
    admission: Admission = "bounded"
    max_outstanding_groups: int = 0  # `pipeline.max_outstanding_groups` (0: no cap)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        positive = ("k", "steps", "prompts_per_step", "n", "num_engines", "slots", "max_new_tokens")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.mode == "ppo_offpolicy" and self.steps % self.k:
            raise ValueError(f"steps: ppo_offpolicy runs whole rounds, need a multiple of k={self.k}")
        times = ("decode_step_s", "decode_token_s", "train_step_s", "train_token_s", "weight_transfer_s",
                 "weight_update_s")
        for name in times:
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.decode_step_s + self.decode_token_s <= 0:
            raise ValueError("decode_step_s + decode_token_s: a decode step must take time")
        if self.slowdowns and len(self.slowdowns) != self.num_engines:
            raise ValueError(f"slowdowns: {len(self.slowdowns)} values for {self.num_engines} engines")
        if any(not s > 0 for s in self.slowdowns):
            raise ValueError(f"slowdowns: must be > 0, got {self.slowdowns}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission: expected one of {ADMISSIONS}, got {self.admission!r}")
        if self.max_outstanding_groups and (self.mode != "pipeline"
                                            or self.max_outstanding_groups < self.prompts_per_step):
            raise ValueError(f"max_outstanding_groups: 0 or >= prompts_per_step in pipeline mode, got "
                             f"{self.max_outstanding_groups} ({self.mode}, B={self.prompts_per_step})")
        if self.admission != "bounded" and self.mode != "pipeline":
            raise ValueError(f"admission: {self.admission!r} is a pipeline rule; {self.mode} runs rounds")
        if self.placement not in ("group", "sample"):
            raise ValueError(f"placement: expected 'group' or 'sample', got {self.placement!r}")

    @property
    def max_lag(self) -> int:
        """The controller's bound: k for `pipeline`, k - 1 for the round modes (sync: k = 1)."""
        return self.k if self.mode == "pipeline" else self.updates_per_round - 1

    @property
    def updates_per_round(self) -> int:
        return 1 if self.mode == "sync" else self.k


@dataclass
class SimResult:
    config: SimConfig
    seconds: float  # simulated time until the last step ended
    steps: int
    samples: int  # trained
    tokens: int  # trained (generated tokens of the trained samples)
    engine_busy_s: float  # summed over engines: decoding
    engine_update_s: float  # summed over engines: loading weights
    engine_slot_s: float  # summed over engines: sequences in flight x seconds
    trainer_busy_s: float
    sample_lags: Counter[int]  # lag -> trained samples
    token_lags: Counter[int]  # lag -> trained tokens
    truncated: int  # trained samples that hit max_new_tokens
    groups_admitted: int
    groups_consumed: int
    groups_outstanding: int  # admitted, not consumed: generating or queued at the end
    max_observed_lag: int  # the controller's own record
    groups_renewed: int = 0  # re-admissions of groups still generating (`partial`)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def engine_time_s(self) -> float:
        return self.config.num_engines * self.seconds

    @property
    def generator_idle_frac(self) -> float:
        """Engine time with nothing to run (neither decoding nor loading weights)."""
        return 1.0 - (self.engine_busy_s + self.engine_update_s) / self.engine_time_s

    @property
    def occupancy(self) -> float:
        """Mean fraction of the engines' slots in flight, over all engine time."""
        return self.engine_slot_s / (self.config.slots * self.engine_time_s)

    @property
    def update_frac(self) -> float:
        return self.engine_update_s / self.engine_time_s

    @property
    def trainer_idle_frac(self) -> float:
        return 1.0 - self.trainer_busy_s / self.seconds

    def lag_percentile(self, lags: Counter[int], q: float) -> int:
        """The smallest lag L with at least a fraction `q` of the mass at lags <= L."""
        total = sum(lags.values())
        seen = 0
        for lag in sorted(lags):
            seen += lags[lag]
            if seen >= q * total:
                return lag
        return 0

    def stale_token_frac(self) -> float:
        """Trained tokens more than max_lag versions older than the trainer (0 unless `partial`)."""
        total = sum(self.token_lags.values())
        stale = sum(c for lag, c in self.token_lags.items() if lag > self.config.max_lag)
        return stale / total if total else 0.0

    def lag_mean(self, lags: Counter[int]) -> float:
        total = sum(lags.values())
        return sum(lag * c for lag, c in lags.items()) / total if total else 0.0


# ---------------------------------------------------------------------------------------------- model
@dataclass(eq=False)
class _Group:
    gid: int
    admit_version: int
    size: int
    done: int = 0
    samples: list[_Sample] = field(default_factory=list)


@dataclass(eq=False)
class _Sample:
    group: _Group
    length: int
    truncated: bool
    start_version: int = -1
    start_step: int = -1
    token_versions: list[tuple[int, int]] = field(default_factory=list)  # (version, tokens)


class _Engine:
    """One generation device. `clock` is when its next decode step can start; `steps` counts its
    steps; `(history_steps[j], history_versions[j]) = (s, v)`: from its step `s + 1` on, tokens
    carry version `v`."""

    def __init__(self, index: int, slots: int, step_s: float, token_s: float, version: int) -> None:
        self.index = index
        self.slots = slots
        self.step_s = step_s
        self.token_s = token_s
        self.clock = 0.0
        self.steps = 0
        self.version = version
        self.history_steps = [0]
        self.history_versions = [version]
        self.active: list[tuple[int, int, _Sample]] = []  # heap of (finish step, tie, sample)
        self.waiting: deque[_Sample] = deque()
        self.inbox: list[_Sample] = []
        self.new_version: int | None = None  # weights that arrived, applied at the next boundary

        self.event = 0  # number of the scheduled event; older heap entries are stale
        self.busy_s = 0.0
        self.slot_s = 0.0  # sequence-seconds in flight
        self.update_s = 0.0

    @property
    def load(self) -> int:
        return len(self.active) + len(self.waiting) + len(self.inbox)

    @property
    def dt(self) -> float:
        return self.step_s + self.token_s * len(self.active)

    def next_event(self, now: float) -> float | None:
        """When this engine next needs attention, at a step boundary (None: idle, nothing coming)."""
        if not self.active:
            pending = self.inbox or self.waiting or self.new_version is not None
            return max(now, self.clock) if pending else None
        dt = self.dt
        finish = self.clock + (self.active[0][0] - self.steps) * dt
        if self.inbox or self.new_version is not None:
            # The first boundary at or after `now` (steps in progress complete first).
            ahead = max(0, math.ceil((now - self.clock) / dt - 1e-9))
            finish = min(finish, self.clock + ahead * dt)
        # Never before `now`: `clock + m * dt` may round a hair below the present.
        return max(now, finish)

    def advance(self, t: float) -> None:
        """Run the whole steps between `clock` and the boundary `t`."""
        if self.active and t > self.clock:
            dt = self.dt
            m = round((t - self.clock) / dt)
            self.steps += m
            self.busy_s += m * dt
            self.slot_s += m * dt * len(self.active)
        self.clock = max(self.clock, t)

    def pop_finished(self) -> list[_Sample]:
        done = []
        while self.active and self.active[0][0] == self.steps:
            _, _, sample = heapq.heappop(self.active)
            sample.token_versions = self._token_versions(sample.start_step + 1, self.steps)
            done.append(sample)
        return done

    def _token_versions(self, first: int, last: int) -> list[tuple[int, int]]:
        """(version, tokens) of the tokens made at steps `first..last`."""
        hs, vs = self.history_steps, self.history_versions
        j = bisect_left(hs, first) - 1  # the last change before step `first`
        out = []
        while j < len(hs) and hs[j] < last:
            lo = max(first, hs[j] + 1)
            hi = min(last, hs[j + 1]) if j + 1 < len(hs) else last
            if hi >= lo:
                out.append((vs[j], hi - lo + 1))
            j += 1
        return out

    def apply_inbox(self, update_s: float) -> None:
        """At a boundary: load arrived weights (pausing `update_s`), then queue arrived work."""
        if self.new_version is not None:
            self.version = self.new_version
            self.new_version = None
            if self.history_steps[-1] == self.steps:
                self.history_versions[-1] = self.version
            else:
                self.history_steps.append(self.steps)
                self.history_versions.append(self.version)
            self.clock += update_s
            self.update_s += update_s
        self.waiting.extend(self.inbox)
        self.inbox.clear()

    def fill_slots(self, ties: Iterator[int]) -> None:
        while self.waiting and len(self.active) < self.slots:
            sample = self.waiting.popleft()
            sample.start_version = self.version
            sample.start_step = self.steps
            heapq.heappush(self.active, (self.steps + sample.length, next(ties), sample))


class Simulation:
    """One run of `SimConfig` (see the module docstring); `run()` returns a `SimResult`."""

    def __init__(self, config: SimConfig) -> None:
        self.cfg = config
        c = config
        slowdowns = c.slowdowns or (1.0,) * c.num_engines
        self.engines = [
            _Engine(i, c.slots, s * c.decode_step_s, s * c.decode_token_s, 0) for i, s in enumerate(slowdowns)
        ]
        self.update_s = [s * c.weight_update_s for s in slowdowns]
        self.transfer_s = [s * c.weight_transfer_s for s in slowdowns]
        self.controller = StalenessController(c.max_lag, c.prompts_per_step, train_version=0,
                                              admission=c.admission,
                                              max_outstanding=c.max_outstanding_groups)

        self.now = 0.0
        # (time, order, kind, engine, event number or, for "weights", the version)
        self._heap: list[tuple[float, int, str, int, int]] = []
        self._order = 0
        self._ties = itertools.count()
        self.queue: deque[_Group] = deque()  # finished groups, in completion order
        self.generating: dict[int, _Group] = {}  # admitted groups not finished yet, by gid
        self.groups_renewed = 0
        self.next_gid = 0
        self.trainer_version = 0
        self.trainer_free = True
        self.trainer_busy_s = 0.0
        self.steps_done = 0
        self.round_steps = 0  # round modes: steps taken in the current round
        self.result_lags: Counter[int] = Counter()
        self.result_token_lags: Counter[int] = Counter()
        self.samples = 0
        self.tokens = 0
        self.truncated = 0
        self.groups_admitted = 0
        self.groups_consumed = 0
        self.end_time = 0.0

    # ------------------------------------------------------------------------------ events
    def _push(self, t: float, kind: str, engine: int = -1, event: int = 0) -> None:
        self._order += 1
        heapq.heappush(self._heap, (t, self._order, kind, engine, event))

    def _wake(self, e: _Engine) -> None:
        t = e.next_event(self.now)
        e.event += 1
        if t is not None:
            self._push(t, "engine", e.index, e.event)

    def _engine_event(self, e: _Engine) -> None:
        e.advance(self.now)
        for sample in e.pop_finished():
            group = sample.group
            group.done += 1
            if group.done == group.size:
                self.queue.append(group)
                del self.generating[group.gid]
        e.apply_inbox(self.update_s[e.index])
        e.fill_slots(self._ties)
        self._wake(e)

    # ------------------------------------------------------------------------------ generator side
    @property
    def engine_version(self) -> int:
        return min(e.version for e in self.engines)

    def _admit(self) -> None:
        version = self.engine_version
        room = self.controller.capacity(version)
        if room <= 0:
            return
        self.controller.admit(version, room)
        c = self.cfg
        touched = set()
        for _ in range(room):
            gid = self.next_gid
            self.next_gid += 1
            base = (c.seed * _SEED_STRIDE + gid) % (1 << 63)
            group = _Group(gid, version, c.n)
            self.generating[gid] = group
            group.samples = [
                _Sample(group, min(length, c.max_new_tokens), length > c.max_new_tokens)
                for length in c.length.draw(base, c.n)
            ]
            parts = [group.samples] if c.placement == "group" else [[x] for x in group.samples]
            for part in parts:
                target = min(self.engines, key=lambda e: (e.load, e.index))
                target.inbox.extend(part)
                touched.add(target.index)
        self.groups_admitted += room
        for i in sorted(touched):
            self._wake(self.engines[i])

    def _publish(self) -> None:
        """The trainer's weights leave for every engine; each gets them after its transfer time
        and applies them at its next step boundary."""
        for e in self.engines:
            self._push(self.now + self.transfer_s[e.index], "weights", e.index, self.trainer_version)

    def _weights_arrive(self, e: _Engine, version: int) -> None:
        if version > max(e.version, e.new_version if e.new_version is not None else -1):
            e.new_version = version
            self._wake(e)

    # ------------------------------------------------------------------------------ trainer side
    def _renew_blocking(self) -> None:
        """`partial`: `staleness.renew_blocking`, as `Generator.renew_blocking` calls it in a run."""
        queued = [g.admit_version for g in self.queue]
        moved = renew_blocking(self.controller, queued, self.generating.values(), self.engine_version,
                               order=lambda g: (g.admit_version, g.gid))
        self.groups_renewed += len(moved)

    def _batch_ready(self) -> bool:
        c = self.cfg
        if c.mode == "pipeline":
            if self.controller.partial_rollouts:
                self._renew_blocking()
            return self.controller.select_batch([g.admit_version for g in self.queue]) is not None
        if self.round_steps > 0:
            return len(self.queue) >= c.prompts_per_step
        # A round's first step waits for the whole round (`RoundBatches.next_batch` -> `fill`).
        return len(self.queue) >= c.updates_per_round * c.prompts_per_step

    def _take_batch(self) -> list[_Group]:
        """The B groups of the next step: those `select_batch` picks (pipeline: FIFO under the
        bounded rule, the oldest under the deadline rule), or the round's first B."""
        c = self.cfg
        if c.mode != "pipeline":
            return [self.queue.popleft() for _ in range(c.prompts_per_step)]
        pick = self.controller.select_batch([g.admit_version for g in self.queue])
        if pick is None:
            raise RuntimeError("simulation bug: a step started without a valid batch")
        chosen = set(pick)
        batch = [g for i, g in enumerate(self.queue) if i in chosen]
        self.queue = deque(g for i, g in enumerate(self.queue) if i not in chosen)
        return batch

    def _start_step(self) -> None:
        c = self.cfg
        batch = self._take_batch()
        self.controller.consume([g.admit_version for g in batch], self.trainer_version)
        self.groups_consumed += len(batch)
        tokens = 0
        partial = self.controller.partial_rollouts
        for group in batch:
            group_lag = self.trainer_version - group.admit_version
            if group_lag > c.max_lag:
                raise StalenessError(f"group {group.gid} was trained {group_lag} > {c.max_lag} versions "
                                     "after its (re-)admission")
            for sample in group.samples:
                lag = self.trainer_version - sample.start_version
                # `partial` bounds the segment since the group's last admission, not the first token.
                if lag > c.max_lag and not partial:
                    raise StalenessError(
                        f"a sample of group {group.gid} was trained {lag} > {c.max_lag} versions late"
                    )
                self.result_lags[lag] += 1
                for version, count in sample.token_versions:
                    self.result_token_lags[self.trainer_version - version] += count
                tokens += sample.length
                self.truncated += sample.truncated

        self.samples += c.prompts_per_step * c.n
        self.tokens += tokens
        seconds = c.train_step_s + c.train_token_s * tokens
        self.trainer_free = False
        self.trainer_busy_s += seconds
        self._push(self.now + seconds, "train")

    def _end_step(self) -> None:
        c = self.cfg
        self.trainer_version += 1
        self.controller.settle(self.trainer_version)
        self.trainer_free = True
        self.steps_done += 1
        self.end_time = self.now
        if c.mode == "pipeline":
            self._publish()
            return
        self.round_steps += 1
        if self.round_steps == c.updates_per_round:
            self.round_steps = 0
            self._publish()  # the next round's weights (`RoundBatches.next_batch`)

    # ------------------------------------------------------------------------------ loop
    def run(self) -> SimResult:
        c = self.cfg
        self._admit()
        while self.steps_done < c.steps:
            if not self._heap:
                raise RuntimeError(
                    f"simulation stalled at t={self.now:.3f}s: nothing scheduled, {len(self.queue)} groups "
                    f"queued, {self.controller.outstanding} outstanding"
                )
            t, _, kind, index, event = heapq.heappop(self._heap)
            if t < self.now:
                raise RuntimeError(f"simulation bug: an event at t={t} after t={self.now}")
            self.now = t
            if kind == "train":
                self._end_step()
            elif kind == "weights":
                self._weights_arrive(self.engines[index], event)
            elif self.engines[index].event == event:
                self._engine_event(self.engines[index])
            else:
                continue  # superseded by a later schedule of that engine
            if self.trainer_free and self.steps_done < c.steps and self._batch_ready():
                self._start_step()
            if self.steps_done < c.steps:
                self._admit()
        return self._result()

    def _result(self) -> SimResult:
        end = self.end_time
        busy = update = slot = 0.0
        for e in self.engines:
            # Accounted up to `end`: an engine decoding since its last event was busy until `end`;
            # one whose clock is past `end` is loading weights (the part after `end` is dropped).
            running = end - e.clock if e.active and e.clock < end else 0.0
            busy += e.busy_s + running
            slot += e.slot_s + running * len(e.active)
            update += e.update_s - max(0.0, e.clock - end)
        return SimResult(
            config=self.cfg,
            seconds=end,
            steps=self.steps_done,
            samples=self.samples,
            tokens=self.tokens,
            engine_busy_s=busy,
            engine_update_s=update,
            engine_slot_s=slot,
            trainer_busy_s=self.trainer_busy_s,
            sample_lags=self.result_lags,
            token_lags=self.result_token_lags,
            truncated=self.truncated,
            groups_admitted=self.groups_admitted,
            groups_consumed=self.groups_consumed,
            groups_outstanding=self.controller.outstanding,
            max_observed_lag=self.controller.max_observed_lag,
            groups_renewed=self.groups_renewed,
        )


def simulate(config: SimConfig) -> SimResult:
    """Run one simulated training run."""
    return Simulation(config).run()
