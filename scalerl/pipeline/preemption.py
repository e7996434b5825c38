"""Stopping a run from outside the loop: SIGTERM / SIGINT, a wall-clock limit, at a safe boundary.

A cluster preempts a job with SIGTERM and a grace period (Kubernetes 30 s by default, SLURM's
`--signal`, spot instances 30 s to 2 min), then SIGKILL. Dying at once loses everything since the
last checkpoint; ignoring the signal loses it at the SIGKILL. `stop_on_signals()` turns the first
SIGTERM or SIGINT into a `StopRequest`; the driver polls it between steps and, through
`should_stop`, inside the long waits of a step (the generator's fill of a round, the interleaved
ticks, the wait for queued groups), then checkpoints and exits non-zero (128 + the signal number).
What a poll inside a step may stop is only work that has not reached the trainer yet: the
batch being assembled. Its state (the prompts in flight, the groups queued) is part of the
checkpoint, so the resumed run carries on with it (`Driver.state_dict`, `Driver.snapshot`).

What is not interrupted, because it is bounded and stopping it halfway has no safe state: one
optimizer step, one held-out evaluation, one checkpoint write. The time from the signal to the
exit is therefore at most one of each plus one engine step (`docs/reliability.md` measures it).

A second SIGINT (Ctrl-C twice) raises `KeyboardInterrupt` at once: the user who wants out now gets
out, without a checkpoint. A second SIGTERM changes nothing (the first is already being served).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

logger = logging.getLogger(__name__)
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):  # noqa: N818 - control flow, not an error
    """Raised inside a step's wait when a stop was requested: the batch being assembled is left
    where it is (its state goes into the checkpoint), no step is taken."""


class StopRequest:
    """A thread-safe flag with the reason a run should stop (the first reason wins)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._reason: str | None = None
        self._lock = threading.Lock()

    def request(self, reason: str) -> bool:
        """Ask for a stop; returns False if one was already asked (the first reason is kept)."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            self._event.set()
            return True

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        with self._lock:
            return self._reason


def exit_status(signal_name: str) -> int:
    """The shell's status for a process ended by `signal_name`: 128 + its number (SIGTERM: 143)."""
    return 128 + int(signal.Signals[signal_name])


@contextlib.contextmanager
def stop_on_signals(
    stop: StopRequest,
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
    say: Callable[[str], None] = logger.info,
) -> Iterator[StopRequest]:
    """While the block runs, SIGTERM / SIGINT request `stop` instead of killing the process.

    Only the main thread can install handlers; elsewhere (a test runner's worker thread) the block
    runs with the process's handlers unchanged. The previous handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.request(name):
            say(f"train: {name} received: stopping at the next step boundary and writing a checkpoint "
                "(Ctrl-C again to abort without one)")
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
