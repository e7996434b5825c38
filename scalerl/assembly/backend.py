"""Where a run's training and generation happen: the seam between the root and its two backends.

`local.local_backend` (this process) and `ray.ray_backend` (a Ray cluster, `distributed.backend:
ray`) each return a `Backend`; `build.build_training` wires the rest of the run around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalerl.rollout import Engine
from scalerl.telemetry import ComputeMeter


@dataclass
class Backend:
    """Where training and generation run: this process (`local_backend`) or a Ray cluster
    (`scalerl.assembly.ray.ray_backend`, for `distributed.backend: ray`)."""

    trainer: Any  # the pipeline's `Trainer` protocol
    engine: Engine
    tokenizer: Any
    meter: ComputeMeter
    start_step: int
    resume_state: dict[str, Any] | None
    checkpoint: Any  # (step, pipeline state[, snapshot=...]) -> None (see `Components.checkpoint`)
    channel: Any = None  # a `WeightChannel`; None: straight into the engine
    wrap_metrics: Any = None  # sink -> sink that adds the backend's per-step figures
    closers: list[Any] = field(default_factory=list)
