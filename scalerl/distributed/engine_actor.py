"""One generation engine in its own process: the body of a Ray engine actor.

`EngineWorker` builds its engine from a picklable factory (`EngineFactory`: an `EngineSpec` through
`scalerl.rollout.factory.build_engine`, or any callable, e.g. an emulated engine for benchmarks) and
runs it on a background thread: whenever it has sequences it steps, and finished completions wait
in an outbox until the controller's next `poll`. Submissions are queued to the loop thread, so the
engine sees `submit`/`step` from one thread only and `update_weights` from another, as the `Engine`
protocol's thread-safety contract allows (in-flight updates, PipelineRL).

The actor is created with `max_concurrency` > 1, so a weight update (object store or collective)
runs while a `poll` waits and while the loop thread decodes: the engine applies it between two of
its steps.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from scalerl.distributed.weights import BucketMeta, WeightGroup
from scalerl.rollout.factory import EngineSpec, build_engine
from scalerl.rollout.fingerprint import Fingerprint
from scalerl.rollout.protocol import Completion, Engine, GenerationRequest


@dataclass(frozen=True)
class EngineFactory:
    """Build an engine through the one engine factory, from plain picklable values.

    `device` ("cuda") puts the embedded engine's model there (Ray granted the actor a GPU, which it
    sees as cuda:0); vLLM places itself. `num_cpus` / `num_gpus` are the actor's Ray reservation
    (`distributed.engine_num_cpus` / `engine_num_gpus`): a vLLM engine checks them against its
    platform before it is built (a CPU vLLM reserving GPUs, or a GPU vLLM given none, is a
    `ConfigError` naming the key), and the engine's torch threads are capped at the reserved CPUs
    (at least one), so engines sharing a node do not oversubscribe it.
    """

    spec: EngineSpec
    device: str | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None  # None: 1 when `device` is "cuda", else 0

    def __call__(self) -> Engine:
        if self.num_cpus is not None:
            torch.set_num_threads(cpu_threads(self.num_cpus))
        if self.spec.kind == "vllm":
            from scalerl.rollout.vllm_versions import check_engine_devices, platform_device

            gpus = self.num_gpus if self.num_gpus is not None else float(self.device == "cuda")
            tp = int(self.spec.options.get("tensor_parallel_size", 1))
            check_engine_devices(platform_device(), gpus, tp)
        if self.spec.kind == "embedded" and self.device is not None and self.spec.model_path is not None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(self.spec.model_path, dtype=torch.float32)
            return build_engine(self.spec, model=model.to(self.device))
        return build_engine(self.spec)


def engine_figures(engine: Engine) -> dict[str, float]:
    """The engine's cumulative figures if it keeps any (vLLM's `stats.figures()`: prompt tokens,
    prefix-cache hits), else {}."""
    stats = getattr(engine, "stats", None)
    figures = getattr(stats, "figures", None)
    return dict(figures()) if callable(figures) else {}


def cpu_threads(num_cpus: float) -> int:
    """Intra-op threads for an actor reserving `num_cpus` logical CPUs: floor, at least 1."""
    return max(1, int(num_cpus))


@dataclass
class PollResult:
    completions: list[Completion]
    version: int
    unfinished: int
    busy_s: float  # cumulative seconds inside engine steps
    idle_s: float  # cumulative seconds with nothing to run
    steps: int
    figures: dict[str, float]  # the engine's own cumulative figures (`stats.figures()`), or {}


class EngineWorker:
    """See module docstring. `name` labels errors and logs ("engine 2")."""

    def __init__(self, factory: Callable[[], Engine], name: str = "engine") -> None:
        self.name = name
        self.engine = factory()
        self._cond = threading.Condition()
        self._inbox: deque[GenerationRequest] = deque()
        self._outbox: list[Completion] = []
        self._error: BaseException | None = None
        self._stop = False
        self._busy_s = 0.0
        self._idle_s = 0.0
        self._idle_since: float | None = time.perf_counter()
        self._steps = 0
        self._group: WeightGroup | None = None
        self._thread = threading.Thread(target=self._loop, name=f"scalerl-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._inbox and self.engine.num_unfinished() == 0:
                        if self._idle_since is None:
                            self._idle_since = time.perf_counter()
                        self._cond.wait(0.5)
                    if self._stop:
                        return
                    batch = list(self._inbox)
                    self._inbox.clear()
                    if self._idle_since is not None:
                        self._idle_s += time.perf_counter() - self._idle_since
                        self._idle_since = None
                if batch:
                    self.engine.submit(batch)
                start = time.perf_counter()
                done = self.engine.step()
                elapsed = time.perf_counter() - start
                with self._cond:
                    self._busy_s += elapsed
                    self._steps += 1
                    if done:
                        self._outbox.extend(done)
                        self._cond.notify_all()
        except BaseException as err:  # surfaced to the controller by the next `poll`
            with self._cond:
                self._error = err
                self._cond.notify_all()

    # ------------------------------------------------------------------------------ remote methods
    def ready(self) -> dict[str, Any]:
        """Where the actor runs (the controller waits on this with the start-up timeout), and the
        dtype its weights are held in (None: an engine that cannot fingerprint them)."""
        return {"pid": os.getpid(), "version": self.engine.version, "name": self.name,
                "weight_dtype": getattr(self.engine, "weight_dtype", None)}

    def weight_fingerprints(self) -> dict[str, Fingerprint] | None:
        """What the engine holds now (`scalerl.rollout.fingerprint`); None if it cannot tell."""
        held_of = getattr(self.engine, "weight_fingerprints", None)
        return held_of() if callable(held_of) else None

    def probe_logprobs(self, probe: Sequence[Sequence[int]]) -> list[list[float]] | None:
        """The weight-sync probe scored by the engine (`scalerl.rollout.probe`), between two of its
        steps; None for an engine that cannot score."""
        score = getattr(self.engine, "probe_logprobs", None)
        return score(tuple(tuple(s) for s in probe)) if callable(score) else None

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self._cond:
            self._raise_if_failed()
            self._inbox.extend(requests)
            self._cond.notify_all()

    def poll(self, wait_s: float) -> PollResult:
        """Completions finished since the last poll; waits up to `wait_s` for at least one."""
        with self._cond:
            if not self._outbox and self._error is None:
                self._cond.wait(wait_s)
            self._raise_if_failed()
            done, self._outbox = self._outbox, []
            idle = self._idle_s + (time.perf_counter() - self._idle_since if self._idle_since else 0.0)
            unfinished = len(self._inbox) + self.engine.num_unfinished()
            return PollResult(done, self.engine.version, unfinished, self._busy_s, idle, self._steps,
                              engine_figures(self.engine))

    def update_weights(self, version: int, *buckets: dict[str, torch.Tensor]) -> int:
        """Object-store sync: Ray resolved the bucket refs into tensors; load them in flight."""
        state: dict[str, torch.Tensor] = {}
        for bucket in buckets:
            state.update(bucket)
        self.engine.update_weights(state, version)
        return self.engine.version

    def init_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str,
                          timeout_s: float) -> None:
        """Join the collective weight-sync group (rank 0 is the trainer's rank 0)."""
        self.close_weight_group()
        self._group = WeightGroup(host, port, rank, world_size, backend, timeout_s)

    def close_weight_group(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None

    def receive_weights(self, buckets: list[BucketMeta], version: int) -> int:
        """Collective sync: receive every bucket from rank 0, then load them in flight."""
        if self._group is None:
            raise RuntimeError(f"{self.name}: receive_weights before init_weight_group")
        state = self._group.receive_state(buckets)
        self.engine.update_weights(state, version)
        return self.engine.version

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        self.close_weight_group()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"{self.name}: engine loop failed: {self._error!r}") from self._error
