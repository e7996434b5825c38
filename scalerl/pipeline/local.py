"""In-process transports: a condition-variable group queue and a weight channel that calls the engine.

Both sides live in one process (generator thread, trainer thread), so a group travels by reference
and the weights by `engine.update_weights`, which the engine applies between decode steps while the
generator keeps running (in-flight update).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import torch

from scalerl.pipeline.interfaces import ReadyGroup, Selector
from scalerl.rollout.fingerprint import SyncFigures, channel_metrics, timed_verify
from scalerl.rollout.probe import ProbeFigures, SyncProbe, probe_engine
from scalerl.rollout.protocol import Engine
from scalerl.rollout.vllm_versions import WAKE_KV_CACHE, WAKE_WEIGHTS

T = TypeVar("T")


class LocalGroupQueue:
    """Thread-safe FIFO of `ReadyGroup`s with an all-or-nothing `get_batch`."""

    def __init__(self) -> None:
        self._items: deque[ReadyGroup] = deque()
        self._cond = threading.Condition()

    def put(self, item: ReadyGroup) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def get_batch(
        self, n: int, timeout: float | None = None, select: Selector | None = None
    ) -> list[ReadyGroup] | None:
        """The first `n` items (FIFO), or with `select` the items it picks (indices into the queue,
        in queue order; None: no valid batch yet, wait), once available; None after `timeout`."""
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if select is None:
                    pick = list(range(n)) if len(self._items) >= n else None
                else:
                    pick = select(list(self._items)) if len(self._items) >= n else None
                if pick is not None:
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if len(pick) != n or len(set(pick)) != n:
                raise ValueError(f"select: expected {n} distinct indices, got {pick}")
            chosen = set(pick)
            items = list(self._items)
            self._items = deque(it for i, it in enumerate(items) if i not in chosen)
            return [items[i] for i in sorted(chosen)]

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def snapshot(self) -> list[ReadyGroup]:
        with self._cond:
            return list(self._items)


class EngineWeightChannel:
    """Publishes weights straight into an engine in this process, then verifies that the engine
    holds them (`scalerl.rollout.fingerprint`) and computes with them (`probe`, the trainer's side
    of `scalerl.rollout.probe`: the engine's probe log-probs against the trainer's at the version
    sent); a mismatch of either raises `WeightSyncError`, the run stops."""

    def __init__(self, engine: Engine, probe: SyncProbe | None = None, name: str = "engine") -> None:
        self.engine = engine
        self.probe = probe
        self.name = name
        self.published_version: int | None = None
        self.publish_seconds = 0.0
        self.last_seconds = 0.0
        self.syncs = 0
        self.verification = SyncFigures()
        self.probe_figures = ProbeFigures()

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        start = time.perf_counter()
        self.engine.update_weights(state, version)
        timed_verify(self.verification, self.engine, state, version, self.name)
        probe_engine(self.probe_figures, self.probe, self.engine, version, self.name)
        self.last_seconds = time.perf_counter() - start
        self.publish_seconds += self.last_seconds
        self.syncs += 1
        self.published_version = version

    def metrics(self) -> dict[str, float]:
        return channel_metrics(self.last_seconds, self.publish_seconds, self.syncs, self.verification,
                               self.probe_figures)


# ----------------------------------------------------------------------------- colocated layout


class EngineCallTimeoutError(RuntimeError):
    """A colocated engine's sleep, wake or weight load did not return within its bound (exit 1)."""


