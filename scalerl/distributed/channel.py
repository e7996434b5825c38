"""The distributed `WeightChannel`: the trainer's weights to every engine of the pool.

`RayTrainer.weights_for_engine()` returns a `RemoteWeights` handle held by the trainer's ranks
(nothing crosses to the controller); `publish` then sends:

* `object_store`: every FSDP rank gathers the full weights and rank 0 `ray.put`s one object per
  bucket; each engine fetches them (Ray moves them node to node) and loads them in flight.
* `collective`: rank 0 and the live engines form one group (`weights.WeightGroup`, gloo on CPU,
  NCCL on GPU). The sync is streamed from the FSDP2 shards: every trainer rank all-gathers one
  bucket at a time (on its device) and rank 0 broadcasts each bucket as soon as it is whole while
  every engine receives, so no trainer process holds the full model (`weights.stream_to_group`).
  All ranks walk the same plan in the same order, and a failed broadcast stops the sending, never
  the gathering, so the FSDP collectives cannot deadlock against the sync. If an engine died, the
  group is rebuilt among the survivors and the broadcast retried once.

A plain mapping of tensors (a local trainer) goes through the object store from this process.

After every sync each live engine's fingerprints of what it holds are compared with the sender's
(`scalerl.rollout.fingerprint`: rank 0 fingerprints what it gathered, in the engines' weight dtype);
a mismatch raises `WeightSyncError` naming the engine, the tensor and the version: the run stops.
Then every live engine scores the run's probe and its log-probs are compared with the trainer
ranks' at the same version (`scalerl.rollout.probe`: what the engine computes, where tensors cannot
be read back); a gap beyond the tolerance stops the run the same way.
Every wait is bounded by `distributed.timeout_s`; `publish_seconds` / `last_seconds` time each sync.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from scalerl.distributed.cluster import PeerError, import_ray, wait_each
from scalerl.distributed.pool import EngineMember, EnginePool
from scalerl.distributed.weights import BucketMeta
from scalerl.rollout.fingerprint import (
    Fingerprint,
    SyncCheck,
    SyncFigures,
    channel_metrics,
    state_fingerprints,
    verify,
)
from scalerl.rollout.probe import ProbeFigures, SyncProbe, check_probe, tolerance


@dataclass
class RemoteWeights(Mapping[str, torch.Tensor]):
    """Full weights of `version`, held by the trainer's ranks (a lazy mapping).

    `buckets` is the plan; `refs` the object-store objects of the buckets (object-store sync) or
    None (collective: the buckets are streamed from the shards by `senders`, every trainer rank's
    actor, at the broadcast). Reading it as a mapping fetches the tensors into this process (for a
    local consumer; the channel never does): the objects, or a full gather (`fetch`).
    """

    version: int
    buckets: list[BucketMeta]
    refs: list[Any] | None
    rank0: Any
    timeout_s: float = 300.0
    fingerprints: dict[str, Fingerprint] | None = None  # of what rank 0 sent (engines' dtype)
    # A streamed collective sync: every trainer rank's actor takes part (`stream_weights`), rank 0
    # fingerprints in this dtype while it sends; `fetch` gathers a full copy for a local reader.
    senders: list[Any] | None = None
    fingerprint_dtype: str | None = None
    fetch: Callable[[], dict[str, torch.Tensor]] | None = None
    _cache: dict[str, torch.Tensor] | None = None

    def _load(self) -> dict[str, torch.Tensor]:
        if self._cache is None:
            ray = import_ray()
            if self.refs is not None:
                state: dict[str, torch.Tensor] = {}
                for bucket in ray.get(list(self.refs), timeout=self.timeout_s):
                    state.update(bucket)
            else:
                assert self.fetch is not None, "a streamed sync's weights carry their fetch"
                state = self.fetch()
            self._cache = state
        return self._cache

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._load()[key]

    def __iter__(self) -> Iterator[str]:
        return (name for b in self.buckets for name, _ in b.entries)

    def __len__(self) -> int:
        return sum(len(b.entries) for b in self.buckets)


class RayWeightChannel:
    """`WeightChannel` onto an `EnginePool` (module docstring)."""

    def __init__(
        self, pool: EnginePool, *, mode: str, backend: str = "gloo", timeout_s: float = 300.0,
        probe: SyncProbe | None = None,
    ) -> None:
        if mode not in ("object_store", "collective"):
            raise ValueError(f"distributed.weight_sync: unknown {mode!r} (object_store or collective)")
        self.pool = pool
        self.mode = mode
        self.backend = backend
        self.timeout_s = timeout_s
        self.published_version: int | None = None
        self.publish_seconds = 0.0
        self.last_seconds = 0.0
        self.syncs = 0
        self.verification = SyncFigures()
        self.probe = probe
        self.probe_figures = ProbeFigures()
        self._group_members: tuple[int, ...] | None = None
        self._group_rank0: Any = None
        # A restarted engine's sync (the pool loads and checks it, on the thread that steps it)
        # counts as a verified engine sync; the lock keeps both threads' counts.
        self._verification_lock = threading.Lock()
        pool.on_restart_check = self._count_check

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        start = time.perf_counter()
        if isinstance(state, RemoteWeights):
            if state.refs is not None:
                self.pool.load_from_object_store(state.refs, version)
            else:
                self._broadcast(state, version)
            expected = state.fingerprints  # a streamed sync's, taken while rank 0 sent
        else:
            dtype = self.pool.weight_dtype
            expected = None if dtype is None else state_fingerprints(state, getattr(torch, dtype))
            self.pool.update_weights(state, version)
        self.pool.last_expected = expected  # what a restarted engine is checked against
        self._verify(expected, version)
        self._probe(version)
        self.last_seconds = time.perf_counter() - start
        self.publish_seconds += self.last_seconds
        self.syncs += 1
        self.published_version = version

    def _count_check(self, check: SyncCheck | None, seconds: float) -> None:
        with self._verification_lock:
            self.verification.add(check, seconds)

    def _verify(self, expected: Mapping[str, Fingerprint] | None, version: int) -> None:
        """Every live engine's fingerprints against the sender's; a mismatch raises WeightSyncError
        naming the engine, the tensor and the version. An engine that died meanwhile is dropped."""
        start = time.perf_counter()
        members = self.pool.live()
        if expected is None:
            self._count_check(None, time.perf_counter() - start)
            return
        outcomes = wait_each({m.name: m.actor.weight_fingerprints.remote() for m in members}, self.timeout_s)
        check = None
        for m in members:
            kind, held = outcomes[m.name]
            if kind == "died":
                self.pool.mark_dead(m, "died during the weight-sync check")
                continue
            if kind != "ok":
                raise PeerError(m.name, kind,
                                f"weight-sync check at version {version}: {m.name} {kind}: {held}")
            if held is None:
                continue
            check = verify(expected, held, engine=m.name, version=version)
        self._count_check(check, time.perf_counter() - start)

    def _probe(self, version: int) -> None:
        """Every live engine scores the probe; each one's log-probs against the trainer's at
        `version` (`scalerl.rollout.probe`: WeightSyncError naming the engine, the version and the
        gap). An engine that died meanwhile is dropped; one that cannot score is not checked."""
        if self.probe is None:
            return
        start = time.perf_counter()
        members = self.pool.live()
        sequences = [list(s) for s in self.probe.probe]
        outcomes = wait_each({m.name: m.actor.probe_logprobs.remote(sequences) for m in members},
                             self.timeout_s)
        expected, drift = self.probe.expected(version)
        dtype = max(self.pool.weight_dtype or "float32", self.probe.dtype, key=tolerance)
        checks = []
        for m in members:
            kind, got = outcomes[m.name]
            if kind == "died":
                self.pool.mark_dead(m, "died during the weight-sync probe")
                continue
            if kind != "ok":
                raise PeerError(m.name, kind,
                                f"weight-sync probe at version {version}: {m.name} {kind}: {got}")
            if got is not None:
                checks.append(check_probe(expected, got, dtype=dtype, engine=m.name, version=version,
                                          drift=drift))
        if checks:  # one check per sync, as `weight_verify_checks`: its largest gap over the engines
            with self._verification_lock:
                self.probe_figures.add(max(checks, key=lambda c: c.gap), time.perf_counter() - start)

    # ------------------------------------------------------------------------------ collective
    def _form_group(self, rank0: Any, members: Sequence[EngineMember]) -> None:
        ray = import_ray()
        host, port = ray.get(rank0.rendezvous.remote(), timeout=self.timeout_s)
        world = len(members) + 1
        calls = {"trainer rank 0": rank0.init_weight_group.remote(host, port, world, self.backend,
                                                                   self.timeout_s)}
        for i, m in enumerate(members, start=1):
            calls[m.name] = m.actor.init_weight_group.remote(host, port, i, world, self.backend,
                                                             self.timeout_s)
        outcomes = wait_each(calls, self.timeout_s + 30)
        self._raise_for("weight-group set-up", outcomes, members, version=None)
        self._group_members = tuple(m.index for m in members)
        self._group_rank0 = rank0

    def _raise_for(self, what: str, outcomes: Mapping[str, tuple[str, Any]],
                   members: Sequence[EngineMember], version: int | None) -> list[EngineMember]:
        """Dead engines are returned; a failed trainer rank 0 or a failed live engine raises."""
        kind, value = outcomes["trainer rank 0"]
        dead = [m for m in members if outcomes[m.name][0] == "died"]
        if kind != "ok" and not dead:
            raise PeerError("trainer rank 0", kind, f"{what}: trainer rank 0 {kind}: {value}")
        for m in members:
            k, v = outcomes[m.name]
            if k not in ("ok", "died") and not dead:
                raise PeerError(m.name, k, f"{what} at version {version}: {m.name} {k}: {v}")
        return dead

    def _broadcast(self, weights: RemoteWeights, version: int) -> None:
        for attempt in (1, 2):
            members = self.pool.live()
            if not members:
                self.pool.version  # noqa: B018 -- raises NoEngineLeftError
            same = self._group_members == tuple(m.index for m in members)
            if not same or self._group_rank0 is not weights.rank0:
                self._form_group(weights.rank0, members)
            assert weights.senders is not None, "a collective sync streams from every trainer rank"
            # Every trainer rank gathers bucket by bucket while rank 0 sends.
            calls = {f"trainer rank {r}": a.stream_weights.remote(weights.version, weights.buckets,
                                                                 weights.fingerprint_dtype)
                     for r, a in enumerate(weights.senders)}
            for m in members:
                calls[m.name] = m.actor.receive_weights.remote(weights.buckets, version)
            outcomes = wait_each(calls, self.timeout_s)
            dead = self._raise_for("weight sync", outcomes, members, version)
            for name, (kind, value) in outcomes.items():
                if name.startswith("trainer rank ") and name != "trainer rank 0" and kind != "ok":
                    raise PeerError(name, kind, f"weight sync at version {version}: {name} {kind}: {value}")
            if outcomes["trainer rank 0"][0] == "ok":
                weights.fingerprints = outcomes["trainer rank 0"][1]
            if not dead:
                for m in members:
                    self.pool.confirm_version(m, version)
                return
            # An engine died mid-broadcast: the group is broken for everyone. Drop the dead, rebuild
            # the group among the survivors and send again (once).
            for m in dead:
                self.pool.mark_dead(m, "died during the collective weight sync")
            self._group_members = None
            if attempt == 2:
                raise PeerError(dead[0].name, "died", f"weight sync at version {version}: engines died twice "
                                                       "in a row during the broadcast")

    def metrics(self) -> dict[str, float]:
        return channel_metrics(self.last_seconds, self.publish_seconds, self.syncs, self.verification,
                               self.probe_figures)
