"""A pool of engine actors behind the `Engine` protocol.

* Placement: each request (a group: one prompt, `n` samples) goes whole to the live engine with the
  fewest samples assigned and not yet returned (least loaded), so a slow engine gets less work. A
  request with a `cache_key` seen before (a later turn of a multi-turn episode) goes to the engine
  that ran that key last, where its context is in the prefix cache (`counters.sticky_requests`);
  if that engine died, to the least loaded.
* Streaming: every engine always has one `poll` outstanding; `step()` returns the groups whose
  samples have all come back since the last call (the generator scores whole groups anyway, and
  holding partial ones is what lets a dead engine's group be re-run whole).
* Version: `version` is the minimum over live engines of the version each confirmed. An engine's
  own version is never below what it confirmed and only grows, so a group admitted at the pool's
  version `v` has `start_version >= v` on whichever engine runs it: the premise of the max-lag
  admission proof (`scalerl.pipeline.staleness`), for any number of engines. A slow engine holds
  the minimum down and only throttles admission.
* Faults: an engine whose process died (seen by a poll or a weight update) is dropped; its
  in-flight groups are re-issued to the least-loaded survivors, their partial samples discarded,
  all counted (`counters`). With no engine left, `NoEngineLeftError`. An engine that does not
  answer a poll within `timeout_s`, or whose loop raised, is an error naming it (a bug, not a
  fault to paper over).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from scalerl.config import DistributedConfig
from scalerl.distributed.cluster import PeerError, classify, import_ray, startup_hint, wait_all, wait_each
from scalerl.distributed.weights import bucket_state, plan_buckets
from scalerl.rollout.fingerprint import SyncCheck, WeightSyncError
from scalerl.rollout.protocol import ENGINE_METADATA_KEY, Completion, Engine, GenerationRequest
from scalerl.rollout.vllm_engine import combined_figures

logger = logging.getLogger(__name__)

POLL_WAIT_S = 0.5  # how long an engine's poll waits for a completion before answering empty
ENGINE_CONCURRENCY = 4  # poll + submit + weight update + spare, in parallel inside one actor
AFFINITY_KEYS = 1 << 16  # cache keys remembered for placement (one per recent episode group)


def engine_bundles(tensor_parallel_size: int, num_cpus: float, num_gpus: float) -> list[dict[str, float]]:
    """Placement-group bundles of one tensor-parallel engine: one per TP rank, each with
    `num_gpus` GPUs (at least 1: a rank is a GPU), the first also the engine actor's CPUs."""
    gpu = max(1.0, float(num_gpus))
    return [{"GPU": gpu, "CPU": float(num_cpus)} if r == 0 else {"GPU": gpu}
            for r in range(tensor_parallel_size)]


def _release(ray: Any, actors: Sequence[Any], groups: Sequence[Any]) -> None:
    for a in actors:
        ray.kill(a)
    for group in groups:
        ray.util.remove_placement_group(group)


class NoEngineLeftError(RuntimeError):
    """Every engine actor of the pool died."""


@dataclass
class _Flight:
    request: GenerationRequest
    engine: int
    received: dict[int, Completion] = field(default_factory=dict)


@dataclass
class _Restart:
    """A dead engine being started again: when the next attempt is due, its actor and ready ref."""

    index: int
    attempt: int
    due: float
    actor: Any = None
    ready_ref: Any = None
    started: float = 0.0


@dataclass
class EngineMember:
    """The controller's view of one engine actor."""

    index: int
    name: str
    actor: Any
    version: int
    alive: bool = True
    load: int = 0  # samples assigned and not yet returned
    poll_ref: Any = None
    poll_since: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    steps: int = 0
    samples: int = 0  # completions returned
    restarted: bool = False  # a restart of a dead engine (rejoined after a verified sync)
    figures: dict[str, float] = field(default_factory=dict)  # the engine's own, as of its last poll


