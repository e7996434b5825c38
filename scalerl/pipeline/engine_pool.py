"""Several engines in this process behind one `Engine`: each on its own stepping thread.

`ThreadedEnginePool(engines)` is what the generator loop drives when there is more than one engine
in the process (several devices, or device emulators, `scalerl.rollout.emulated`). It keeps the
`Engine` contract, so the `Generator`, the modes and the staleness proof see one engine:

* Placement: each request (a group of `n` samples) goes whole to the least-loaded engine (fewest
  sequences queued or in flight, counted by the pool so that choosing never waits for an engine's
  step; ties go to the lowest index).
* Streaming: every engine runs its own thread that submits what was routed to it and steps while
  it has work, so engines advance independently, at their own speed; `step()` returns the
  completions any engine finished since the last call, waiting at most `poll_s` for one (the
  generator loop must come back to admit new groups promptly).
* Versions: `version` is the minimum over the engines. A group admitted at pool version `v` lands
  on an engine whose version is `>= v`, so every sample's `start_version >= v`: the max-lag
  admission bound (`staleness.py`) holds for any number of engines, and a slow engine (slow to
  step or slow to load weights) only throttles admission.
* Weights: `update_weights(state, version)` sends the state to every engine at once (one thread
  each, in flight: each applies it between two of its steps) and returns when all have it.
* `generate()` keeps its own completions, as `SteppingEngine` does; other completions go to the
  next `step()`.

A failure in an engine thread is re-raised by the next `step()` / `generate()` on the caller's
thread. `close()` stops the threads (they are daemons, so a forgotten pool does not hang exit).
`busy_seconds()` is, per engine, the wall time its thread spent inside `step()` with work: device
time for an emulated engine, hence the per-device idle fraction `1 - busy / wall`.

A distributed pool (engine actors in other processes) keeps the same rules; only the transport
differs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from scalerl.rollout.protocol import Completion, Engine, GenerationRequest
from scalerl.training.threads import same_threads_as_caller


@dataclass
class _Routed:
    serial: int
    request_id: str  # the caller's
    remaining: int  # samples not yet finished


class EngineThreadError(RuntimeError):
    """An engine of the pool failed on its thread."""


class ThreadedEnginePool:
    """An `Engine` made of `engines`, each stepped on its own thread (see the module docstring)."""

    def __init__(self, engines: Sequence[Engine], *, poll_s: float = 0.005) -> None:
        if not engines:
            raise ValueError("ThreadedEnginePool: needs at least one engine")
        if poll_s <= 0:
            raise ValueError(f"poll_s: must be > 0, got {poll_s}")
        self.engines = list(engines)
        self.poll_s = poll_s
        n = len(self.engines)
        self._cond = threading.Condition()
        self._inbox: list[list[GenerationRequest]] = [[] for _ in range(n)]
        self._load = [0] * n  # sequences routed to each engine and not yet returned
        self._busy_s = [0.0] * n
        self._serial = 0
        self._routed: dict[str, _Routed] = {}  # by internal request id
        self._undelivered: list[Completion] = []
        self._claimed: set[int] = set()
        self._claimed_results: dict[tuple[int, int], Completion] = {}
        self._error: BaseException | None = None
        self._stop = False
        self._threads = [
            threading.Thread(target=self._work, args=(i, same_threads_as_caller()),
                             name=f"scalerl-engine-{i}", daemon=True)
            for i in range(n)
        ]
        for thread in self._threads:
            thread.start()

    # ----------------------------------------------------------------------------- protocol
    @property
    def version(self) -> int:
        return min(e.version for e in self.engines)

    def num_unfinished(self) -> int:
        # Finished but not yet handed out by `step()` still counts: a caller that sees 0 must be
        # able to trust that no completion is waiting for it.
        with self._cond:
            return sum(self._load) + len(self._undelivered)

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self._cond:
            self._route_requests(requests)

    def step(self) -> list[Completion]:
        with self._cond:
            self._raise_if_failed()
            if not self._undelivered and sum(self._load):
                self._cond.wait_for(lambda: bool(self._undelivered) or self._error is not None, self.poll_s)
                self._raise_if_failed()
            done, self._undelivered = self._undelivered, []
            return done

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with self._cond:
            serials = self._route_requests(requests)
            self._claimed.update(serials)
            keys = [(s, i) for s, r in zip(serials, requests, strict=True) for i in range(r.params.n)]
            try:
                self._cond.wait_for(
                    lambda: self._error is not None or all(k in self._claimed_results for k in keys)
                )
                self._raise_if_failed()
                return [self._claimed_results.pop(k) for k in keys]
            finally:
                self._claimed.difference_update(serials)

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        errors: list[BaseException] = []

        def send(engine: Engine) -> None:
            try:
                engine.update_weights(state, version)
            except BaseException as err:  # re-raised below, on the caller's thread
                errors.append(err)

        senders = [threading.Thread(target=send, args=(e,), daemon=True) for e in self.engines]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join()
        if errors:
            raise errors[0]

    # ----------------------------------------------------------------------------- pool
    def busy_seconds(self) -> list[float]:
        """Per engine: wall seconds its thread spent in `step()` with work, since construction."""
        with self._cond:
            return list(self._busy_s)

    def loads(self) -> list[int]:
        """Per engine: sequences routed to it and not yet finished (by the engine)."""
        with self._cond:
            return list(self._load)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> ThreadedEnginePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise EngineThreadError(f"an engine of the pool failed: {self._error!r}") from self._error

    def _route_requests(self, requests: Sequence[GenerationRequest]) -> list[int]:
        """Under the lock: give each request a serial and an internal id (request ids need not be
        unique across callers), and queue it for the least-loaded engine."""
        if self._stop:
            raise RuntimeError("ThreadedEnginePool: closed")
        serials = []
        for request in requests:
            serial = self._serial
            self._serial += 1
            internal = f"{serial}:{request.request_id}"
            self._routed[internal] = _Routed(serial, request.request_id, request.params.n)
            target = min(range(len(self.engines)), key=lambda i: (self._load[i], i))
            self._inbox[target].append(replace(request, request_id=internal))
            self._load[target] += request.params.n
            serials.append(serial)
        self._cond.notify_all()
        return serials

    def _deliver(self, index: int, finished: list[Completion]) -> None:
        """Under the lock: hand `finished` (from engine `index`) to `generate()` or `step()`."""
        self._load[index] -= len(finished)
        for completion in finished:
            routed = self._routed[completion.request_id]
            routed.remaining -= 1
            if routed.remaining == 0:
                del self._routed[completion.request_id]
            completion.request_id = routed.request_id
            serial = routed.serial
            if serial in self._claimed:
                self._claimed_results[(serial, completion.sample_index)] = completion
            else:
                self._undelivered.append(completion)
        self._cond.notify_all()

    def _work(self, index: int, set_threads: Callable[[], None]) -> None:
        set_threads()
        engine = self.engines[index]
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(
                        lambda: self._stop or bool(self._inbox[index]) or self._load[index] > 0
                    )
                    if self._stop:
                        return
                    new, self._inbox[index] = self._inbox[index], []
                if new:
                    engine.submit(new)
                start = time.perf_counter()
                finished = engine.step()
                elapsed = time.perf_counter() - start
                with self._cond:
                    self._busy_s[index] += elapsed
                    self._deliver(index, finished)
        except BaseException as err:  # surfaced by step() / generate() on the caller's thread
            with self._cond:
                self._error = err
                self._cond.notify_all()