def bounded(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """`call()` on a helper thread, waited for at most `timeout_s` seconds; its exception is
    re-raised here, and `EngineCallTimeoutError` naming `what` is raised after the bound (the hung call
    keeps its daemon thread; the run stops). The caller's CUDA device is the helper's too."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    device = torch.cuda.current_device() if cuda else None
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            box["value"] = call()
        except BaseException as err:  # re-raised on the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"scalerl-bounded-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise EngineCallTimeoutError(f"{what}: no answer within {timeout_s:g} s "
                                     "(generation.vllm.sleep_timeout_s); the run stops")
    if "error" in box:
        raise box["error"]
    return box["value"]


class SleepingEngine(Protocol):
    """What the colocated channel drives (`scalerl.rollout.vllm_engine.VLLMEngine` built with
    `sleep_mode=True`): the `Engine` weight calls plus vLLM's sleep and wake."""

    @property
    def version(self) -> int: ...

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None: ...

    def sleep(self, level: int) -> int: ...

    def wake_up(self, tags: Sequence[str]) -> bool: ...


class ColocatedWeightChannel(EngineWeightChannel):
    """Weights into an engine that shares the trainer's devices and sleeps between rounds (the
    colocated layout, `generation.vllm.colocate`; docs/vllm.md).

    `release()` (the round's generation is done): `engine.sleep(level)`, freeing the KV cache and
    offloading (level 1) or discarding (level 2) the weights, so the trainer's step has the memory.
    `publish(state, version)` on a sleeping engine: wake its weights, hand it the trainer's tensors
    (`update_weights` in this process: the tensors themselves, device memory by reference, no host
    copy), verify their fingerprints (`WeightSyncError` naming the engine), then wake the KV cache;
    the engine schedules again only then. `prepare(weights, version)` (before a round generates):
    awake already, a publish if stale; asleep at level 1 holding `version`, both pools woken with
    nothing loaded; otherwise (stale, or level 2's discarded weights) a publish. Each call is
    bounded by `timeout_s` (`EngineCallTimeoutError` naming the engine and the call).
    """

    def __init__(self, engine: SleepingEngine, *, level: int = 1, timeout_s: float = 300.0,
                 name: str = "vLLM engine", probe: SyncProbe | None = None) -> None:
        if level not in (1, 2):
            raise ValueError(f"level: vLLM sleeps at level 1 or 2, got {level}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
        super().__init__(engine, probe)  # type: ignore[arg-type]  # an Engine with sleep and wake
        self.engine: Any = engine
        self.level = int(level)
        self.timeout_s = float(timeout_s)
        self.name = name
        self.asleep = False
        self.slept_level = 0  # the level of the sleep in progress (`level` may change between rounds)
        self.sleeps = 0
        self.sleep_seconds = 0.0  # cumulative, sleep calls
        self.wake_seconds = 0.0  # cumulative, both wakes (the load in between not included)
        self.last_freed_bytes = 0  # device memory the last sleep freed (0 without CUDA)
        self.last_handoff_s = 0.0  # the last load into a woken engine (verification not included)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        return bounded(call, self.timeout_s, f"{self.name}: {what}")

    def _wake(self, tags: Sequence[str]) -> bool:
        start = time.perf_counter()
        awake = self._call(f"wake_up({list(tags)})", lambda: self.engine.wake_up(list(tags)))
        self.wake_seconds += time.perf_counter() - start
        return bool(awake)

    def release(self) -> None:
        if self.asleep:
            return
        start = time.perf_counter()
        freed = self._call(f"sleep(level={self.level})", lambda: self.engine.sleep(self.level))
        self.sleep_seconds += time.perf_counter() - start
        self.last_freed_bytes = int(freed or 0)
        self.sleeps += 1
        self.asleep, self.slept_level = True, self.level

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        start = time.perf_counter()
        if self.probe is not None:
            self.probe.expected(version)  # the trainer's probe while the engine sleeps (its memory)
        woke = self.asleep
        if woke and self._wake([WAKE_WEIGHTS]):
            raise RuntimeError(f"{self.name}: fully awake after waking only its weights (its KV cache "
                               "did not sleep); the colocated layout expects both to sleep")
        load_start = time.perf_counter()
        self._call(f"load weights of version {version}", lambda: self.engine.update_weights(state, version))
        self.last_handoff_s = time.perf_counter() - load_start
        self._call(f"verify weights of version {version}",
                   lambda: timed_verify(self.verification, self.engine, state, version, self.name))
        if woke:
            if not self._wake([WAKE_KV_CACHE]):
                raise RuntimeError(f"{self.name}: still asleep after waking its weights and KV cache")
            self.asleep = False
        # The probe needs the KV cache: scored once the engine is fully awake.
        self._call(f"probe weights of version {version}",
                   lambda: probe_engine(self.probe_figures, self.probe, self.engine, version, self.name))
        self.last_seconds = time.perf_counter() - start
        self.publish_seconds += self.last_seconds
        self.syncs += 1
        self.published_version = version

    def prepare(self, weights: Callable[[], Mapping[str, torch.Tensor]], version: int) -> None:
        if self.engine.version == version and not self.asleep:
            return
        if self.engine.version == version and self.slept_level == 1:
            # Level 1 kept the weights in host memory: both pools back, nothing to load.
            if not self._wake([WAKE_WEIGHTS, WAKE_KV_CACHE]):
                raise RuntimeError(f"{self.name}: still asleep after waking its weights and KV cache")
            self.asleep = False
            return
        self.publish(weights(), version)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "colocate_sleeps": float(self.sleeps),
                "colocate_sleep_s_total": self.sleep_seconds, "colocate_wake_s_total": self.wake_seconds,
                "colocate_freed_gib": self.last_freed_bytes / 2**30,
                "colocate_handoff_s": self.last_handoff_s}