@dataclass
class PoolCounters:
    engine_deaths: int = 0
    groups_reissued: int = 0  # in-flight groups of a dead engine, sent to another
    samples_discarded: int = 0  # partial samples of those groups, generated again
    groups_completed: int = 0
    sticky_requests: int = 0  # requests sent to the engine holding their cache_key's context
    engine_restarts: int = 0  # dead engines started again and rejoined (synced, verified)
    engine_restart_failures: int = 0  # restart attempts whose actor did not come up
    engine_restarts_verified: int = 0  # rejoins whose loaded weights matched the sender's fingerprints
    restarted_samples: int = 0  # completions returned by restarted engines since they rejoined

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class EnginePool:
    """`Engine` over engine actors (module docstring). Build with `launch`, or from actor handles."""

    def __init__(
        self,
        actors: Sequence[Any],
        versions: Sequence[int],
        *,
        timeout_s: float,
        poll_s: float = 0.05,
        bucket_bytes: int = 64 << 20,
    ) -> None:
        if not actors:
            raise ValueError("EnginePool: needs at least one engine actor")
        self.members = [EngineMember(i, f"engine {i}", a, int(v)) for i, (a, v) in
                        enumerate(zip(actors, versions, strict=True))]
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.bucket_bytes = bucket_bytes
        self.counters = PoolCounters()
        self._flights: dict[str, _Flight] = {}
        self._undelivered: list[Completion] = []
        self._affinity: OrderedDict[str, int] = OrderedDict()  # cache_key -> engine index, LRU
        self._lock = threading.RLock()  # bookkeeping: members, flights, counters
        self._step_lock = threading.RLock()  # one consumer of polls at a time (step / generate)
        self._ray = import_ray()
        # The engines' weight dtype (from `ready`), what senders fingerprint in; None: not verified.
        self.weight_dtype: str | None = None
        self.placement_groups: list[Any] = []  # one per tensor-parallel engine, removed at close
        # Restarts (`enable_restarts`): how to start engine i again, how many restarts are left.
        self._spawn: Callable[[int], Any] | None = None
        self.restarts_left = 0
        self.restart_backoff_s = 0.0
        self.startup_timeout_s = 600.0
        self._restarting: dict[int, _Restart] = {}
        # The last object-store sync (bucket refs, version) and the sender's fingerprints of it: what
        # a restarted engine loads and is checked against before it rejoins.
        self._last_sync: tuple[list[Any], int] | None = None
        self.last_expected: Mapping[str, Any] | None = None
        self.last_restart_s = 0.0  # the last rejoin: seconds from its actor's spawn to live
        # Told of each restarted engine's verified sync (the channel counts it in `weight_verify_*`).
        self.on_restart_check: Callable[[SyncCheck, float], None] | None = None
        # Engine figures of members replaced by a restart, so the pool's cumulative sums never fall.
        self._retired_figures: list[dict[str, float]] = []

    @classmethod
    def launch(
        cls, factories: Sequence[Callable[[], Engine]], cfg: DistributedConfig, poll_s: float = 0.05,
        tensor_parallel_size: int = 1,
    ) -> EnginePool:
        """Start one actor per factory with `cfg`'s per-engine resources; wait until all are up.

        With `tensor_parallel_size` > 1 each engine spans that many GPUs: one STRICT_PACK placement
        group per engine (`engine_bundles`: all its GPUs on one node), the engine actor in its first
        bundle, holding no GPU itself, and vLLM's Ray executor placing its TP workers in the
        group's bundles (it uses the placement group it is started in, which the actor's tasks
        capture)."""
        from scalerl.distributed.engine_actor import EngineWorker

        ray = import_ray()
        remote = ray.remote(EngineWorker)
        groups: list[Any] = []
        actors = []
        for i, factory in enumerate(factories):
            options: dict[str, Any] = {"num_cpus": cfg.engine_num_cpus, "num_gpus": cfg.engine_num_gpus,
                                       "max_concurrency": ENGINE_CONCURRENCY}
            if tensor_parallel_size > 1:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                group = ray.util.placement_group(
                    engine_bundles(tensor_parallel_size, cfg.engine_num_cpus, cfg.engine_num_gpus),
                    strategy="STRICT_PACK", name=f"scalerl-engine-{i}")
                groups.append(group)
                options.update(num_gpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True))
            actors.append(remote.options(**options).remote(factory, f"engine {i}"))
        try:
            ready = wait_all({f"engine {i}": a.ready.remote() for i, a in enumerate(actors)},
                             cfg.startup_timeout_s, "engine start-up")
        except PeerError as err:
            hint = ""
            if err.kind == "timeout":
                hint = startup_hint("engines", cfg.engine_num_cpus, cfg.engine_num_gpus)
            _release(ray, actors, groups)
            raise PeerError(err.peer, err.kind, f"{err}; {hint}" if hint else str(err)) from err
        except BaseException:
            _release(ray, actors, groups)
            raise
        versions = [ready[f"engine {i}"]["version"] for i in range(len(actors))]
        pool = cls(actors, versions, timeout_s=cfg.timeout_s, poll_s=poll_s,
                   bucket_bytes=int(cfg.bucket_mb * (1 << 20)))
        pool.placement_groups = groups
        if cfg.engine_restarts > 0 and tensor_parallel_size == 1:

            def spawn(i: int) -> Any:
                return remote.options(num_cpus=cfg.engine_num_cpus, num_gpus=cfg.engine_num_gpus,
                                      max_concurrency=ENGINE_CONCURRENCY).remote(factories[i], f"engine {i}")

            pool.enable_restarts(spawn, cfg.engine_restarts, cfg.engine_restart_backoff_s,
                                 cfg.startup_timeout_s)
        dtypes = {ready[f"engine {i}"].get("weight_dtype") for i in range(len(actors))}
        pool.weight_dtype = dtypes.pop() if len(dtypes) == 1 else None
        return pool

    # ------------------------------------------------------------------------------ bookkeeping
    def live(self) -> list[EngineMember]:
        with self._lock:
            return [m for m in self.members if m.alive]

    @property
    def version(self) -> int:
        live = self.live()
        if not live:
            raise NoEngineLeftError("every engine actor of the pool died")
        return min(m.version for m in live)

    def confirm_version(self, member: EngineMember, version: int) -> None:
        with self._lock:
            member.version = max(member.version, int(version))

    def num_unfinished(self) -> int:
        with self._lock:
            return sum(f.request.params.n - len(f.received) for f in self._flights.values()) + len(
                self._undelivered
            )

    def _least_loaded(self) -> EngineMember:
        live = [m for m in self.members if m.alive]
        if not live:
            raise NoEngineLeftError(
                f"every engine actor of the pool died ({self.counters.engine_deaths} deaths); the run "
                "cannot go on (its last checkpoint is intact: fix the cause and --resume)"
            )
        return min(live, key=lambda m: (m.load, m.index))

    def _placement(self, request: GenerationRequest) -> EngineMember:
        key = request.cache_key
        if key is None:
            return self._least_loaded()
        index = self._affinity.get(key)
        if index is not None and self.members[index].alive:
            self._affinity.move_to_end(key)
            self.counters.sticky_requests += 1
            return self.members[index]
        m = self._least_loaded()
        self._affinity[key] = m.index
        if len(self._affinity) > AFFINITY_KEYS:
            self._affinity.popitem(last=False)  # the oldest episode group: long finished
        return m

    def _assign_locked(self, requests: Sequence[GenerationRequest]) -> None:
        per_engine: dict[int, list[GenerationRequest]] = {}
        for r in requests:
            if r.request_id in self._flights:
                raise ValueError(f"request id {r.request_id!r} is already in flight")
            m = self._placement(r)
            m.load += r.params.n
            self._flights[r.request_id] = _Flight(r, m.index)
            per_engine.setdefault(m.index, []).append(r)
        for index, batch in per_engine.items():
            # Fire and forget: a dead actor shows up at its next poll, which re-issues these.
            self.members[index].actor.submit.remote(batch)

    def mark_dead(self, member: EngineMember, reason: BaseException | str) -> None:
        """Drop a dead engine and re-issue its in-flight groups to the others (counted)."""
        with self._lock:
            if not member.alive:
                return
            member.alive = False
            member.poll_ref = None
            self.counters.engine_deaths += 1
            orphans = [f for f in self._flights.values() if f.engine == member.index]
            logger.warning("%s died (%s); re-issuing its %d in-flight group(s)", member.name, reason,
                           len(orphans))
            for f in orphans:
                self.counters.samples_discarded += len(f.received)
                del self._flights[f.request.request_id]
            self.counters.groups_reissued += len(orphans)
            if self._spawn is not None and self.restarts_left > 0:
                due = time.monotonic() + self.restart_backoff_s
                self._restarting[member.index] = _Restart(member.index, 1, due)
            self._assign_locked([f.request for f in orphans])

    # ------------------------------------------------------------------------------ restarts
    def enable_restarts(self, spawn: Callable[[int], Any], restarts: int, backoff_s: float,
                        startup_timeout_s: float) -> None:
        """Restart dead engines: `spawn(i)` starts engine i's actor again, at most `restarts` times
        in all; attempt a waits `backoff_s * 2**(a-1)` after the death or the failed attempt."""
        self._spawn = spawn
        self.restarts_left = int(restarts)
        self.restart_backoff_s = float(backoff_s)
        self.startup_timeout_s = float(startup_timeout_s)

    def _advance_restarts(self) -> None:
        """Move every pending restart on without blocking on a start-up: spawn when due, and when
        the actor is up, load the last published weights, verify them, and rejoin (counted)."""
        if not self._restarting:
            return
        now = time.monotonic()
        for index, r in list(self._restarting.items()):
            if r.actor is None:
                if now >= r.due and self.restarts_left > 0 and self._spawn is not None:
                    self.restarts_left -= 1
                    r.actor, r.started = self._spawn(index), now
                    r.ready_ref = r.actor.ready.remote()
                continue
            ready, _ = self._ray.wait([r.ready_ref], timeout=0)
            if not ready:
                if now - r.started > self.startup_timeout_s:
                    self._restart_failed(r, f"no start-up within {self.startup_timeout_s:g} s")
                continue
            try:
                info = self._ray.get(r.ready_ref)
                self._rejoin(r, int(info["version"]))
            except WeightSyncError:
                raise
            except Exception as err:
                self._restart_failed(r, err)

    def _restart_failed(self, r: _Restart, why: object) -> None:
        logger.warning("engine %d: restart attempt %d failed (%s)", r.index, r.attempt, why)
        try:
            self._ray.kill(r.actor)
        except Exception as err:  # already gone
            logger.debug("killing a failed restart: %s", err)
        self.counters.engine_restart_failures += 1
        if self.restarts_left > 0:
            self._restarting[r.index] = _Restart(r.index, r.attempt + 1,
                                                 time.monotonic() + self.restart_backoff_s * 2 ** r.attempt)
        else:
            del self._restarting[r.index]

    def _rejoin(self, r: _Restart, version: int) -> None:
        """Sync the restarted actor to the last published weights (again if a newer publish came
        meanwhile), verify them against the sender's fingerprints, then make it live."""
        from scalerl.rollout.fingerprint import verify

        name = f"engine {r.index}"
        for _ in range(4):
            verified = False
            with self._lock:
                last = self._last_sync
            if last is not None:
                refs, version = last
                self._ray.get(r.actor.update_weights.remote(version, *refs), timeout=self.timeout_s)
                expected = self.last_expected
                if expected is not None:
                    check_start = time.perf_counter()
                    held = self._ray.get(r.actor.weight_fingerprints.remote(), timeout=self.timeout_s)
                    if held is not None:
                        check = verify(expected, held, engine=f"{name} (restarted)", version=version)
                        verified = True
                        if self.on_restart_check is not None:
                            self.on_restart_check(check, time.perf_counter() - check_start)
            with self._lock:
                if self._last_sync is last:  # nothing newer was published meanwhile: rejoin now
                    old = self.members[r.index]
                    if old.figures:
                        self._retired_figures.append(old.figures)
                    self.members[r.index] = EngineMember(r.index, name, r.actor, version, restarted=True)
                    del self._restarting[r.index]
                    self.counters.engine_restarts += 1
                    self.counters.engine_restarts_verified += int(verified)
                    self.last_restart_s = time.monotonic() - r.started
                    logger.warning("%s restarted (attempt %d) at version %d, %.1f s after its spawn%s",
                                   name, r.attempt, version, self.last_restart_s,
                                   ", weights verified" if verified else "")
                    return
        raise RuntimeError(f"{name}: weights were published faster than a restarted engine could load them")

    # ------------------------------------------------------------------------------ Engine protocol
    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self._lock:
            self._assign_locked(requests)

    def _ensure_polls(self) -> None:
        with self._lock:
            for m in self.members:
                if m.alive and m.poll_ref is None:
                    m.poll_ref = m.actor.poll.remote(POLL_WAIT_S)
                    m.poll_since = time.monotonic()

    def _check_hangs(self) -> None:
        now = time.monotonic()
        for m in self.live():
            if m.poll_ref is not None and now - m.poll_since > POLL_WAIT_S + self.timeout_s:
                raise PeerError(m.name, "timeout", f"{m.name}: a poll got no answer within "
                                                   f"{self.timeout_s:g} s (distributed.timeout_s)")

    def _collect(self, member: EngineMember, ref: Any) -> list[Completion]:
        try:
            result = self._ray.get(ref)
        except Exception as err:
            if classify(err) == "died":
                self.mark_dead(member, "its process is gone")
                return []
            raise PeerError(member.name, "error", f"{member.name} failed: {err}") from err
        done: list[Completion] = []
        with self._lock:
            if member.poll_ref is ref:
                member.poll_ref = None
            member.version = max(member.version, result.version)
            member.busy_s, member.idle_s, member.steps = result.busy_s, result.idle_s, result.steps
            member.figures = dict(result.figures)
            for c in result.completions:
                flight = self._flights.get(c.request_id)
                if flight is None or flight.engine != member.index:
                    raise RuntimeError(f"{member.name} returned a completion for {c.request_id!r}, "
                                       "which is not in flight on it")
                # Which engine ran it (an agentic episode records it per turn).
                c.metadata = {**c.metadata, ENGINE_METADATA_KEY: member.index}
                flight.received[c.sample_index] = c
                member.load -= 1
                member.samples += 1
                self.counters.restarted_samples += int(member.restarted)
                if len(flight.received) == flight.request.params.n:
                    del self._flights[c.request_id]
                    self.counters.groups_completed += 1
                    done.extend(flight.received[i] for i in range(flight.request.params.n))
        return done

    def step(self) -> list[Completion]:
        """Wait up to `poll_s` for engines to answer; return the groups completed since last time."""
        with self._step_lock:
            self._advance_restarts()
            with self._lock:
                out, self._undelivered = self._undelivered, []
            self._ensure_polls()
            refs = {m.poll_ref: m for m in self.live() if m.poll_ref is not None}
            if not refs:
                self._least_loaded()  # raises NoEngineLeftError
                return out
            ready, rest = self._ray.wait(list(refs), num_returns=1, timeout=self.poll_s)
            if ready and rest:
                more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            for ref in ready:
                out.extend(self._collect(refs[ref], ref))
            self._check_hangs()
            return out

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Submit and wait for `requests`; other completions are kept for the next `step()`."""
        wanted = {r.request_id for r in requests}
        total = sum(r.params.n for r in requests)
        got: dict[tuple[str, int], Completion] = {}
        others: list[Completion] = []
        with self._step_lock:
            self.submit(requests)
            while len(got) < total:
                for c in self.step():
                    if c.request_id in wanted:
                        got[(c.request_id, c.sample_index)] = c
                    else:
                        others.append(c)
            with self._lock:
                self._undelivered.extend(others)
        return [got[(r.request_id, i)] for r in requests for i in range(r.params.n)]

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Weights held by this process: put them in the object store (bucketed), then load."""
        buckets = plan_buckets(state, self.bucket_bytes)
        refs = [self._ray.put(bucket_state(state, b)) for b in buckets]
        self.load_from_object_store(refs, version)

    def load_from_object_store(self, bucket_refs: Sequence[Any], version: int) -> None:
        """Every live engine fetches the buckets from the object store and loads them in flight.
        The refs are kept while restarts are enabled (what a restarted engine loads)."""
        with self._lock:
            if self._spawn is not None:
                self._last_sync = (list(bucket_refs), int(version))
            members = [m for m in self.members if m.alive]
        calls = {m.name: m.actor.update_weights.remote(version, *bucket_refs) for m in members}
        self.settle_sync(members, wait_each(calls, self.timeout_s), version, "weight sync")

    def settle_sync(self, members: Sequence[EngineMember], outcomes: Mapping[str, tuple[str, Any]],
                    version: int, what: str) -> list[EngineMember]:
        """Confirm the engines that loaded `version`, drop the dead ones; errors and timeouts raise.
        Returns the dead."""
        dead = []
        for m in members:
            kind, value = outcomes[m.name]
            if kind == "ok":
                self.confirm_version(m, version)
            elif kind == "died":
                self.mark_dead(m, f"died during {what}")
                dead.append(m)
            else:
                raise PeerError(m.name, kind, f"{what} to {m.name} at version {version}: {value}")
        if not self.live():
            self._least_loaded()
        return dead

    # ------------------------------------------------------------------------------ reporting
    def stats(self) -> dict[str, float]:
        """Cumulative pool figures for the step rows (engine times as of each engine's last poll)."""
        with self._lock:
            live = [m for m in self.members if m.alive]
            out = {f"pool_{k}": float(v) for k, v in self.counters.as_dict().items()}
            out["pool_engines_alive"] = float(len(live))
            out["pool_engines_restarting"] = float(len(self._restarting))
            out["pool_version_spread"] = float(max(m.version for m in live) - min(m.version for m in live)
                                               ) if live else 0.0
            busy = sum(m.busy_s for m in self.members)
            idle = sum(m.idle_s for m in self.members)
            out["pool_engine_busy_s"] = busy
            out["pool_engine_idle_s"] = idle
            out["pool_engine_restart_s"] = self.last_restart_s
            # The engines' own figures (vLLM's prompt tokens and prefix-cache hits), summed.
            out.update(combined_figures([*self._retired_figures, *(m.figures for m in self.members)]))
            return out

    def close(self) -> None:
        for m in self.members:
            try:
                self._ray.kill(m.actor)
            except Exception as err:  # already gone
                logger.debug("killing %s: %s", m.name, err)
            m.alive = False
        for r in self._restarting.values():
            if r.actor is not None:
                try:
                    self._ray.kill(r.actor)
                except Exception as err:  # already gone
                    logger.debug("killing a restarting engine: %s", err)
        self._restarting.clear()
        for group in self.placement_groups:
            try:
                self._ray.util.remove_placement_group(group)
            except Exception as err:  # already removed with its job
                logger.debug("removing a placement group: %s", err)
        self.placement_groups = []
