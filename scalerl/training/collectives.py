"""Where a training step's rows run and how per-process results combine: the single-process case.

`Trainer.step` is written once for one process and for many. The points where a step spread over
several processes differs are the methods of `StepCollectives`; this base class is the one-process
step (every row here, nothing to reduce), and `scalerl.distributed` overrides them for FSDP2 ranks.

What makes a sharded step equal the one-process step exactly: every process prepares the WHOLE
batch (advantages, aggregation weights with their global token/sample/prompt denominators), then
runs forward/backward on its own rows only, so the gradients of all processes sum to the full
batch's gradient, and the step's statistics are merged from every process's partial sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import torch
from torch import Tensor

from scalerl.training.forward import ResponseForward, response_forward
from scalerl.training.packing import Lengths, MicroBatching

T = TypeVar("T")


class StepCollectives:
    """The one-process step. Subclasses spread a step over processes (see module docstring)."""

    #: True when every process must run the same sequence of passes (a sharded model's forward and
    #: backward are collectives): a non-finite value then marks the step bad instead of ending it
    #: at once, and the remaining passes still run, learning nothing.
    lockstep: bool = False

    def micro_batch_plan(self, lengths: Lengths, batching: MicroBatching) -> list[list[int]]:
        """This process's micro-batches, as row indices into the step's batch whose rows have the
        `(prompt, response)` token counts `lengths` (`training.packing.MicroBatching.plan`).

        An empty list is a pass that learns nothing (only in lockstep: a process with fewer rows
        than its peers keeps pace with them).
        """
        return batching.plan(lengths)

    def forward(self, model: torch.nn.Module, batch: Any, **kwargs: Any) -> ResponseForward:
        """`training.forward.response_forward` of `model` on `batch`."""
        return response_forward(model, batch, **kwargs)

    def sum_rows(self, tensor: Tensor) -> Tensor:
        """Elementwise sum over processes of a tensor each process filled on its own rows only
        (zeros elsewhere): the full-batch tensor."""
        return tensor

    def gather(self, obj: T) -> list[T]:
        """Every process's `obj` (picklable), in rank order."""
        return [obj]

    def clip_grad_norm(self, params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
        """Clip the gradients to total 2-norm `max_norm` (inf: measure only); return the norm."""
        return float(torch.nn.utils.clip_grad_norm_(list(params), max_norm))
