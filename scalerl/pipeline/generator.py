"""The generator loop: admit prompts, step the engine, assemble groups, score, hand them over.

One iteration: (1) take the groups the scorer finished, report their rewards to the curriculum,
let dynamic sampling keep or drop each, shape the kept ones' rewards (length control) and queue
them for the trainer; (2) admit as many new
prompts as the staleness controller allows (re-issued prompts from a resume first, then fresh
draws, drawn as `refill` when they replace dropped groups); (3) submit waiting side requests
(evaluation); (4) run one engine step if the engine has work and route the finished samples: a
group whose `n` samples are all done goes to the scorer.

`pipeline` mode with the `threaded` schedule runs the loop on its own thread (`start()`/`stop()`),
never pausing for the trainer; with the `interleaved` schedule the driver's thread calls `tick()`
(one iteration, then a wait for the verifier) between optimizer steps, in an order fixed by the
token stream (see `modes.InterleavedBatches`); `sync` and `ppo_offpolicy` call `fill(target)` on
the driver's thread between training rounds. The same admission rule serves all of them (see
`staleness.py`).

Every admitted group ends exactly one way, and each is counted: consumed by the trainer, dropped
by dynamic sampling, or (at a checkpoint) outstanding, to be re-issued on resume.

Idle time is the time the engine had nothing to run (no sequence queued or in flight) while the
loop was not inside an engine step: in `pipeline` mode it measures starvation by admission control,
in the round modes it includes the whole training phase, which is the point of comparing them.
The interleaved schedule also counts ticks (`engine_steps`, `idle_ticks`), its simulated time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields, replace
from typing import Any

from scalerl.data.pool import PoolExhaustedError
from scalerl.data.records import PromptRecord
from scalerl.pipeline.dynamic_sampling import DynamicSampling
from scalerl.pipeline.faults import FaultLimitError, RunLength
from scalerl.pipeline.interfaces import GroupQueue, PromptSource, ReadyGroup
from scalerl.pipeline.preemption import Interrupted
from scalerl.pipeline.staleness import StalenessController, renew_blocking
from scalerl.rewards.groups import GroupScorer
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest, SamplingParams
from scalerl.training.batch import ScoredGroup
from scalerl.training.threads import same_threads_as_caller

TRAIN_PREFIX = "train/"
_SEED_STRIDE = 1 << 32


@dataclass
class GeneratorCounters:
    """Cumulative counts (carried across a resume by the driver's state)."""

    prompts_drawn: int = 0  # fresh records from the curriculum, refills included
    refill_prompts: int = 0  # of which drawn to replace groups dynamic sampling dropped
    prompts_reissued: int = 0  # outstanding prompts of a checkpoint, admitted again after resume
    groups_admitted: int = 0
    groups_scored: int = 0
    groups_kept: int = 0
    groups_dropped: int = 0  # by dynamic sampling
    groups_consumed: int = 0
    groups_renewed: int = 0  # re-admissions of groups still generating (`pipeline.admission: partial`)
    samples_generated: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    verifier_failures: int = 0
    engine_steps: int = 0  # engine steps the loop ran (one token per sequence in flight)
    idle_ticks: int = 0  # interleaved schedule: ticks with nothing for the engine to run

    def as_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}

    def load(self, state: dict[str, Any]) -> None:
        for f in fields(self):
            setattr(self, f.name, int(state.get(f.name, 0)))


@dataclass
class _OpenGroup:
    ticket: int
    record: PromptRecord
    admit_version: int
    slots: list[Completion | None]
    already_reported: bool

    @property
    def done(self) -> bool:
        return all(c is not None for c in self.slots)


@dataclass
class _Outstanding:
    record: PromptRecord
    reported: bool


class _SideJob:
    def __init__(self, requests: Sequence[GenerationRequest], min_version: int) -> None:
        self.requests = list(requests)
        self.min_version = min_version
        self.future: Future[list[Completion]] = Future()
        self.results: dict[tuple[str, int], Completion] = {}
        self.expected = [(r.request_id, i) for r in self.requests for i in range(r.params.n)]


