"""A progress bar over optimizer steps with ETA (tqdm), showing a few headline metrics."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from tqdm import tqdm

DEFAULT_KEYS: tuple[str, ...] = ("loss", "reward_mean", "val_pass_rate", "compute_device_hours")


class Progress:
    """`update(step, row)` moves the bar to `step` (steps are absolute, so a resumed run starts where
    it left off) and shows `keys` from `row`. Disabled, it does nothing."""

    def __init__(
        self,
        total_steps: int,
        initial_step: int = 0,
        enabled: bool = True,
        keys: Sequence[str] = DEFAULT_KEYS,
        file: TextIO | None = None,
        desc: str = "train",
    ) -> None:
        self.keys = tuple(keys)
        self._shown: dict[str, str] = {}
        self._bar: tqdm | None = None
        self._file = file
        if enabled:
            self._bar = tqdm(
                total=total_steps,
                initial=initial_step,
                desc=desc,
                unit="step",
                file=file if file is not None else sys.stderr,
                dynamic_ncols=True,
            )

    @property
    def n(self) -> int:
        return int(self._bar.n) if self._bar is not None else 0

    def update(self, step: int, row: Mapping[str, Any] | None = None) -> None:
        if self._bar is None:
            return
        for key in self.keys:
            value = (row or {}).get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._shown[key] = f"{value:.4g}"
        if self._shown:
            self._bar.set_postfix(self._shown, refresh=False)
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)
        else:
            self._bar.refresh()

    def write(self, message: str) -> None:
        """Print a line without breaking the bar, on the bar's stream (stderr: stdout is the
        command's result)."""
        stream = self._file if self._file is not None else sys.stderr
        if self._bar is not None:
            self._bar.write(message, file=stream)
        else:
            print(message, file=stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
