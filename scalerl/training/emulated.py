"""A trainer-device emulator for benchmarks and tests: the `Trainer` protocol without a model.

`EmulatedTrainer` plays the trainer side of the pipeline the way `scalerl.rollout.emulated` plays
an engine: each `step(groups)` costs modelled seconds,
`slowdown * (step_s + token_s * tokens)` with `tokens` the batch's generated tokens (prompt tokens
are not counted: response tokens dominate RL training), spent in `time.sleep` (no CPU, the GIL
released) so that on a small machine the trainer behaves like its own accelerator next to emulated
engines. Every step raises `version` by one; `weights_for_engine()` is a float32 tensor of
`weight_numel` elements filled with the version (a payload of a chosen size for weight transfers).

It learns nothing: the benchmarks that use it measure the systems side (samples/s, idle time,
version lag), never a learning curve.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from scalerl.training.batch import ScoredGroup


class EmulatedTrainer:
    """`Trainer` protocol: modelled step time, +1 version per step (see the module docstring)."""

    def __init__(
        self,
        *,
        step_s: float = 0.05,
        token_s: float = 0.0,
        slowdown: float = 1.0,
        weight_numel: int = 1,
        initial_version: int = 0,
        sleep: bool = True,
    ) -> None:
        if step_s < 0 or token_s < 0:
            raise ValueError(f"step_s / token_s: must be >= 0, got {step_s}, {token_s}")
        if not slowdown > 0:
            raise ValueError(f"slowdown: must be > 0, got {slowdown}")
        if weight_numel < 1:
            raise ValueError(f"weight_numel: must be >= 1, got {weight_numel}")
        self.step_s = step_s
        self.token_s = token_s
        self.slowdown = slowdown
        self.weight_numel = int(weight_numel)
        self.sleep = sleep
        self._version = int(initial_version)
        self.steps = 0
        self.device_s = 0.0  # modelled seconds of all steps

    @property
    def version(self) -> int:
        return self._version

    def step_seconds(self, tokens: int) -> float:
        return self.slowdown * (self.step_s + self.token_s * tokens)

    def step(self, groups: Sequence[ScoredGroup]) -> dict[str, float]:
        if not groups:
            raise ValueError("EmulatedTrainer.step: no groups")
        tokens = sum(c.num_tokens for g in groups for c in g.completions)
        seconds = self.step_seconds(tokens)
        if self.sleep and seconds > 0:
            time.sleep(seconds)
        self.steps += 1
        self.device_s += seconds
        self._version += 1
        return {"train_tokens": float(tokens), "train_device_s": seconds, "version": float(self._version)}

    def weights_for_engine(self) -> dict[str, torch.Tensor]:
        return {"weight": torch.full((self.weight_numel,), float(self._version))}