class Generator:
    """Drives one engine for training rollouts (and, in `pipeline` mode, side requests)."""

    def __init__(
        self,
        engine: Engine,
        source: PromptSource,
        encode: Callable[[PromptRecord], list[int]],
        params: SamplingParams,
        scorer: GroupScorer,
        controller: StalenessController,
        queue: GroupQueue,
        *,
        dynamic_sampling: DynamicSampling | None = None,
        shaping: Callable[[list[float], list[int]], list[float]] | None = None,
        seed: int | None = 0,
        success_threshold: float = 0.0,
        idle_poll_s: float = 0.05,
        clock: Callable[[], float] = time.perf_counter,
        busy: Callable[[], AbstractContextManager[Any]] | None = None,
        max_consecutive_failures: int | None = None,
        max_consecutive_drops: int | None = None,
    ) -> None:
        self.engine = engine
        self.source = source
        self.encode = encode
        self.params = params
        self.scorer = scorer
        self.controller = controller
        self.queue = queue
        self.sampling = dynamic_sampling or DynamicSampling(False)
        self.shaping = shaping
        self.seed = seed
        self.success_threshold = success_threshold
        self.idle_poll_s = idle_poll_s
        self.clock = clock
        # E.g. `meter.busy("generator")`: the compute meter's per-role busy time.
        self.busy = busy or contextlib.nullcontext
        self.counters = GeneratorCounters()
        # Faults in a row (`faults.py`): failed verifier calls (samples), groups dropped.
        self.failure_run = RunLength(max_consecutive_failures, "verifier calls failed",
                                     "rewards.max_consecutive_failures")
        self.drop_run = RunLength(max_consecutive_drops, "groups dropped by dynamic sampling",
                                  "algorithm.max_consecutive_dropped_groups")

        self._next_ticket = 0
        self._open: dict[str, _OpenGroup] = {}  # request id -> group still generating
        self._scoring: dict[str, _OpenGroup] = {}  # request id -> group being scored
        self._outstanding: dict[int, _Outstanding] = {}  # ticket -> not yet consumed nor dropped
        self._reissue: deque[_Outstanding] = deque()
        self._owed_refills = 0
        self.exhausted = False

        self._side_waiting: deque[_SideJob] = deque()
        self._side_running: dict[str, _SideJob] = {}

        # Guards the curriculum and the bookkeeping above against `state_dict()` from the trainer
        # thread; never held across an engine step.
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

        self._time_lock = threading.Lock()
        self._busy_s = 0.0
        self._idle_s = 0.0
        self._idle_since: float | None = clock()

        scorer.on_ready = self.wake
        controller.set_on_change(self.wake)

    # ------------------------------------------------------------------------------ time accounting
    def _set_idle(self, idle: bool) -> None:
        now = self.clock()
        with self._time_lock:
            if idle and self._idle_since is None:
                self._idle_since = now
            elif not idle and self._idle_since is not None:
                self._idle_s += now - self._idle_since
                self._idle_since = None

    def timing(self) -> tuple[float, float]:
        """(busy seconds inside engine steps, idle seconds with nothing to run), cumulative."""
        now = self.clock()
        with self._time_lock:
            idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
            return self._busy_s, idle

    # ------------------------------------------------------------------------------ one iteration
    def wake(self) -> None:
        self._wake.set()

    def _iteration(self) -> bool:
        """One pass of the loop; True if the engine ran a step."""
        self._finalize_scored()
        self._admit()
        self._submit_side_jobs()
        if self.engine.num_unfinished() == 0:
            self._set_idle(True)
            return False
        self._set_idle(False)
        start = self.clock()
        with self.busy():
            finished = self.engine.step()
        elapsed = self.clock() - start
        with self._time_lock:
            self._busy_s += elapsed
        with self._lock:
            self.counters.engine_steps += 1
        self._route(finished)
        return True

    def tick(self) -> bool:
        """Interleaved schedule: one iteration on the caller's thread, then wait for the verifier.

        After it returns every group the engine finished is scored, kept (queued) or dropped, in
        admission order, so the state depends only on the token stream, not on verifier threads
        (they still score one tick's samples in parallel). True if the engine ran a step; a tick
        with nothing to run counts as idle (`counters.idle_ticks`).
        """
        if self.running:
            raise RuntimeError("tick: the generator thread is running (threaded schedule)")
        stepped = self._iteration()
        self.scorer.drain()
        self._finalize_scored()
        if not stepped:
            with self._lock:
                self.counters.idle_ticks += 1
        return stepped

    def _finalize_scored(self) -> None:
        # Ticket order, not verifier completion order, among the groups collected together: the
        # queue and the curriculum's report sequence then follow admissions where timing allows.
        for scored in sorted(self.scorer.collect(), key=lambda b: self._scoring[b.key].ticket):
            with self._lock:
                group = self._scoring.pop(scored.key)
                self.counters.groups_scored += 1
                self.counters.verifier_failures += scored.failures
                flags = scored.failed if scored.failed is not None else [False] * len(scored.rewards)
                for failed in flags:
                    self.failure_run.add(failed)
                if not group.already_reported:
                    self.source.report(group.record.id, scored.rewards, self.success_threshold)
                    self._outstanding[group.ticket].reported = True
                keep = self.sampling.keep(scored.rewards)
                self.drop_run.add(not keep)
                if keep:
                    self.counters.groups_kept += 1
                    rewards = scored.rewards
                    if self.shaping is not None:
                        rewards = self.shaping(rewards, [c.num_tokens for c in scored.completions])
                    kept = ScoredGroup(
                        record=group.record,
                        completions=scored.completions,
                        rewards=rewards,
                        correct=scored.correct,
                        reward_parts=scored.parts,
                    )
                    self.queue.put(ReadyGroup(group.ticket, group.admit_version, kept))
                else:
                    self.counters.groups_dropped += 1
                    self._owed_refills += 1
                    del self._outstanding[group.ticket]
                    self.controller.drop(group.admit_version)
            self.failure_run.check(self.scorer.last_error or "")
            self.drop_run.check(f"prompt {group.record.id!r}, rewards {scored.rewards}")

    def _draw(self, count: int) -> list[tuple[PromptRecord, bool]]:
        """Up to `count` records: re-issued ones first, then fresh draws. (record, already reported)."""
        out: list[tuple[PromptRecord, bool]] = []
        while self._reissue and len(out) < count:
            item = self._reissue.popleft()
            out.append((item.record, item.reported))
            self.counters.prompts_reissued += 1
        want = count - len(out)
        if want <= 0 or self.exhausted:
            return out
        refills = min(want, self._owed_refills)
        for n, refill in ((refills, True), (want - refills, False)):
            if n <= 0:
                continue
            try:
                records = self.source.next_prompts(n, refill=refill)
            except PoolExhaustedError:
                records = []
            if len(records) > n:
                raise RuntimeError(f"prompt source returned {len(records)} records for {n} requested")
            self.counters.prompts_drawn += len(records)
            if refill:
                self.counters.refill_prompts += len(records)
                self._owed_refills -= len(records)
            out.extend((r, False) for r in records)
            if len(records) < n:
                self.exhausted = True
                break
        return out

    def _request_params(self, ticket: int) -> SamplingParams:
        if self.seed is None:
            return self.params
        # A per-request seed makes a group's samples independent of what else is batched with it
        # (the engines seed one generator per sample from it), so reruns draw the same tokens.
        return replace(self.params, seed=(self.seed * _SEED_STRIDE + ticket) % (1 << 63))

    def _admit(self) -> None:
        version = self.engine.version
        room = self.controller.capacity(version)
        if room <= 0:
            return
        with self._lock:
            drawn = self._draw(room)
            if not drawn:
                return
            requests: list[GenerationRequest] = []
            self.controller.admit(version, len(drawn))
            for record, reported in drawn:
                ticket = self._next_ticket
                self._next_ticket += 1
                ids = self.encode(record)
                request_id = f"{TRAIN_PREFIX}{ticket}"
                requests.append(
                    GenerationRequest(
                        request_id=request_id,
                        prompt_ids=ids,
                        params=self._request_params(ticket),
                        metadata={"prompt_id": record.id, "ticket": ticket, "record": record},
                    )
                )
                self._open[request_id] = _OpenGroup(
                    ticket, record, version, [None] * self.params.n, already_reported=reported
                )
                self._outstanding[ticket] = _Outstanding(record, reported)
                self.counters.groups_admitted += 1
                self.counters.prompt_tokens += len(ids) * self.params.n
        self.engine.submit(requests)

    def _route(self, finished: Sequence[Completion]) -> None:
        for completion in finished:
            rid = completion.request_id
            job = self._side_running.get(rid)
            if job is not None:
                job.results[(rid, completion.sample_index)] = completion
                if len(job.results) == len(job.expected):
                    for r in job.requests:
                        self._side_running.pop(r.request_id, None)
                    job.future.set_result([job.results[key] for key in job.expected])
                continue
            with self._lock:
                group = self._open.get(rid)
                if group is None:
                    raise RuntimeError(f"engine returned a completion for unknown request {rid!r}")
                if group.slots[completion.sample_index] is not None:
                    raise RuntimeError(f"engine returned sample {completion.sample_index} of {rid!r} twice")
                group.slots[completion.sample_index] = completion
                self.counters.samples_generated += 1
                self.counters.tokens_generated += completion.num_tokens
                if not group.done:
                    continue
                del self._open[rid]
                self._scoring[rid] = group
            self.scorer.submit(rid, group.record, [c for c in group.slots if c is not None])

    # ------------------------------------------------------------------------------ side requests
    def _submit_side_jobs(self) -> None:
        with self._lock:
            ready = [job for job in self._side_waiting if job.min_version <= self.engine.version]
            for job in ready:
                self._side_waiting.remove(job)
        for job in ready:
            for r in job.requests:
                if r.request_id.startswith(TRAIN_PREFIX) or r.request_id in self._side_running:
                    job.future.set_exception(ValueError(f"side request id {r.request_id!r} is in use"))
                    break
            else:
                for r in job.requests:
                    self._side_running[r.request_id] = job
                self.engine.submit(job.requests)

    def submit_side(
        self, requests: Sequence[GenerationRequest], min_version: int = 0
    ) -> Future[list[Completion]]:
        """Queue `requests` to run on the engine alongside training rollouts; the future resolves
        when the loop (thread or `tick()`s) has finished them all.

        They are submitted once the engine's weights are at least `min_version`; completions come
        back ordered by (request order, sample index), as `Engine.generate` orders them.
        """
        job = _SideJob(requests, min_version)
        if not job.expected:
            job.future.set_result([])
            return job.future
        with self._lock:
            self._side_waiting.append(job)
        self.wake()
        return job.future

    def generate_side(
        self, requests: Sequence[GenerationRequest], min_version: int = 0, timeout: float | None = None
    ) -> list[Completion]:
        """`submit_side` and wait, with the generator thread running the loop (threaded schedule)."""
        if not self.running:
            raise RuntimeError("generate_side: the generator thread is not running; use engine.generate")
        return self.submit_side(requests, min_version).result(timeout)

    # ------------------------------------------------------------------------------ modes
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Run the loop on a background thread (pipeline mode)."""
        if self._thread is not None:
            raise RuntimeError("generator already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(same_threads_as_caller(),),
                                        name="scalerl-generator", daemon=True)
        self._thread.start()

    def _run(self, set_threads: Callable[[], None]) -> None:
        set_threads()
        try:
            while not self._stop.is_set():
                if not self._iteration():
                    self._wake.wait(self.idle_poll_s)
                    self._wake.clear()
        except BaseException as err:  # surfaced to the trainer thread by `check()`
            self.error = err
            with self._lock:
                jobs = list(self._side_waiting) + list(dict.fromkeys(self._side_running.values()))
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(err)
        finally:
            self._set_idle(True)

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("generator thread did not stop")
            self._thread = None

    def check(self) -> None:
        """Re-raise a failure of the generator thread in the caller (a fault limit as itself)."""
        if isinstance(self.error, FaultLimitError):
            raise self.error
        if self.error is not None:
            raise RuntimeError(f"generator thread failed: {self.error!r}") from self.error

    def renew_blocking(self) -> int:
        """`pipeline.admission: partial`: re-admit, at the engine's version, the groups still
        generating that the next step would wait for (`staleness.renew_blocking`); their sequences
        go on where they are. Returns how many groups were re-admitted."""
        if not self.controller.partial_rollouts:
            return 0
        # Read before the lock: versions only grow, and an older one is still a valid target.
        version = self.engine.version
        with self._lock:
            queued = [it.admit_version for it in self.queue.snapshot()]
            moved = renew_blocking(self.controller, queued, self._open.values(), version,
                                   order=lambda g: (g.admit_version, g.ticket))
            self.counters.groups_renewed += len(moved)
        return len(moved)

    def in_progress(self) -> int:
        """Admitted groups not yet in the queue (generating or being scored)."""
        with self._lock:
            return len(self._open) + len(self._scoring)

    def starved(self, needed: int) -> bool:
        """True when `needed` groups can never be queued: prompts ran out and nothing is coming."""
        with self._lock:
            if not self.exhausted or self._reissue:
                return False
            return len(self._open) + len(self._scoring) + len(self.queue) < needed

    def fill(self, target: int, should_stop: Callable[[], bool] | None = None) -> bool:
        """Round modes: run the loop on this thread until `target` groups are queued.

        Returns False when the prompts run out first. Raises if admission is blocked with nothing
        generating (the caller forgot to load the new weights), and `Interrupted` when
        `should_stop()` turns true between two ticks (the round is left as it is, consistent).
        """
        if self.running:
            raise RuntimeError("fill: the generator thread is running (pipeline mode)")
        while len(self.queue) < target:
            if should_stop is not None and should_stop():
                raise Interrupted(f"fill stopped with {len(self.queue)} of {target} groups queued")
            # `tick` waits for the verifier after each engine step, so which groups fill the round
            # depends on the token stream only, not on verifier thread timing (reproducible rounds).
            if self.tick() or len(self.queue) >= target:
                continue
            if self.starved(target):
                return False
            if self.controller.capacity(self.engine.version) == 0:
                raise RuntimeError(
                    f"fill: {len(self.queue)} of {target} groups queued and admission is blocked "
                    f"(engine version {self.engine.version}, next train version "
                    f"{self.controller.next_train_version}): weights were not loaded for the round"
                )
        self._set_idle(True)
        return True

    def consume(self, items: Sequence[ReadyGroup], train_version: int) -> list[int]:
        """The trainer took `items` for its step at `train_version`; returns each group's lag."""
        lags = self.controller.consume([it.admit_version for it in items], train_version)
        with self._lock:
            for it in items:
                del self._outstanding[it.ticket]
            self.counters.groups_consumed += len(items)
        return lags

    # ------------------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Curriculum, counters and the outstanding prompts (admitted, not consumed nor dropped).

        Taken at a step boundary; in `pipeline` mode the loop keeps running, so the snapshot is
        taken under the bookkeeping lock. On resume the outstanding prompts are admitted again,
        first and in admission order: none is trained twice (their groups never reached a step) and
        none is skipped. Rewards already reported to the curriculum are not reported again.
        """
        with self._lock:
            outstanding = [self._outstanding[t] for t in sorted(self._outstanding)]
            outstanding = [*outstanding, *self._reissue]
            return {
                "source": self.source.state_dict(),
                "counters": self.counters.as_dict(),
                "next_ticket": self._next_ticket,
                "owed_refills": self._owed_refills,
                "outstanding": [{"record": o.record.to_dict(), "reported": o.reported} for o in outstanding],
                "fault_runs": {"failures": self.failure_run.count, "drops": self.drop_run.count},
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.running or self._outstanding:
            raise RuntimeError("load_state_dict: only before the generator has admitted anything")
        with self._lock:
            self.source.load_state_dict(state["source"])
            self.counters.load(state["counters"])
            self._next_ticket = int(state["next_ticket"])
            self._owed_refills = int(state.get("owed_refills", 0))
            runs = state.get("fault_runs", {})
            self.failure_run.count = int(runs.get("failures", 0))
            self.drop_run.count = int(runs.get("drops", 0))
            self._reissue = deque(
                _Outstanding(PromptRecord.from_dict(o["record"]), bool(o["reported"]))
                for o in state["outstanding"]
            )

    # ------------------------------------------------------------------------------ exact resume
    def snapshot(self) -> dict[str, Any] | None:
        """Everything between the curriculum and the trainer, for a resume that continues exactly
        (`scalerl.pipeline.snapshot`): groups generating with their finished samples, groups
        queued, tickets, refill debt, counters. None when the loop is not quiescent (the thread
        runs, groups are being scored, side requests are pending) or the queue cannot be read:
        the resume then re-issues the outstanding prompts (`state_dict`)."""
        from scalerl.pipeline.snapshot import completion_to_plain, ready_group_to_plain

        read_queue = getattr(self.queue, "snapshot", None)
        if self.running or not callable(read_queue):
            return None
        with self._lock:
            if self._scoring or self._side_waiting or self._side_running or self.scorer.pending:
                return None
            return {
                "open": [
                    {"request_id": rid, "ticket": g.ticket, "record": g.record.to_dict(),
                     "admit_version": g.admit_version, "already_reported": g.already_reported,
                     "slots": [None if c is None else completion_to_plain(c) for c in g.slots]}
                    for rid, g in self._open.items()
                ],
                "queue": [ready_group_to_plain(it) for it in read_queue()],
                "outstanding": [[t, o.record.to_dict(), o.reported]
                                for t, o in sorted(self._outstanding.items())],
                "reissue": [[o.record.to_dict(), o.reported] for o in self._reissue],
                "owed_refills": self._owed_refills,
                "exhausted": self.exhausted,
                "next_ticket": self._next_ticket,
                "counters": self.counters.as_dict(),
                "sampling": [self.sampling.kept, self.sampling.dropped],
            }

    def restore_snapshot(self, state: dict[str, Any]) -> None:
        """Continue from `snapshot()` (after `load_state_dict` restored the curriculum): the open
        groups, the queue and the outstanding set replace the re-issue list."""
        from scalerl.pipeline.snapshot import completion_from_plain, ready_group_from_plain

        if self.running or self._open or self._scoring or len(self.queue):
            raise RuntimeError("restore_snapshot: only before the generator has admitted anything")
        with self._lock:
            self._open = {
                g["request_id"]: _OpenGroup(
                    int(g["ticket"]), PromptRecord.from_dict(g["record"]), int(g["admit_version"]),
                    [None if c is None else completion_from_plain(c) for c in g["slots"]],
                    already_reported=bool(g["already_reported"]),
                )
                for g in state["open"]
            }
            self._outstanding = {int(t): _Outstanding(PromptRecord.from_dict(r), bool(rep))
                                 for t, r, rep in state["outstanding"]}
            self._reissue = deque(_Outstanding(PromptRecord.from_dict(r), bool(rep))
                                  for r, rep in state["reissue"])
            self._owed_refills = int(state["owed_refills"])
            self.exhausted = bool(state["exhausted"])
            self._next_ticket = int(state["next_ticket"])
            self.counters.load(state["counters"])
            self.sampling.kept, self.sampling.dropped = (int(x) for x in state["sampling"])
            for item in state["queue"]:
                self.queue.put(ready_group_from_plain(item))
