"""In-process transports: a condition-variable group queue and a weight channel that calls the engine.

Both sides live in one process (generator thread, trainer thread), so a group travels by reference
and the weights by `engine.update_weights`, which the engine applies between decode steps while the
generator keeps running (in-flight update).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping

import torch

from scalerl.pipeline.interfaces import ReadyGroup
from scalerl.rollout.fingerprint import SyncFigures, channel_metrics, timed_verify
from scalerl.rollout.protocol import Engine


class LocalGroupQueue:
    """Thread-safe FIFO of `ReadyGroup`s with an all-or-nothing `get_batch`."""

    def __init__(self) -> None:
        self._items: deque[ReadyGroup] = deque()
        self._cond = threading.Condition()

    def put(self, item: ReadyGroup) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def get_batch(self, n: int, timeout: float | None = None) -> list[ReadyGroup] | None:
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._items) < n:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return [self._items.popleft() for _ in range(n)]

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def snapshot(self) -> list[ReadyGroup]:
        with self._cond:
            return list(self._items)


class EngineWeightChannel:
    """Publishes weights straight into an engine in this process, then verifies that the engine
    holds them (`scalerl.rollout.fingerprint`: a mismatch raises `WeightSyncError`, the run stops)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.published_version: int | None = None
        self.publish_seconds = 0.0
        self.last_seconds = 0.0
        self.syncs = 0
        self.verification = SyncFigures()

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        start = time.perf_counter()
        self.engine.update_weights(state, version)
        timed_verify(self.verification, self.engine, state, version)
        self.last_seconds = time.perf_counter() - start
        self.publish_seconds += self.last_seconds
        self.syncs += 1
        self.published_version = version

    def metrics(self) -> dict[str, float]:
        return channel_metrics(self.last_seconds, self.publish_seconds, self.syncs, self.verification)
