"""Engines for the pool tests, importable by Ray workers (tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import os

from pipeline.fakes import FakeEngine

from scalerl.rollout.protocol import Completion


class CrashingEngine(FakeEngine):
    """A `FakeEngine` whose process exits (as a segfault or an OOM kill would) after `crash_after`
    engine steps."""

    def __init__(self, crash_after: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.crash_after = crash_after

    def step(self) -> list[Completion]:
        if self.steps >= self.crash_after:
            os._exit(1)
        return super().step()
