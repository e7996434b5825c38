"""Thread-safe plumbing shared by the engines: the `Engine` protocol on top of four hooks.

The pipeline runs `step()` in a generator thread and calls `update_weights()` from the trainer
thread. One lock guards the model and the engine state, so a weight update lands between two steps
and every token of a step is tagged with the version of the weights that produced it. A waiting
update is served before the next step takes the lock (a busy generator loop would otherwise
re-acquire it at once and starve the trainer).

`generate()` keeps the completions of its own requests even if another thread's `step()` finishes
them; completions of other requests are handed out by the next `step()`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import torch

from scalerl.rollout.protocol import Completion, GenerationRequest

# (request serial, sample index, completion)
Finished = tuple[int, int, Completion]


class SteppingEngine(ABC):
    """Implements `version`, `submit`, `step`, `num_unfinished`, `generate` and `update_weights`;
    subclasses implement the `_locked` hooks, which always run under `self._lock`."""

    def __init__(self, initial_version: int = 0) -> None:
        self._version = initial_version
        self._serial = 0
        self._lock = threading.Lock()
        self._turn = threading.Condition()
        self._updates_waiting = 0
        self._undelivered: list[Completion] = []
        self._claimed: set[int] = set()  # serials a `generate()` call is waiting for
        self._claimed_results: dict[tuple[int, int], Completion] = {}

    # ----------------------------------------------------------------------------- hooks
    @abstractmethod
    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        """Validate and queue `requests` (request i gets `serials[i]`); raise before queueing any."""

    @abstractmethod
    def _step_locked(self) -> list[Finished]:
        """One decode step; return the samples that finished in it."""

    @abstractmethod
    def _load_weights_locked(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy `state` into the generation weights (in flight)."""

    @abstractmethod
    def _num_unfinished_locked(self) -> int:
        """Sequences queued or in flight."""

    # ----------------------------------------------------------------------------- protocol
    @property
    def version(self) -> int:
        return self._version

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        with self._lock:
            self._submit_with_serials(requests)

    def num_unfinished(self) -> int:
        # Completions another thread's `generate()` finished for us count until `step()` hands
        # them out: a caller that sees 0 stops stepping.
        with self._lock:
            return self._num_unfinished_locked() + len(self._undelivered)

    def step(self) -> list[Completion]:
        self._wait_for_updates()
        with self._lock:
            done, self._undelivered = self._undelivered, []
            for serial, index, completion in self._step_locked():
                if serial in self._claimed:
                    self._claimed_results[(serial, index)] = completion
                else:
                    done.append(completion)
            return done

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with self._lock:
            serials = self._submit_with_serials(requests)
            self._claimed.update(serials)
        keys = [(serial, i) for serial, r in zip(serials, requests, strict=True) for i in range(r.params.n)]
        try:
            while True:
                with self._lock:
                    if all(key in self._claimed_results for key in keys):
                        return [self._claimed_results.pop(key) for key in keys]
                self._wait_for_updates()
                with self._lock:
                    for serial, index, completion in self._step_locked():
                        if serial in self._claimed:
                            self._claimed_results[(serial, index)] = completion
                        else:
                            self._undelivered.append(completion)
        finally:
            with self._lock:
                self._claimed.difference_update(serials)

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        with self._turn:
            self._updates_waiting += 1
        try:
            with self._lock:
                self._load_weights_locked(state)
                self._version = version
        finally:
            with self._turn:
                self._updates_waiting -= 1
                self._turn.notify_all()

    # ----------------------------------------------------------------------------- helpers
    def _deliver_locked(self, finished: Sequence[Finished]) -> None:
        """Completions finished by a step run outside `step` / `generate` (an engine scoring the
        weight-sync probe steps its requests too): held for whoever waits for them."""
        for serial, index, completion in finished:
            if serial in self._claimed:
                self._claimed_results[(serial, index)] = completion
            else:
                self._undelivered.append(completion)

    def _submit_with_serials(self, requests: Sequence[GenerationRequest]) -> list[int]:
        serials = list(range(self._serial, self._serial + len(requests)))
        self._submit_locked(requests, serials)
        self._serial += len(requests)
        return serials

    def _wait_for_updates(self) -> None:
        with self._turn:
            while self._updates_waiting:
                self._turn.wait()
